"""The first minute: what an unmodified script pays for tf_mpt the first time it runs on a
machine (empty cache), and the parts of it: the compiler, the probes, the rewrite.

    python benchmarks/first_run.py [--dtype bfloat16] [--rounds 2] [--scripts NAME ...]
                                   [--cpu-flags FLAGS]

`--cpu-flags` makes tf_mpt decide as a CPU with those flags (TF_MPT_CPU_FLAGS: `auto`, the
target), on this machine's kernels; with TF_ENABLE_ONEDNN_OPTS=0 in the environment too, a
run follows the path a CPU without native bfloat16 and with oneDNN off (a Skylake-SP) takes.

Each script runs in a fresh process with its own cache directory (XDG_CACHE_HOME), the
rounds interleaved, and the fastest wall time of each way counts (a neighbour only adds):

    plain       no tf_mpt
    first       TF_MPT_ENABLE=1, empty cache: compile + probes + rewrite
    second      TF_MPT_ENABLE=1 again on the cache the first run left: rewrite only
    compiler    (first, target rules) - (second, target rules): building the Grappler
                optimizer (TF1 Session scripts only; tf.function scripts need none)
    probes      (first on a cache holding the optimizer) - second: timing this CPU's kernels
                for the target `here` (none where `auto` picks `rules`: no native bfloat16)
    rules       (first, target rules) - plain: the overhead where `auto` picks the target
                `rules` (a CPU without native bfloat16, e.g. a Skylake-SP: the compiler and
                the dispatch check, no probes); with TF_ENABLE_ONEDNN_OPTS=0 in the
                environment, Eigen's kernels, as TensorFlow runs them on such a CPU

The CPU and whether it runs bfloat16 natively are printed first; absolute times are noise
from machine to machine, the differences within one run are what this measures.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, ROOT)
from tf_mpt import _cpu  # noqa: E402  (no TensorFlow import)

SCRIPTS = {
    "TF1 Session (tf1_convnet_digits)": ["examples/tf1_convnet_digits.py", "--epochs", "1"],
    "TF2 Keras fit (keras_fit_digits)": ["examples/keras_fit_digits.py", "--epochs", "1"],
    "TF1 Session MLP (tf1_mlp_digits)": ["examples/tf1_mlp_digits.py", "--epochs", "1"],
}
DEFAULT_SCRIPTS = ("tf1_convnet_digits", "keras_fit_digits")


def _short(name):
    """A SCRIPTS key's example name: 'TF1 Session (tf1_convnet_digits)' -> tf1_convnet_digits."""
    return name.split("(")[1].rstrip(")")


CPU_FLAGS = {}  # TF_MPT_CPU_FLAGS of every tf_mpt run, where --cpu-flags gives it


def _run(script, cache, env_extra):
    """Wall seconds of one run of `script` with XDG_CACHE_HOME=cache (None: no tf_mpt)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_MPT_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    if cache is not None:
        env.update(TF_MPT_ENABLE="1", XDG_CACHE_HOME=cache, **CPU_FLAGS, **env_extra)
    start = time.perf_counter()
    done = subprocess.run([sys.executable] + script, cwd=ROOT, env=env, check=False,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(script)} failed:\n{done.stderr[-2000:]}")
    return seconds


def _round(script, dtype):
    """{way: seconds} of one round."""
    found = {"plain": _run(script, None, {})}
    dtype_env = {"TF_MPT_DTYPE": dtype}
    rules = dict(dtype_env, TF_MPT_TARGET="rules")
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as parts:
        found["first"] = _run(script, first, dtype_env)
        found["second"] = _run(script, first, dtype_env)
        found["first, target rules"] = _run(script, parts, rules)
        found["second, target rules"] = _run(script, parts, rules)
        found["first, optimizer cached"] = _run(script, parts, dtype_env)
        shutil.rmtree(parts, ignore_errors=True)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scripts", nargs="+", default=DEFAULT_SCRIPTS,
                        choices=[_short(name) for name in SCRIPTS])
    parser.add_argument("--cpu-flags", help="decide as a CPU with these flags (quoted, "
                        "space-separated: TF_MPT_CPU_FLAGS)")
    args = parser.parse_args()
    if args.cpu_flags:
        CPU_FLAGS["TF_MPT_CPU_FLAGS"] = args.cpu_flags
    print("; ".join(_cpu.facts()[:2]) + f"; dtype {args.dtype}; fastest of {args.rounds} "
          "rounds; seconds of wall time; oneDNN "
          + {"0": "off", "1": "on"}.get(os.environ.get("TF_ENABLE_ONEDNN_OPTS", ""),
                                        "as TensorFlow decides for this CPU")
          + (f"; deciding as a CPU with flags {args.cpu_flags!r}" if args.cpu_flags else ""))
    print("| script | plain | first run | overhead | second run | compiler | probes | "
          "rewrite (second - plain) | overhead, target rules |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, script in SCRIPTS.items():
        if _short(name) not in args.scripts:
            continue
        rounds = [_round(script, args.dtype) for _ in range(args.rounds)]
        t = {way: min(r[way] for r in rounds) for way in rounds[0]}
        compiler = t["first, target rules"] - t["second, target rules"]
        probes = t["first, optimizer cached"] - t["second"]
        print(f"| {name} | {t['plain']:.1f} | {t['first']:.1f} | "
              f"+{t['first'] - t['plain']:.1f} | {t['second']:.1f} | {compiler:+.1f} | "
              f"{probes:+.1f} | {t['second'] - t['plain']:+.1f} | "
              f"+{t['first, target rules'] - t['plain']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
