"""Where a training step's time goes, per op type: float32 against tf_mpt, from TensorFlow's
step stats (RunOptions FULL_TRACE), on one model of train_speed.py.

    python benchmarks/op_profile.py --model conv [--steps 20] [--top 15]

Per op type: the summed time of its nodes per step (all_end_rel_micros of the step stats,
averaged over `steps` traced steps after 5 untraced ones) in the float32 graph and in tf_mpt's
rewrite, and their ratio. Node times overlap when the two cores run ops in parallel, so the
totals are the work done, not the wall time. It says which kernels make a model's speed-up
(half-precision kernels slower than float32 show a ratio above 1).
"""

import argparse
import collections
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_speed  # noqa: E402  (also puts tests/ on sys.path, for grappler_oracle)

tf1 = tf.compat.v1
WARMUP_STEPS = 5


def op_times(graph, feeds, steps):
    """{op type: microseconds per step summed over its nodes}."""
    types = {op.name: op.type for op in graph.get_operations()}
    config = train_speed.session_config(0, grappler_amp=False)
    totals = collections.Counter()
    with tf1.Session(graph=graph, config=config) as sess:
        sess.run(train_speed.INIT)
        fetches = [f"{train_speed.LOSS}:0", train_speed.TRAIN]
        for _ in range(WARMUP_STEPS):
            sess.run(fetches, feeds)
        options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
        for _ in range(steps):
            metadata = tf1.RunMetadata()
            sess.run(fetches, feeds, options=options, run_metadata=metadata)
            for device in metadata.step_stats.dev_stats:
                for node in device.node_stats:
                    # Nodes Grappler's later passes made (names not in the graph): 'other'.
                    totals[types.get(node.node_name, "other")] += node.all_end_rel_micros
    return {op: us / steps for op, us in totals.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=train_speed.MODELS, default="conv")
    parser.add_argument("--steps", type=int, default=20, help="traced steps")
    parser.add_argument("--top", type=int, default=15, help="op types shown")
    args = parser.parse_args(argv)
    support = train_speed.grappler_oracle.native_bf16()
    dtype = "bfloat16" if support.native else "float16"
    model = train_speed.BUILDERS[args.model](train_speed.FULL, np.random.RandomState(0))
    mixed, report = train_speed.rewrite_with_tf_mpt(model, dtype)
    print(f"CPU: {support.cpu_model}; native bfloat16: {support.native}; tf_mpt dtype {dtype}; "
          f"{report.summary()}")
    fp32 = op_times(model.graph, model.feeds, args.steps)
    half = op_times(mixed, model.feeds, args.steps)
    print(f"\n{args.model}: summed node time per step, {args.steps} traced steps\n")
    print("| op type | fp32 us | tf_mpt us | tf_mpt / fp32 |\n|---|---:|---:|---:|")
    rows = sorted(set(fp32) | set(half), key=lambda op: -max(fp32.get(op, 0), half.get(op, 0)))
    for op in rows[:args.top]:
        a, b = fp32.get(op, 0.0), half.get(op, 0.0)
        print(f"| {op} | {a:.0f} | {b:.0f} | {b / a:.2f} |" if a else f"| {op} | 0 | {b:.0f} | |")
    total_a, total_b = sum(fp32.values()), sum(half.values())
    print(f"| all | {total_a:.0f} | {total_b:.0f} | {total_b / total_a:.2f} |")


if __name__ == "__main__":
    main()
