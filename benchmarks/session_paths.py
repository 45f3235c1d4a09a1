"""The automatic TF1 path, before and after it moved into the Session's own graph
optimisation: step time and peak memory of unmodified scripts.

    python benchmarks/session_paths.py [--dtype bfloat16] [--repeats 3]

Each script runs in a fresh process, alternating, `--repeats` times per way:
* float32 (no tf_mpt);
* copy: TF_MPT_ENABLE=1 TF_MPT_SESSION_REWRITE=copy (the Session runs a rewritten shadow copy
  of its graph: the automatic path before this change);
* grappler: TF_MPT_ENABLE=1 (tf_mpt's optimizer inside the Session's Grappler pass).
Reported: the median of the scripts' own median step time (ms), and the median peak RSS of
the process (MiB, from wait4). The CPU and whether it has native bfloat16 are printed first;
ratios within one run carry from machine to machine, absolute times do not.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, ROOT)
from tf_mpt import _cpu  # noqa: E402  (no TensorFlow import)

SCRIPTS = {
    "tf1_mlp_digits": ["examples/tf1_mlp_digits.py", "--epochs", "3"],
    "tf1_convnet_digits": ["examples/tf1_convnet_digits.py", "--epochs", "2"],
    "tf1_lstm_digits": ["examples/tf1_lstm_digits.py", "--epochs", "3"],
    "ResNet-20 (tf_cnn_benchmarks style)": ["benchmarks/tf1_resnet_cifar.py", "--steps", "40"],
}
WAYS = ("float32", "copy", "grappler")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("; ".join(_cpu.facts()[:2]) + f"; dtype {args.dtype}; {args.repeats} runs per way")
    print("| script | float32 ms/step | copy ms/step | grappler ms/step | copy / grappler | "
          "float32 MiB | copy MiB | grappler MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, script in SCRIPTS.items():
        times = {way: [] for way in WAYS}
        peaks = {way: [] for way in WAYS}
        for _ in range(args.repeats):
            for way in WAYS:
                step_ms, peak_mib = measure(script, way, args.dtype)
                times[way].append(step_ms)
                peaks[way].append(peak_mib)
        t = {way: statistics.median(v) for way, v in times.items()}
        m = {way: statistics.median(v) for way, v in peaks.items()}
        print(f"| {name} | {t['float32']:.2f} | {t['copy']:.2f} | {t['grappler']:.2f} | "
              f"{t['copy'] / t['grappler']:.2f}x | {m['float32']:.0f} | {m['copy']:.0f} | "
              f"{m['grappler']:.0f} |", flush=True)


def measure(script, way, dtype):
    """(median ms/step the script printed, peak RSS of its process in MiB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_MPT_")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    if way != "float32":
        env.update(TF_MPT_ENABLE="1", TF_MPT_DTYPE=dtype, TF_MPT_SESSION_REWRITE=way)
    with open(os.devnull, "w") as devnull:
        proc = subprocess.Popen([sys.executable, *script], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=devnull, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{script} ({way}) failed with status {status}; run it by hand")
    return float(re.search(r"step_ms=([0-9.]+)", out).group(1)), usage.ru_maxrss / 1024


if __name__ == "__main__":
    main()
