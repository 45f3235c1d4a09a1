"""Command line: `tf-mpt run script.py [args...]` and `python -m tf_mpt script.py [args...]`.

Both run the script as __main__ with tf_mpt enabled, as TF_MPT_ENABLE=1 would (the other
TF_MPT_* variables still apply; an explicitly set sub-switch still wins).
"""

import argparse
import os
import runpy
import sys

USAGE = "python -m tf_mpt script.py [args...]"


def _run(script, args):
    from tf_mpt import _startup  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(script):
        sys.stderr.write(f"tf_mpt: no such script: {script!r}. Usage: {USAGE}\n")
        raise SystemExit(2)
    os.environ["TF_MPT_ENABLE"] = "1"  # sub-switches set by the user still win
    _startup.install_from_env(at_startup=False)
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def run_script_main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(f"usage: {USAGE}\n")
        raise SystemExit(0 if argv else 2)
    _run(argv[0], argv[1:])


def main(argv=None):
    """Entry point of the `tf-mpt` console command."""
    parser = argparse.ArgumentParser(prog="tf-mpt", description="tf_mpt: mixed precision for "
                                     "TensorFlow graphs.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an unmodified script in mixed precision")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    if options.command == "run":
        _run(options.script, options.args)
