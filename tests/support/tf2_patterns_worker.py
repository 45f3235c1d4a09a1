"""The TF2 patterns of a new user's script, run unmodified (tf_mpt is switched on, or not, by
the environment: TF_MPT_ENABLE=1 ...). Used by tests/integration/test_tf2_patterns.py.

    python tests/support/tf2_patterns_worker.py [--factor F] [--keep-going] [--jit DIR]
                                                PATTERN [...]

Prints one JSON line: {pattern: {"losses": [...], "dtypes": {what: dtype name},
"half_ops": n, "matrix_ops": n}} where dtypes are those of every tensor the script receives
(model outputs, losses, gradients), and half_ops / matrix_ops count the MatMul / Conv /
BatchMatMul nodes of the graphs TensorFlow executed (run metadata: partition graphs of every
function call; eager ops run no graph) whose type is half / any. --factor multiplies the
loss the gradients are taken of (an underflow probe: 1e-7) and divides the gradients back
(or, for fit, relies on Adam's invariance to the loss's scale, its epsilon scaled too).
--keep-going records a pattern that raises as {"error": "Type: message"} and runs the next.
--jit DIR: the patterns' steps XLA compiles (jit_compile=True: Keras 3's default on a machine
with a GPU; `tf.function(jit_compile=True)` in the custom loops); the environment's
XLA_FLAGS must dump to DIR (--xla_dump_to=DIR --xla_dump_hlo_as_text), and half_ops /
matrix_ops count the dot and convolution instructions of the HLO modules handed to XLA
during the pattern (DIR's *.before_optimizations.txt), half: of element type f16 / bf16.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])

import keras  # noqa: E402

from support import half_ops  # noqa: E402  (no TensorFlow of its own)

JIT = {"on": False}  # --jit: the steps XLA compiles

STEPS = 12
BATCH = 32
WIDE, WIDE_BATCH = 512, 64
MATRIX_OPS = ("MatMul", "_MklMatMul", "_FusedMatMul", "_MklFusedMatMul", "BatchMatMulV2",
              "_MklBatchMatMulV2", "Conv2D", "_MklConv2D", "_FusedConv2D", "_MklFusedConv2D",
              "_MklNativeConv2D", "_MklNativeFusedConv2D", "Conv2DBackpropInput",
              "Conv2DBackpropFilter", "_MklConv2DBackpropInput", "_MklConv2DBackpropFilter",
              "_MklNativeConv2DBackpropInput", "_MklNativeConv2DBackpropFilter")
HALF = (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum)


def _data(seed=0, features=16, classes=4, batch=BATCH):
    rng = np.random.RandomState(seed)
    x = rng.randn(batch * 4, features).astype(np.float32)
    w = rng.randn(features, classes).astype(np.float32)
    return x, np.argmax(x @ w, axis=1).astype(np.int32)


def _dtype(value):
    return tf.as_dtype(value.dtype).name


def _mlp(classes=4, features=16, width=64):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((features,)),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(classes)])


def eager_raw(factor):
    """Raw TF weights, tf.matmul, GradientTape, no tf.function (the TF2 beginner loop)."""
    x, y = _data()
    rng = np.random.RandomState(1)
    w1 = tf.Variable(rng.randn(16, 64).astype(np.float32) * 0.2)
    w2 = tf.Variable(rng.randn(64, 4).astype(np.float32) * 0.2)
    opt = keras.optimizers.SGD(0.1)
    losses, seen = [], {}
    for i in range(STEPS):
        xb, yb = x[i % 4 * BATCH:][:BATCH], y[i % 4 * BATCH:][:BATCH]
        with tf.GradientTape() as tape:
            logits = tf.matmul(tf.nn.relu(tf.matmul(xb, w1)), w2)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits))
            scaled = loss * factor
        grads = [g / factor for g in tape.gradient(scaled, [w1, w2])]
        opt.apply_gradients(zip(grads, [w1, w2]))
        losses.append(float(loss))
    seen.update(logits=_dtype(logits), loss=_dtype(loss), grad=_dtype(grads[0]))
    return losses, seen


def _custom_loop(model, loss_fn, opt, factor, compiled, extra_loss=None, features=16,
                 batch=BATCH):
    x, y = _data(features=features, batch=batch)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = loss_fn(yb, logits)
            if extra_loss is not None:
                loss = loss + extra_loss()
            scaled = loss * factor
        grads = [g / factor for g in tape.gradient(scaled, model.trainable_variables)]
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return logits, loss, grads[0]

    if compiled:
        step = tf.function(step, jit_compile=JIT["on"] or None)
    losses = []
    for i in range(STEPS):
        logits, loss, grad = step(tf.constant(x[i % 4 * batch:][:batch]),
                                  tf.constant(y[i % 4 * batch:][:batch]))
        losses.append(float(loss))
    return losses, dict(logits=_dtype(logits), loss=_dtype(loss), grad=_dtype(grad),
                        predict=_dtype(model(tf.constant(x[:4]))))


def function_mse(factor):
    """A tf.function loop whose loss is written with plain ops on the model's output:
    `tf.reduce_mean(tf.square(model(x) - y))`, y a float32 tensor."""
    x, labels = _data()
    targets = np.eye(4, dtype=np.float32)[labels]
    model, opt = _mlp(), keras.optimizers.SGD(0.1)

    @tf.function(jit_compile=JIT["on"] or None)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            out = model(xb, training=True)
            loss = tf.reduce_mean(tf.square(out - yb))
            scaled = loss * factor
        grads = [g / factor for g in tape.gradient(scaled, model.trainable_variables)]
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return out, loss

    losses = []
    for i in range(STEPS):
        out, loss = step(tf.constant(x[i % 4 * BATCH:][:BATCH]),
                         tf.constant(targets[i % 4 * BATCH:][:BATCH]))
        losses.append(float(loss))
    return losses, dict(output=_dtype(out), loss=_dtype(loss))


def eager_keras(factor):
    """A Keras model trained by a GradientTape loop, eagerly."""
    return _custom_loop(_mlp(), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        keras.optimizers.SGD(0.1), factor, compiled=False)


def function_loop(factor):
    """The same loop in tf.function (the TF2 tutorials' custom training loop)."""
    return _custom_loop(_mlp(), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        keras.optimizers.SGD(0.1), factor, compiled=True)


def function_loop_wide(factor):
    """The tf.function loop on layers wide enough that bfloat16 pays on a CPU with native
    bfloat16 ([64 x 512] x [512 x 512]: the cost model converts them by the Zen 4 table)."""
    return _custom_loop(_mlp(features=WIDE, width=WIDE),
                        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        keras.optimizers.SGD(0.02), factor, compiled=True, features=WIDE,
                        batch=WIDE_BATCH)


def tf_keras_regularized(factor):
    """tf_keras (what tf.keras is under TF_USE_LEGACY_KERAS=1) custom loop in tf.function,
    an L2 kernel regularizer whose float32 loss the script adds to the model's loss."""
    import tf_keras  # pylint: disable=import-outside-toplevel
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([
        tf_keras.Input((16,)),
        tf_keras.layers.Dense(64, activation="relu",
                              kernel_regularizer=tf_keras.regularizers.l2(1e-3)),
        tf_keras.layers.Dense(4)])
    return _custom_loop(model, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        tf_keras.optimizers.SGD(0.1), factor, compiled=True,
                        extra_loss=lambda: tf.add_n(model.losses))


def keras_fit(factor):
    """model.compile + model.fit (Keras 3), then predict and evaluate."""
    x, y = _data()
    model = _mlp()
    base = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # (epsilon scaled with the loss, so the steps are float32's at any factor)
    model.compile(optimizer=keras.optimizers.Adam(0.01, epsilon=1e-7 * factor),
                  loss=lambda yt, yp: base(yt, yp) * factor, jit_compile=JIT["on"])
    history = model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
    losses = [v / factor for v in history.history["loss"]]
    predicted = model.predict(x[:8], verbose=0)
    evaluated = model.evaluate(x, y, verbose=0, return_dict=True)["loss"] / factor
    return losses + [evaluated], dict(predict=str(predicted.dtype),
                                      output=_dtype(model(x[:4])))


def gan(factor):
    """A GradientTape GAN: two models, two optimizers, one step in tf.function."""
    keras.utils.set_random_seed(0)
    generator = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(16)])
    discriminator = keras.Sequential([keras.Input((16,)),
                                      keras.layers.Dense(32, activation="relu"),
                                      keras.layers.Dense(1)])
    g_opt, d_opt = keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3)
    xent = keras.losses.BinaryCrossentropy(from_logits=True)
    real = tf.constant(_data()[0][:BATCH])
    noise = tf.constant(np.random.RandomState(2).randn(BATCH, 8).astype(np.float32))

    @tf.function
    def step(real, noise):
        with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
            fake = generator(noise, training=True)
            real_out = discriminator(real, training=True)
            fake_out = discriminator(fake, training=True)
            g_loss = xent(tf.ones_like(fake_out), fake_out)
            d_loss = xent(tf.ones_like(real_out), real_out) + xent(tf.zeros_like(fake_out),
                                                                   fake_out)
            g_scaled, d_scaled = g_loss * factor, d_loss * factor
        g_grads = g_tape.gradient(g_scaled, generator.trainable_variables)
        d_grads = d_tape.gradient(d_scaled, discriminator.trainable_variables)
        g_opt.apply_gradients(zip([g / factor for g in g_grads], generator.trainable_variables))
        d_opt.apply_gradients(zip([g / factor for g in d_grads],
                                  discriminator.trainable_variables))
        return fake, g_loss, d_loss

    losses = []
    for _ in range(STEPS):
        fake, g_loss, d_loss = step(real, noise)
        losses.append(float(g_loss + d_loss))
    return losses, dict(fake=_dtype(fake), g_loss=_dtype(g_loss), d_loss=_dtype(d_loss))


