"""Gradient all-reduce in float32 vs float16 vs bfloat16: bytes per step and step time.

Two MultiWorkerMirroredStrategy workers on 127.0.0.1 train the same model with
tf_mpt.LossScaleOptimizer(MomentumOptimizer, allreduce_dtype=...) in a tf.function (float32
compute: the all-reduce is the only difference between the runs). Printed per model and
all-reduce dtype: the bytes each worker puts into the all-reduce per step (sum over the
gradients of elements x the dtype's size, the figure that carries to a real network), the
dtype of the collective ops in the step's graph, and the median step time (loopback: no real
network cost, so step time shows only the casting and reduction work).

Usage: python benchmarks/allreduce.py [--models mlp,conv] [--steps 30]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DTYPES = ("float32", "float16", "bfloat16")
WARMUP = 3


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- one worker ---------------------------------------------------------------------------

def _model(kind, tf):
    """(variables, loss_fn(batch) -> loss, batch) for 'mlp' or 'conv'."""
    rng = tf.random.Generator.from_seed(0)

    def weight(*shape):
        fan_in = 1
        for d in shape[:-1]:
            fan_in *= d
        return tf.Variable(rng.normal(shape) / fan_in ** 0.5)

    if kind == "mlp":  # 784-2048-2048-10, batch 256 (benchmarks/train_speed.py's MLP)
        ws = [weight(784, 2048), weight(2048, 2048), weight(2048, 10)]
        bs = [tf.Variable(tf.zeros([n])) for n in (2048, 2048, 10)]
        x = rng.normal([256, 784])

        def loss():
            h = x
            for i, (w, b) in enumerate(zip(ws, bs)):
                h = tf.matmul(h, w) + b
                if i < 2:
                    h = tf.nn.relu(h)
            return tf.reduce_mean(tf.square(h))

        return ws + bs, loss
    # conv: 3x3 convs 3-32-64-128 with stride 2, dense 2048-10, batch 64 of 32x32x3
    ks = [weight(3, 3, 3, 32), weight(3, 3, 32, 64), weight(3, 3, 64, 128)]
    dense = weight(4 * 4 * 128, 10)
    x = rng.normal([64, 32, 32, 3])

    def loss():
        h = x
        for k in ks:
            h = tf.nn.relu(tf.nn.conv2d(h, k, 2, "SAME"))
        return tf.reduce_mean(tf.square(tf.matmul(tf.reshape(h, [64, -1]), dense)))

    return ks + [dense], loss


def worker(kind, allreduce, steps):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_mpt  # pylint: disable=g-import-not-at-top
    from tf_mpt.models import inspection  # pylint: disable=g-import-not-at-top
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        variables, loss = _model(kind, tf)
        step_var = tf.compat.v1.train.get_or_create_global_step()
        opt = tf_mpt.LossScaleOptimizer(tf.compat.v1.train.MomentumOptimizer(0.01, 0.9),
                                        allreduce_dtype=allreduce)

    @tf.function
    def train():
        strategy.run(lambda: opt.minimize(loss, var_list=variables, global_step=step_var))

    for _ in range(WARMUP):
        train()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        train()
        times.append(time.perf_counter() - start)
    elements = sum(int(tf.size(v)) for v in variables)
    print(json.dumps({
        "elements": elements, "bytes": elements * tf.as_dtype(allreduce).size,
        "ms": 1000 * statistics.median(times),
        "reduce_ops": inspection.reduction_ops(
            train.get_concrete_function().graph.as_graph_def()),
        "finite_steps": int(step_var.numpy())}), flush=True)


# --- the parent -----------------------------------------------------------------------------

def run(kind, allreduce, steps):
    """The two workers' results (each a dict) for one model and all-reduce dtype."""
    workers = [f"127.0.0.1:{_free_port()}" for _ in range(2)]
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config),
                   PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", kind, allreduce,
             str(steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"worker failed:\n{err[-3000:]}")
        results.append(json.loads([l for l in out.splitlines() if l.startswith("{")][-1]))
    return results


def header():
    from tf_mpt import _cpu  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    flags = _cpu.real_cpu_flags()
    return (f"CPU: {_cpu.cpu_model()} ({os.cpu_count()} logical cores); native bfloat16: "
            f"{_cpu.has_native_bfloat16(flags)}; TensorFlow {tf.__version__}.\n"
            "2 MultiWorkerMirroredStrategy workers on 127.0.0.1 (loopback hides network "
            "cost: the bytes ratio is the figure that carries to a real network).")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,conv")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, allreduce, steps = args.worker
        worker(kind, allreduce, int(steps))
        return
    print(header())
    print("\n| model | all-reduce dtype | collective ops | bytes per step per worker | "
          "bytes vs float32 | ms/step (median, worker 0 / 1) | step time vs float32 |")
    print("|---|---|---|---:|---:|---:|---:|")
    for kind in args.models.split(","):
        base = None
        for allreduce in DTYPES:
            results = run(kind, allreduce, args.steps)
            ms = max(r["ms"] for r in results)
            if base is None:
                base = (results[0]["bytes"], ms)
            ops = ", ".join(f"{op} {dtype}" for op, dtype in results[0]["reduce_ops"])
            print(f"| {kind} | {allreduce} | {ops} | {results[0]['bytes']:,} | "
                  f"{results[0]['bytes'] / base[0]:.2f}x | {results[0]['ms']:.1f} / "
                  f"{results[1]['ms']:.1f} | {ms / base[1]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
