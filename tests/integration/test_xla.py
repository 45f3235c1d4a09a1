"""XLA: functions compiled with jit_compile=True take the rewrite and run it.

A tf.function's rewritten graph is rebuilt as a new tf.function with the original's
jit_compile (tf_functions._function_from_graph_def). XLA compiles the whole body of such a
function, so nothing the rebuild leaves behind may lack an XLA kernel: an argument's
Placeholder that import_graph_def's input map stood in for once did ("No registered
'Placeholder' OpKernel for XLA_CPU_JIT devices"), and every Keras 3 `fit` on a GPU machine
(jit_compile "auto" resolves to XLA there) crashed in its first step under TF_MPT_ENABLE=1.

Checked here: in-process, the HLO XLA compiles holds the half dots; zero-code, a Keras 3
`compile(jit_compile=True)` fit / evaluate / predict, a `@tf.function(jit_compile=True)`
custom loop and nested compiled functions give float32's results (a subprocess each way); a
TF1 script with a jit_scope and auto-clustering too.
"""

import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.rewrite import tf_functions
from support.helpers import child_env
from support.tolerances import FINAL_LOSS_RTOL, TOLERANCES

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TIMEOUT_S = 300
HLO_TYPE = {"float16": "f16", "bfloat16": "bf16"}
# a trained model's outputs, mixed against float32 (the suite's per-dtype tolerances, twice:
# three epochs of training lie between the two runs' weights)
OUTPUT_TOLERANCES = {dtype: {k: 2 * v for k, v in tol.items()}
                     for dtype, tol in TOLERANCES.items()}

pytestmark = pytest.mark.usefixtures("no_cost_model")


def _dense_step():
    """A two-layer dense regression step (its variables, step function and batch)."""
    rng = np.random.RandomState(0)
    w1 = tf.Variable(rng.randn(32, 64).astype(np.float32) / 6)
    w2 = tf.Variable(rng.randn(64, 1).astype(np.float32) / 8)
    x = tf.constant(rng.randn(128, 32).astype(np.float32))
    y = tf.constant(rng.randn(128, 1).astype(np.float32))

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2) - y))
        for v, g in zip((w1, w2), tape.gradient(loss, [w1, w2])):
            v.assign_sub(0.05 * g)
        return loss
    return step, x, y


def _hlo_dots(hlo):
    """The element types of the dot instructions in HLO text, e.g. ['bf16', 'f32']."""
    return re.findall(r"= (\w+)\[[^\]]*\][^ ]* dot\(", hlo)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_jit_compiled_function_runs_rewritten_and_its_hlo_holds_half_dots(dtype):
    losses = {}
    for way in ("float32", "mixed"):
        step, x, y = _dense_step()
        if way == "float32":
            compiled = tf.function(step, jit_compile=True)
        else:
            compiled = tf_mpt.function(step, dtype=dtype, jit_compile=True)
        losses[way] = [float(compiled(x, y)) for _ in range(5)]
        # what XLA compiles, as tf.function's method shows it: the rewritten program
        dots = _hlo_dots(compiled.experimental_get_compiler_ir(x, y)(stage="hlo"))
        if way == "mixed":
            assert compiled.get_concrete_function(x, y).function_def.attr[
                "_XlaMustCompile"].b
            # forward: two products; backward: two more (the first layer's input gradient
            # is not needed)
            assert dots.count(HLO_TYPE[dtype]) >= 4, dots
        else:
            assert dots and set(dots) == {"f32"}, dots
    np.testing.assert_allclose(losses["mixed"], losses["float32"], rtol=FINAL_LOSS_RTOL[dtype])
    assert losses["mixed"][-1] < losses["mixed"][0]


def test_a_rewrite_xla_cannot_compile_runs_as_written_with_one_warning(monkeypatch, caplog):
    """Planted: the arguments' Placeholders left in the rebuilt body (the fault that crashed
    every Keras 3 fit on a GPU machine). The first call fails to compile before anything
    runs; it and the later calls run the float32 function, one WARNING saying why."""
    monkeypatch.setattr(tf_functions, "_without_mapped_placeholders",
                        lambda graph_def, mapped, returned: (graph_def, ()))
    step, x, y = _dense_step()
    compiled = tf_mpt.function(step, dtype="bfloat16", jit_compile=True)
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        losses = [float(compiled(x, y)) for _ in range(3)]
    warnings = [r.getMessage() for r in caplog.records
                if "could not compile its mixed-precision version" in r.getMessage()]
    assert len(warnings) == 1 and "Placeholder" in warnings[0], warnings
    step, x, y = _dense_step()
    plain = tf.function(step, jit_compile=True)
    assert losses == pytest.approx([float(plain(x, y)) for _ in range(3)], rel=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["tf.function", "xla"])
