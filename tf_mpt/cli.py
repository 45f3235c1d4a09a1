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


def _split(text):
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _lists(options):
    from tf_mpt import config as _config  # pylint: disable=g-import-not-at-top
    lists = _config.Config.from_env(os.environ).lists_for(options.dtype)
    deny = _split(options.deny)
    return lists.edited(add={"deny": deny}) if deny else lists


def _mark_keep_fp32(graph_def, names):
    from tf_mpt._type_attrs import KEEP_FP32_ATTR  # pylint: disable=g-import-not-at-top
    by_name = {n.name: n for n in graph_def.node}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise SystemExit(f"tf-mpt: --keep-fp32 names node(s) not in the graph: "
                         f"{', '.join(missing)}")
    for name in names:
        by_name[name].attr[KEEP_FP32_ATTR].b = True


def _convert(options):
    from tf_mpt import _model_io  # pylint: disable=g-import-not-at-top
    from tf_mpt import rewrite  # pylint: disable=g-import-not-at-top
    if not options.keep_io_types:
        raise SystemExit("tf-mpt: --no-keep-io-types is not supported yet; inputs and outputs "
                         "keep their dtypes.")
    kind = _model_io.kind_of(options.src)
    _model_io.check_destination(options.dst)
    lists = _lists(options)
    if kind == "graph_def":
        graph_def = _model_io.read_graph_def(options.src)
        if _model_io.is_converted(graph_def) and not options.force:
            raise _model_io.ModelError(
                f"{options.src!r} is already converted by tf_mpt (it has -TfMpt Casts); pass "
                "--force to convert it again.")
        _mark_keep_fp32(graph_def, _split(options.keep_fp32))
        result = rewrite.rewrite_graph_def(graph_def, dtype=options.dtype, lists=lists,
                                           strict=True)

        def write(path):
            with open(path, "wb") as f:
                f.write(result.graph_def.SerializeToString())

        _model_io.write_atomically(options.dst, write)
        print(result.report.summary())
        return
    raise _model_io.ModelError(
        f"{options.src!r} is a SavedModel; converting SavedModels is not supported yet "
        "(a re-saved model does not load back). Freeze it to a GraphDef (.pb) and convert "
        "that, or use tf_mpt.rewrite_function on its signatures in Python.")


def _inspect(options):
    import collections  # pylint: disable=g-import-not-at-top
    import json  # pylint: disable=g-import-not-at-top
    from tf_mpt import _model_io  # pylint: disable=g-import-not-at-top
    from tf_mpt import rewrite  # pylint: disable=g-import-not-at-top
    kind = _model_io.kind_of(options.src)
    if kind == "graph_def":
        graphs = {"graph": (_model_io.read_graph_def(options.src), None)}
    else:
        _, signatures = _model_io.load_signatures(options.src)
        graphs = {name: (f.graph.as_graph_def(),
                         [t.op.name for t in f.outputs] + [t.op.name for t in f.inputs])
                  for name, f in signatures.items()}
    reports = {name: rewrite.rewrite_graph_def(gd, dtype=options.dtype, fetches=fetches,
                                               lists=_lists(options)).report
               for name, (gd, fetches) in graphs.items()}
    if options.json:
        print(json.dumps({name: r.to_dict() for name, r in reports.items()}, indent=1))
        return
    for name, report in reports.items():
        print(f"== {name}: {report.summary()}")
        table = collections.defaultdict(collections.Counter)
        reasons = collections.defaultdict(collections.Counter)
        for decision in report.decisions.values():
            table[decision.op][decision.colour] += 1
            if decision.colour != "allow":
                reasons[decision.op][decision.reason] += 1
        colours = ("allow", "deny", "fp32", "none")
        print(f"{'op':32} " + " ".join(f"{c:>6}" for c in colours) + "  why not half (most common)")
        for op in sorted(table, key=lambda o: (-table[o]["allow"], o)):
            why = reasons[op].most_common(1)[0][0] if reasons[op] else ""
            print(f"{op:32} " + " ".join(f"{table[op][c]:6d}" for c in colours) + f"  {why}")


def main(argv=None):
    """Entry point of the `tf-mpt` console command."""
    parser = argparse.ArgumentParser(prog="tf-mpt", description="tf_mpt: mixed precision for "
                                     "TensorFlow graphs.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run an unmodified script in mixed precision")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    convert = commands.add_parser("convert", help="convert a frozen graph or a SavedModel")
    convert.add_argument("src")
    convert.add_argument("dst")
    inspect_ = commands.add_parser("inspect", help="what a conversion would do, per op type")
    inspect_.add_argument("src")
    inspect_.add_argument("--json", action="store_true", help="the full report as JSON")
    for sub in (convert, inspect_):
        sub.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
        sub.add_argument("--deny", default="", help="comma-separated op types kept float32")
    convert.add_argument("--keep-fp32", default="", help="comma-separated node names kept float32")
    convert.add_argument("--keep-io-types", dest="keep_io_types", action="store_true",
                         default=True, help="inputs and outputs keep their dtypes (default)")
    convert.add_argument("--no-keep-io-types", dest="keep_io_types", action="store_false")
    convert.add_argument("--force", action="store_true",
                         help="convert a model tf_mpt already converted")
    options = parser.parse_args(argv)
    if options.command == "run":
        _run(options.script, options.args)
        return
    from tf_mpt import _model_io  # pylint: disable=g-import-not-at-top
    try:
        (_convert if options.command == "convert" else _inspect)(options)
    except _model_io.ModelError as error:
        sys.stderr.write(f"tf-mpt {options.command}: {error}\n")
        raise SystemExit(2) from None
