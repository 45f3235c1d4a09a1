"""`tf-mpt convert --auto-deny`: one-pass blame against bisection on models with planted
float16 faults: trials (conversions validated), seconds, and the nodes kept float32.

    python benchmarks/auto_deny.py [--models mlp24 resnet50 transformer] [--validate 4]

Models (built here, float32, then converted to float16 with the op lists, target rules):
    mlp24        a frozen 24-layer ReLU MLP whose layers 7 and 16 make values around 1e6
                 (float16's largest is 65504) and whose next layers' weights are 1e-6
                 (subnormal in float16): two stretches to keep float32
    resnet50     keras.applications.ResNet50 (weights=None, 64x64, 10 classes) exported as a
                 SavedModel, the kernel of conv3_block1_1_conv scaled by 1e5: its activations
                 overflow float16 before the batch norm brings them back
    transformer  a Keras encoder (Embedding, MultiHeadAttention with a padding mask,
                 LayerNormalization, a GELU MLP) exported as a SavedModel, validated on a
                 batch (--inputs) holding a fully padded sequence: Keras's masked softmax
                 adds (1 - mask) * -1e9, which float16 turns into -inf, and a row of -inf
                 into NaN (keras-team/keras#17571)

Each conversion runs in its own process (`tf-mpt convert ... --validate N --auto-deny`,
then with `--bisect`); the CPU is printed first. Seconds are wall time of the
search as the command reports it.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, ROOT)
from tf_mpt import _cpu  # noqa: E402  (no TensorFlow import)

MODELS = ("mlp24", "resnet50", "transformer")


def _mlp24(path):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        h = tf.compat.v1.placeholder(tf.float32, [None, 32], name="x")
        for k in range(24):
            w = rng.normal(0, np.sqrt(2 / 32), (32, 32)).astype(np.float32)
            w *= 1e6 if k in (7, 16) else 1e-6 if k in (8, 17) else 1.0
            with tf.name_scope(f"layer_{k}"):
                h = tf.nn.relu(tf.matmul(h, tf.constant(w), name="MatMul"), name="Relu")
        tf.identity(h, name="y")
    path += ".pb"
    with open(path, "wb") as f:
        f.write(graph.as_graph_def().SerializeToString())
    return path


def _resnet50(path):
    import keras  # pylint: disable=import-outside-toplevel
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    layer = model.get_layer("conv3_block1_1_conv")
    kernel, bias = layer.get_weights()
    layer.set_weights([kernel * 1e5, bias])
    model.export(path, verbose=False)
    return path


def _transformer(path):
    import keras  # pylint: disable=import-outside-toplevel
    keras.utils.set_random_seed(0)
    tokens = keras.Input((16,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(100, 64)(tokens)
    mask = keras.ops.expand_dims(keras.ops.not_equal(tokens, 0), 1)
    attended = keras.layers.MultiHeadAttention(4, 16)(x, x, attention_mask=mask)
    x = keras.layers.LayerNormalization()(x + attended)
    hidden = keras.layers.Dense(128, activation="gelu")(x)
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(64)(hidden))
    logits = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x))
    keras.Model(tokens, logits).export(path, verbose=False)
    import numpy as np  # pylint: disable=import-outside-toplevel
    rows = np.random.RandomState(0).randint(1, 100, size=(4, 16)).astype(np.int32)
    rows[1, 8:] = 0  # padding
    rows[3, :] = 0   # a sequence of padding only
    np.savez(path + "_inputs.npz", tokens=rows)
    return path


def _search(model, out, validate, bisect):
    """(trials, seconds, method, kept) of one --auto-deny run."""
    inputs = model + "_inputs.npz"
    samples = ["--inputs", inputs] if os.path.exists(inputs) else ["--validate", str(validate)]
    command = [sys.executable, "-c", "import sys; from tf_mpt import cli; cli.main(sys.argv[1:])",
               "convert", model, out, "--dtype", "float16", *samples,
               "--auto-deny"] + (["--bisect"] if bisect else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_TARGET="rules", PYTHONPATH=ROOT)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False,
                          cwd=ROOT)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return None, wall, f"failed: {done.stderr.strip().splitlines()[-1:]}", 0
    if "validation passed" in done.stdout:
        return 0, 0.0, "passed without a search", 0
    found = re.search(r"found them by ([^:]+): (\d+) trial\(s\), ([\d.]+) s", done.stdout)
    kept = int(re.search(r"--auto-deny kept (\d+) node", done.stdout).group(1))
    return int(found.group(2)), float(found.group(3)), found.group(1), kept


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--validate", type=int, default=4)
    args = parser.parse_args()
    print("; ".join(_cpu.facts()[:2]) + f"; float16, --validate {args.validate}")
    print("| model | blame: trials | seconds | kept | bisection: trials | seconds | kept |")
    print("|---|---|---|---|---|---|---|")
    builders = {"mlp24": _mlp24, "resnet50": _resnet50, "transformer": _transformer}
    with tempfile.TemporaryDirectory() as work:
        for name in args.models:
            model = builders[name](os.path.join(work, name))
            rows = []
            for bisect in (False, True):
                out = os.path.join(work, f"{name}_{'bisect' if bisect else 'blame'}")
                rows.append(_search(model, out, args.validate, bisect))
            (bt, bs, bm, bk), (it, is_, im, ik) = rows
            blame_trials = bt if bm.startswith("one-pass") else f"{bt} ({bm})"
            print(f"| {name} | {blame_trials} | {bs:.1f} | {bk} | {it} | {is_:.1f} | {ik} |",
                  flush=True)


if __name__ == "__main__":
    main()