def mirrored(factor):
    """A custom loop under MirroredStrategy on two logical CPUs (the distributed tutorial)."""
    x, y = _data()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _mlp()
        opt = keras.optimizers.SGD(0.1)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="sum")

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = loss_fn(yb, logits) / BATCH
            scaled = loss * factor
        grads = [g / factor for g in tape.gradient(scaled, model.trainable_variables)]
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(batch):
        per_replica = strategy.run(replica_step, args=batch)
        return strategy.reduce("SUM", per_replica, axis=None)

    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat())
    iterator = iter(dataset)
    losses = []
    for _ in range(STEPS):
        loss = step(next(iterator))
        losses.append(float(loss))
    return losses, dict(loss=_dtype(loss), predict=_dtype(model(x[:4])))


PATTERNS = dict(eager_raw=eager_raw, eager_keras=eager_keras, function_loop=function_loop,
                function_mse=function_mse, function_loop_wide=function_loop_wide,
                tf_keras_regularized=tf_keras_regularized, keras_fit=keras_fit, gan=gan,
                mirrored=mirrored)


def _count_matrix_ops(metadata):
    half = total = 0
    for function_graphs in metadata.function_graphs:
        for graph in function_graphs.partition_graphs:
            for node in graph.node:
                if node.op in MATRIX_OPS:
                    total += 1
                    half += node.attr["T"].type in HALF
    return half, total