def test_a_loss_scale_grows_and_backs_off_inside_a_compiled_step(jit):
    """float16, tf_mpt's TF2 helpers in a step XLA compiles: two good steps grow the scale
    (increment_period 2), a NaN step halves it and changes no weight, then it trains on."""
    keras = pytest.importorskip("keras")
    rng = np.random.RandomState(0)
    w = tf.Variable(rng.randn(16, 1).astype(np.float32) / 4)
    x = tf.constant(rng.randn(64, 16).astype(np.float32))
    y = tf.constant(rng.randn(64, 1).astype(np.float32))
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=2.0 ** 4, increment_period=2)
    optimizer = keras.optimizers.SGD(0.05)

    def step(factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y)) * factor
            scaled = tf_mpt.scale_loss(loss, scale)
        grads = tape.gradient(scaled, [w])
        tf_mpt.apply_scaled_gradients(optimizer, grads, [w], scale)
        return loss

    compiled = tf_mpt.function(step, dtype="float16", jit_compile=jit)
    scales, weights = [], []
    for factor in (1.0, 1.0, np.nan, 1.0):
        before = w.numpy()
        compiled(tf.constant(factor, tf.float32))
        scales.append(float(scale.scale()))
        weights.append(np.array_equal(w.numpy(), before))
    assert scales == [2.0 ** 4, 2.0 ** 5, 2.0 ** 4, 2.0 ** 4], scales
    assert weights == [False, False, True, False]  # the NaN step changed nothing


def test_a_compiled_convolution_runs_in_half():
    rng = np.random.RandomState(0)
    kernel = tf.Variable(rng.randn(3, 3, 8, 16).astype(np.float32) / 8)
    images = tf.constant(rng.randn(4, 16, 16, 8).astype(np.float32))

    def features(images):
        return tf.reduce_mean(tf.nn.relu(tf.nn.conv2d(images, kernel, 1, "SAME")))

    compiled = tf_mpt.function(features, dtype="bfloat16", jit_compile=True)
    hlo = compiled.experimental_get_compiler_ir(images)(stage="hlo")
    convolutions = re.findall(r"= (\w+)\[[^\]]*\][^ ]* convolution\(", hlo)
    assert convolutions == ["bf16"], convolutions
    expected = float(tf.function(features, jit_compile=True)(images))
    assert float(compiled(images)) == pytest.approx(expected, rel=FINAL_LOSS_RTOL["bfloat16"])


def test_an_unused_argument_of_a_jit_compiled_function_is_no_obstacle():
    w = tf.Variable(tf.ones([8, 8]))

    def f(x, unused):
        return tf.reduce_sum(tf.matmul(x, w))

    compiled = tf_mpt.function(f, dtype="bfloat16", jit_compile=True)
    x = tf.ones([4, 8])
    assert float(compiled(x, tf.constant(3.0))) == float(tf.function(f)(x, tf.constant(3.0)))


# An unmodified script: a Keras 3 model compiled with jit_compile=True (what "auto" is on a
# GPU machine) trained with fit, and a custom loop whose step is @tf.function(jit_compile=True).
_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
import keras

rng = np.random.RandomState(0)
x = rng.randn(512, 32).astype(np.float32)
y = (x[:, :1] * 0.5 - x[:, 1:2] > 0).astype(np.float32)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy",
              jit_compile=True)
history = model.fit(x, y, batch_size=64, epochs=3, verbose=0, shuffle=False)

w1 = tf.Variable(rng.randn(32, 64).astype(np.float32) / 6)
w2 = tf.Variable(rng.randn(64, 1).astype(np.float32) / 8)
optimizer = keras.optimizers.SGD(0.05)

@tf.function(jit_compile=True)
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(xb, w1)), w2) - yb))
    optimizer.apply_gradients(zip(tape.gradient(loss, [w1, w2]), [w1, w2]))
    return loss

losses = [float(step(x[:128], y[:128])) for _ in range(5)]

@tf.function(jit_compile=True)
def hidden(xb):  # inference, no tape: called from another compiled function
    return tf.nn.relu(tf.matmul(xb, w1))

@tf.function(jit_compile=True)
def predict(xb):
    return tf.matmul(hidden(xb), w2)

print(json.dumps({"fit": [float(v) for v in history.history["loss"]], "loop": losses,
                  "loss_dtype": step(x[:128], y[:128]).dtype.name,
                  "evaluate": float(model.evaluate(x, y, verbose=0)),
                  "predict": model.predict(x[:64], verbose=0).ravel().tolist(),
                  "nested": predict(x[:64]).numpy().ravel().tolist(),
                  "nested_dtype": predict(x[:64]).dtype.name}))
