"""The largest batch that fits a memory budget: float32 against tf_mpt (issue "memory", item 4:
"half the memory, bigger batches", measured).

    python benchmarks/largest_batch.py [--models conv transformer] [--budget-mib 256]
                                       [--dtype bfloat16] [--max-batch 4096]

The models are benchmarks/train_speed.py's TF1 training graphs (the conv net and the
Transformer block, full settings) with their batch changed. For one (model, variant, batch),
a child process builds the graph, prepares the variant (tf_mpt: `tf_mpt.rewrite_graph_def`
with the environment's target, graph timing included; its verdicts are cached, so a batch is
decided once), then resets TensorFlow's CPU allocator statistics and runs 3 training steps:
its *tensors* are the allocator's peak bytes in use over those steps (variables, optimizer
slots, activations, gradients; tf.config.experimental.get_memory_info). A batch fits where
they stay within --budget-mib. The batch is doubled from 32 until one does not fit, then the
largest that fits is found by bisection (to a multiple of 16): every figure is a run, none is
extrapolated. The CPU and whether it computes bfloat16 natively are printed first; memory does
not depend on the CPU's speed, only on what the rewrite decided (which can, through graph
timing's picks).
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STEPS = 3
START = 32
ALIGN = 16
BATCH_FIELD = {"conv": "conv_batch", "transformer": "tf_batch", "mlp": "mlp_batch"}
CHILD_FLAG = "--child"


def _child(model_name, variant, batch, dtype):
    """Prints {'tensors': peak MiB over STEPS steps} of `variant` at `batch`."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import train_speed  # pylint: disable=import-outside-toplevel
    settings = dataclasses.replace(train_speed.FULL, **{BATCH_FIELD[model_name]: batch})
    model = train_speed.BUILDERS[model_name](settings, np.random.RandomState(0))
    fetches = [train_speed.LOSS, train_speed.TRAIN, train_speed.INIT]
    graph, config = train_speed.variant_graph_and_config(
        "tf_mpt" if variant == "tf_mpt" else "fp32", model.graph, dtype, fetches, 0)
    if not train_speed._reset_allocator_peak():  # pylint: disable=protected-access
        raise SystemExit("TensorFlow's CPU allocator keeps no statistics here")
    runner = train_speed.Runner(variant, graph, model.feeds, config)
    try:
        for _ in range(STEPS):
            runner.step()
    finally:
        runner.close()
    peak = tf.config.experimental.get_memory_info(train_speed.CPU_DEVICE)["peak"]
    print(json.dumps({"tensors": peak / train_speed.MIB}))


def tensors_at(model_name, variant, batch, dtype):
    """The child's peak tensors in MiB, or None where it failed (out of memory included)."""
    command = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, model_name, variant,
               str(batch), "--dtype", dtype]
    env = {k: v for k, v in os.environ.items()  # (a cache directory of its own may be given)
           if not k.startswith("TF_MPT_") or k == "TF_MPT_CACHE_DIR"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False,
                          env=env)
    if done.returncode != 0:
        print(done.stderr[-1500:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])["tensors"]


def largest_batch(model_name, variant, budget, dtype, max_batch, log):
    """(largest batch whose peak tensors are within `budget` MiB, {batch: MiB} measured)."""
    seen = {}

    def fits(batch):
        if batch not in seen:
            seen[batch] = tensors_at(model_name, variant, batch, dtype)
            log(f"  {model_name} {variant} batch {batch}: "
                f"{'failed' if seen[batch] is None else f'{seen[batch]:.1f} MiB'}")
        return seen[batch] is not None and seen[batch] <= budget
    if not fits(START):
        return 0, seen
    low, high = START, START * 2
    while high <= max_batch and fits(high):
        low, high = high, high * 2
    if high > max_batch:
        return low, seen
    while high - low > ALIGN:  # low fits, high does not
        middle = (low + high) // 2 // ALIGN * ALIGN
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, seen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["conv", "transformer"],
                        choices=sorted(BATCH_FIELD))
    parser.add_argument("--budget-mib", type=float, default=256.0)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--max-batch", type=int, default=4096)
    parser.add_argument(CHILD_FLAG, nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]), args.dtype)
        return 0
    from tf_mpt import _cpu  # pylint: disable=import-outside-toplevel
    native = _cpu.has_native_bfloat16(_cpu.cpu_flags())
    print(f"CPU: {_cpu.cpu_model()}; native bfloat16: {'yes' if native else 'no'}; "
          f"{args.dtype}; budget {args.budget_mib:g} MiB of peak tensors over {STEPS} "
          f"training steps", flush=True)
    rows = []
    for name in args.models:
        found = {}
        for variant in ("float32", "tf_mpt"):
            found[variant] = largest_batch(name, variant, args.budget_mib, args.dtype,
                                           args.max_batch,
                                           lambda line: print(line, file=sys.stderr,
                                                              flush=True))
        rows.append((name, found))
    print("| model | float32 largest batch | its peak MiB | tf_mpt largest batch | its peak MiB "
          "| tf_mpt / float32 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, found in rows:
        cells = []
        for variant in ("float32", "tf_mpt"):
            batch, seen = found[variant]
            cells += [str(batch), f"{seen[batch]:.1f}" if batch else "-"]
        ratio = found["tf_mpt"][0] / found["float32"][0] if found["float32"][0] else 0.0
        print(f"| {name} | {' | '.join(cells)} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