def _count_hlo_contractions(directory, seen):
    """(half, all) dot and convolution instructions in the HLO modules XLA was handed that
    `directory` holds and `seen` (a set of file names, updated) does not."""
    instructions = [element for found in half_ops.hlo_contractions(directory, seen).values()
                    for element, _ in found]
    return sum(map(half_ops.is_half_hlo, instructions)), len(instructions)


def main(argv):
    factor, keep_going, dump = 1.0, False, None
    while argv[:1] in (["--factor"], ["--keep-going"], ["--jit"]):
        if argv[0] == "--factor":
            factor, argv = float(argv[1]), argv[2:]
        elif argv[0] == "--jit":
            JIT["on"], dump, argv = True, argv[1], argv[2:]
        else:
            keep_going, argv = True, argv[1:]
    seen = set(os.listdir(dump)) if dump and os.path.isdir(dump) else set()
    out = {}
    for name in argv:
        context.enable_run_metadata()
        try:
            losses, dtypes = PATTERNS[name](factor)
        except Exception as error:  # pylint: disable=broad-except
            if not keep_going:
                raise
            out[name] = dict(error=f"{type(error).__name__}: {str(error).splitlines()[0]}")
            context.disable_run_metadata()
            continue
        metadata = context.export_run_metadata()
        context.disable_run_metadata()
        half, total = _count_matrix_ops(metadata) if dump is None else \
            _count_hlo_contractions(dump, seen)
        out[name] = dict(losses=losses, dtypes=dtypes, half_ops=half, matrix_ops=total)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