"""


def _run(env, script=_SCRIPT, module=False, directory=None):
    """The script run as a user runs it (`module`: `python -m tf_mpt script.py`, the script
    written to `directory`)."""
    full = child_env()
    full.update(env, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    if module:
        path = os.path.join(directory, "train.py")
        with open(path, "w") as f:
            f.write(script)
        command = [sys.executable, "-m", "tf_mpt", path]
    else:
        command = [sys.executable, "-c", script]
    proc = subprocess.run(command, env=full, capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("dtype, launch", [
    ("bfloat16", "env"), pytest.param("float16", "env", marks=pytest.mark.heavy),
    pytest.param("float16", "module", marks=pytest.mark.heavy)])
def test_keras_fit_and_a_custom_loop_compiled_by_xla_run_mixed_under_tf_mpt_enable(
        dtype, launch, tmp_path):
    plain, _ = _run({})
    # the cost model off: these layers are small (the rewrite under XLA is under test here)
    env = {"TF_MPT_DTYPE": dtype, "TF_MPT_TARGET": "rules"}
    if launch == "env":
        mixed, log = _run(dict(env, TF_MPT_ENABLE="1"))
    else:
        mixed, log = _run(env, module=True, directory=str(tmp_path))
    converted = re.findall(rf"tf_mpt: Converted (\d+)/\d+ nodes to {dtype}", log)
    assert len(converted) >= 2 and all(int(n) > 0 for n in converted), log[-3000:]
    assert "Placeholder" not in log and "left tf.function" not in log, log[-3000:]
    assert mixed["loss_dtype"] == plain["loss_dtype"] == "float32"
    assert mixed["nested_dtype"] == plain["nested_dtype"] == "float32"
    for key in ("fit", "loop"):
        np.testing.assert_allclose(mixed[key], plain[key], rtol=FINAL_LOSS_RTOL[dtype],
                                   err_msg=key)
        assert mixed[key][-1] < mixed[key][0], key
    np.testing.assert_allclose(mixed["evaluate"], plain["evaluate"],
                               rtol=FINAL_LOSS_RTOL[dtype])
    for key in ("predict", "nested"):  # outputs of trained weights: near float32's
        np.testing.assert_allclose(mixed[key], plain[key], **OUTPUT_TOLERANCES[dtype],
                                   err_msg=key)


# A TF1 script with XLA on both ways a TF1 user switches it on: a jit_scope around the model
# and auto-clustering (global_jit_level; on a CPU XLA clusters nothing without
# --tf_xla_cpu_global_jit).
_TF1_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
tf1 = tf.compat.v1
tf1.disable_eager_execution()
rng = np.random.RandomState(0)
x_np = rng.randn(256, 32).astype(np.float32)
y_np = (x_np[:, :1] - x_np[:, 1:2] > 0).astype(np.float32)
tf1.set_random_seed(0)
x = tf1.placeholder(tf.float32, [None, 32], name="x")
y = tf1.placeholder(tf.float32, [None, 1], name="y")
w1 = tf1.get_variable("w1", [32, 64], initializer=tf1.glorot_uniform_initializer(seed=1))
w2 = tf1.get_variable("w2", [64, 1], initializer=tf1.glorot_uniform_initializer(seed=2))
with tf.xla.experimental.jit_scope():
    hidden = tf.nn.relu(tf.matmul(x, w1))
logits = tf.matmul(hidden, w2)
loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss)
config = tf1.ConfigProto()
config.graph_options.optimizer_options.global_jit_level = tf1.OptimizerOptions.ON_1
with tf1.Session(config=config) as sess:
    sess.run(tf1.global_variables_initializer())
    losses = [float(sess.run([loss, train], {x: x_np, y: y_np})[0]) for _ in range(20)]
print(json.dumps({"losses": losses}))
"""


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.heavy)])
def test_a_tf1_script_with_a_jit_scope_and_auto_clustering_runs_mixed(dtype):
    xla = {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"}
    plain, _ = _run(xla, _TF1_SCRIPT)
    mixed, log = _run(dict(xla, TF_MPT_ENABLE="1", TF_MPT_DTYPE=dtype, TF_MPT_TARGET="rules"),
                      _TF1_SCRIPT)
    assert re.search(rf"tf_mpt: Converted [1-9]\d*/\d+ nodes to {dtype}", log), log[-3000:]
    np.testing.assert_allclose(mixed["losses"], plain["losses"], rtol=FINAL_LOSS_RTOL[dtype])
    assert mixed["losses"][-1] < mixed["losses"][0] / 2
