"""Keras under the automatic path, the two ways: TF_MPT_KERAS=policy (the mixed_* Keras dtype
policy: layers compute and return half tensors) vs TF_MPT_KERAS=rewrite (Keras stays float32,
tf_mpt rewrites the graphs Keras traces), against float32.

    python benchmarks/keras_modes.py [--repeats 3] [--quick]

1. Crash classes and numbers: the TF2 patterns of tests/support/tf2_patterns_worker.py (eager
   and tf.function custom loops, a plain-ops loss, a tf_keras loop adding its float32
   regularization loss, Keras 3 fit, a GAN, MirroredStrategy), float16 and bfloat16: which
   raise, the final loss vs float32's, how many matrix products ran in half (run metadata).
2. Speed and Casts: Keras 3 `fit` of a small CIFAR-sized convnet and of an MLP (random
   data, batch 64), bfloat16: median ms/step (one subprocess per way, alternating, --repeats
   times), and the Casts in the graphs TensorFlow ran for one training step.
3. Eager code: what per-op autocast (PyTorch's way) would cost on this CPU: an eager float32
   MatMul vs Cast-Cast-bfloat16 MatMul-Cast, by size.

The CPU and whether it computes bfloat16 natively are printed first; absolute times are this
machine's, the ratios are the point. --quick runs one pattern and one short fit per way
(a smoke run: structure, no timing claims).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, ROOT)
from tf_mpt import _cpu  # noqa: E402  (no TensorFlow import)

WORKER = os.path.join(ROOT, "tests", "support", "tf2_patterns_worker.py")
PATTERNS = ("eager_raw", "eager_keras", "function_loop", "function_mse",
            "tf_keras_regularized", "keras_fit", "gan", "mirrored")
MODES = ("policy", "rewrite")
DTYPES = ("float16", "bfloat16")
MODELS = ("convnet", "mlp")


def _env(mode=None, dtype=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_MPT_")}
    env.update(PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
               TF_CPP_MIN_LOG_LEVEL="2")
    if mode is not None:
        env.update(TF_MPT_ENABLE="1", TF_MPT_DTYPE=dtype, TF_MPT_KERAS=mode)
    return env


def _json_of(args, env):
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def patterns_table(patterns):
    base = _json_of([WORKER, "--keep-going", *patterns], _env())
    runs = {(m, d): _json_of([WORKER, "--keep-going", *patterns], _env(m, d))
            for m in MODES for d in DTYPES}
    print("| pattern | dtype | policy | rewrite |")
    print("|---|---|---|---|")
    for name in patterns:
        for dtype in DTYPES:
            cells = []
            for mode in MODES:
                got = runs[mode, dtype][name]
                if "error" in got:
                    cells.append(f"raises {got['error'][:90]}")
                    continue
                rel = abs(got["losses"][-1] / base[name]["losses"][-1] - 1)
                same = "same" if got["dtypes"] == base[name]["dtypes"] else "CHANGED"
                cells.append(f"loss {rel * 100:.2f}% off float32; dtypes {same}; "
                             f"{got['half_ops']}/{got['matrix_ops']} matrix ops half")
            print(f"| {name} | {dtype} | {cells[0]} | {cells[1]} |", flush=True)


# --- fit speed: the child process --------------------------------------------------------------

def _child(model_name, steps):
    import numpy as np  # pylint: disable=import-outside-toplevel
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
    import keras  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel
    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    if model_name == "convnet":
        x = rng.rand(64 * 8, 32, 32, 3).astype(np.float32)
        layers = [keras.Input((32, 32, 3))]
        for width in (32, 64, 128):
            layers += [keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
                       keras.layers.MaxPooling2D()]
        layers += [keras.layers.Flatten(), keras.layers.Dense(256, activation="relu"),
                   keras.layers.Dense(10)]
    else:
        x = rng.rand(64 * 8, 512).astype(np.float32)
        layers = [keras.Input((512,)), keras.layers.Dense(1024, activation="relu"),
                  keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)]
    y = rng.randint(0, 10, size=len(x)).astype(np.int32)
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.began = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.began)

    model.fit(x, y, batch_size=64, epochs=max(1, steps // 8), verbose=0, callbacks=[Timer()])
    context.enable_run_metadata()
    model.train_on_batch(x[:64], y[:64])
    metadata = context.export_run_metadata()
    casts = sum(1 for f in metadata.function_graphs for g in f.partition_graphs
                for n in g.node if n.op == "Cast")
    print(json.dumps({"ms": statistics.median(times[8:] or times) * 1e3, "casts": casts,
                      "loss": float(model.evaluate(x, y, verbose=0))}))


def speed_table(models, repeats, steps):
    ways = {"float32": _env(), "policy": _env("policy", "bfloat16"),
            "rewrite": _env("rewrite", "bfloat16")}
    print("| Keras 3 fit, bfloat16 | float32 ms/step | policy ms/step | rewrite ms/step | "
          "policy / float32 | rewrite / float32 | Casts: policy | Casts: rewrite |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        got = {way: [] for way in ways}
        for _ in range(repeats):
            for way, env in ways.items():
                got[way].append(_json_of([__file__, "--child", model, str(steps)], env))
        ms = {way: statistics.median(r["ms"] for r in runs) for way, runs in got.items()}
        print(f"| {model} | {ms['float32']:.2f} | {ms['policy']:.2f} | {ms['rewrite']:.2f} | "
              f"{ms['float32'] / ms['policy']:.2f}x | {ms['float32'] / ms['rewrite']:.2f}x | "
              f"{got['policy'][0]['casts']} | {got['rewrite'][0]['casts']} |", flush=True)


def _eager_child():
    """What per-op autocast of eager code would cost: an eager MatMul in float32 vs the same
    product as autocast runs it (Cast both inputs to bfloat16, MatMul, Cast back), median of
    interleaved timings."""
    import time  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    rows = []
    for m, k, n in ((32, 64, 64), (64, 256, 256), (64, 1024, 1024), (256, 1024, 1024),
                    (1024, 1024, 1024)):
        a = tf.constant(np.random.rand(m, k).astype(np.float32))
        b = tf.constant(np.random.rand(k, n).astype(np.float32))
        ways = {"float32": lambda: tf.matmul(a, b),
                "autocast": lambda: tf.cast(tf.matmul(tf.cast(a, tf.bfloat16),
                                                      tf.cast(b, tf.bfloat16)), tf.float32)}
        times = {w: [] for w in ways}
        reps = max(3, int(2e9 / (m * k * n * 2)))
        for _ in range(7):
            for way, run in ways.items():
                run().numpy()
                began = time.perf_counter()
                for _ in range(reps):
                    out = run()
                out.numpy()
                times[way].append((time.perf_counter() - began) / reps)
        t = {w: statistics.median(v) * 1e6 for w, v in times.items()}
        rows.append([f"[{m}x{k}]x[{k}x{n}]", t["float32"], t["autocast"]])
    print(json.dumps(rows))


def eager_table():
    rows = _json_of([__file__, "--eager-child"], _env())
    print("| eager MatMul | float32 us | bfloat16 autocast (3 Casts + MatMul) us | speed-up |")
    print("|---|---|---|---|")
    for shape, fp32, autocast in rows:
        print(f"| {shape} | {fp32:.1f} | {autocast:.1f} | {fp32 / autocast:.2f}x |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--eager-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.eager_child:
        _eager_child()
        return
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    print("; ".join(_cpu.facts()[:2]))
    if args.quick:
        patterns_table(("function_mse",))
        speed_table(("mlp",), 1, 8)
        return
    patterns_table(PATTERNS)
    if not _cpu.has_native_bfloat16(_cpu.cpu_flags()):
        print("bfloat16 speed: not measurable here (no native bfloat16 on this CPU).")
        return
    speed_table(MODELS, args.repeats, 48)
    eager_table()


if __name__ == "__main__":
    main()
