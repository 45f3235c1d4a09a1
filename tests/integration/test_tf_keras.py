"""tf_keras (Keras 2: `tf.keras` under TF_USE_LEGACY_KERAS=1) under the automatic path.

Custom loops with tf_keras optimizers, new (`tf_keras.optimizers.Adam`) and legacy
(`tf_keras.optimizers.legacy.Adam`, an OptimizerV2), get tf_mpt's loss scaling as Keras 3's
do; tf_keras `fit` scripts get tf_keras's mixed precision policy. The loop is the unmodified
tiny-loss regression of test_auto_loss_scaling (its gradients underflow in float16 without
scaling). tf_keras must be installed (CI: `pip install --no-deps "tf_keras==2.21.*"`).
"""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.automatic import switch as _autoenable
from tf_mpt.automatic import optimizers as auto_scaling
from support.helpers import tf1
from support.helpers import child_env

tf_keras = pytest.importorskip(
    "tf_keras", reason='needs tf_keras: python -m pip install --no-deps "tf_keras==2.21.*"')

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = 1e-7  # float16's smallest subnormal is 6e-8: these gradients flush to zero unscaled
STEPS = 40
NAN_STEP = 3
# float16 vs float32 final loss of the same regression (float16 rounding of activations)
FINAL_LOSS_RTOL = 0.1
# an unscaled float16 run does not train: its last loss stays above this fraction of the first
UNTRAINED_FRACTION = 0.5
OPTIMIZERS = {"new": lambda: tf_keras.optimizers.Adam(0.01),
              "legacy": lambda: tf_keras.optimizers.legacy.Adam(0.01)}
COMPILED = [pytest.param(False, id="eager"), pytest.param(True, id="tf.function")]


def _enable(**env):
    # TF_MPT_KERAS=policy: these loops run eagerly too, in half only under tf_keras's policy
    # (under the default, rewrite, eager code runs float32: test_keras_rewrite.py)
    config = tf_mpt.Config.from_env({"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "float16",
                                     "TF_MPT_KERAS": "policy", **env})
    return _autoenable.enable(config, gpu_visible=False, native_bfloat16=False)


@pytest.fixture
def float16_scaled():
    _enable()
    yield
    _autoenable.disable()


@pytest.fixture
def float16_unscaled():
    _enable(TF_MPT_LOSS_SCALING="0")
    yield
    _autoenable.disable()


def _data():
    rng = np.random.RandomState(0)
    x = rng.randn(128, 8).astype(np.float32)
    return x, (x @ rng.randn(8, 1)).astype(np.float32)


def _loop(kind, compiled, steps=STEPS, nan_step=None):
    """tape.gradient of a tiny loss, the gradients multiplied back, apply_gradients.
    Returns (losses, model, optimizer); checks the NaN step changes nothing."""
    x, y = _data()
    tf_keras.utils.set_random_seed(1)
    model = tf_keras.Sequential([tf_keras.Input((8,)),
                                 tf_keras.layers.Dense(16, activation="relu"),
                                 tf_keras.layers.Dense(1, dtype="float32")])
    optimizer = OPTIMIZERS[kind]()

    def train_step(factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            tiny = loss * TINY * factor
        grads = tape.gradient(tiny, model.trainable_variables)
        optimizer.apply_gradients(zip([g / TINY for g in grads], model.trainable_variables))
        return loss

    if compiled:
        train_step = tf.function(train_step)
    losses = []
    for i in range(steps):
        if i == nan_step:
            before = [v.numpy() for v in model.trainable_variables + optimizer.variables()]
        losses.append(float(train_step(tf.constant(np.nan if i == nan_step else 1.0))))
        if i == nan_step:
            after = [v.numpy() for v in model.trainable_variables + optimizer.variables()]
            for b, a in zip(before, after):  # weights, slots and iterations
                np.testing.assert_array_equal(a, b)
    return losses, model, optimizer


@pytest.fixture(scope="module")
def float32_losses():
    return {kind: _loop(kind, compiled=False)[0] for kind in OPTIMIZERS}


@pytest.mark.parametrize("compiled", COMPILED)
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_tf_keras_custom_loop_trains_like_float32_with_scaling(kind, compiled, float16_scaled,
                                                               float32_losses):
    losses, model, optimizer = _loop(kind, compiled)
    assert model.layers[0].compute_dtype == "float16"  # tf_keras's policy, set by tf_mpt
    scale = auto_scaling.loss_scale_of(optimizer)
    assert isinstance(scale, tf_mpt.DynamicLossScale)
    assert float(scale.scale()) == 2.0 ** 15
    np.testing.assert_allclose(losses[-1], float32_losses[kind][-1], rtol=FINAL_LOSS_RTOL)


@pytest.mark.parametrize("compiled", COMPILED)
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_tf_keras_custom_loop_skips_a_nan_step(kind, compiled, float16_scaled):
    _, _, optimizer = _loop(kind, compiled, steps=NAN_STEP + 3, nan_step=NAN_STEP)  # checks
    scale = auto_scaling.loss_scale_of(optimizer)
    assert float(scale.scale()) == 2.0 ** 14  # halved once, at the NaN step
    assert int(scale.good_steps.numpy()) == 2
    assert int(optimizer.iterations.numpy()) == NAN_STEP + 2


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_tf_keras_custom_loop_does_not_train_in_float16_without_scaling(
        kind, float16_unscaled, float32_losses):
    losses, model, optimizer = _loop(kind, compiled=True)
    assert model.layers[0].compute_dtype == "float16"
    assert auto_scaling.loss_scale_of(optimizer) is None
    assert not losses[-1] < UNTRAINED_FRACTION * losses[0]
    assert float32_losses[kind][-1] < UNTRAINED_FRACTION * float32_losses[kind][0]


def test_tf_keras_loss_scale_optimizer_is_not_scaled_twice(float16_scaled, caplog):
    """A loop that scales by hand with tf_keras's LossScaleOptimizer keeps its one scale."""
    x, y = _data()
    model = tf_keras.Sequential([tf_keras.Input((8,)), tf_keras.layers.Dense(16),
                                 tf_keras.layers.Dense(1, dtype="float32")])
    optimizer = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.Adam(0.01))

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            scaled = optimizer.get_scaled_loss(loss)
        grads = optimizer.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    with caplog.at_level(logging.WARNING, "tf_mpt"):
        losses = [float(train_step()) for _ in range(5)]
    assert auto_scaling.loss_scale_of(optimizer) is None
    assert auto_scaling.loss_scale_of(optimizer.inner_optimizer) is None
    assert float(optimizer.loss_scale) == 2.0 ** 15  # no overflow from a doubled scale
    assert losses[-1] < losses[0]
    assert not any("reached no optimizer" in r.getMessage() for r in caplog.records)


def test_tf_keras_legacy_optimizer_in_a_tf1_graph_with_tf_gradients(float16_scaled):
    """tf.gradients + a tf_keras OptimizerV2's apply_gradients in a TF1 Session: the op it
    returns runs the step, and a NaN step changes nothing."""
    x_value, y_value = _data()
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8])
        factor = tf1.placeholder_with_default(1.0, [])
        w = tf1.get_variable("w", [8, 1], initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y_value))
        grads = tf.gradients(loss * TINY * factor, [w])
        optimizer = tf_keras.optimizers.legacy.SGD(0.1)
        train = optimizer.apply_gradients([(grads[0] / TINY, w)])
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        first = sess.run(loss, {x: x_value})
        for _ in range(STEPS):
            sess.run(train, {x: x_value})
        before = sess.run([w, optimizer.iterations])
        sess.run(train, {x: x_value, factor: np.nan})
        after = sess.run([w, optimizer.iterations])
        last = sess.run(loss, {x: x_value})
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1] == before[1] == STEPS
    assert last < UNTRAINED_FRACTION * first
    assert isinstance(auto_scaling.loss_scale_of(optimizer), tf_mpt.DynamicLossScale)


# the policy mode in-process above (float16_scaled); its zero-code runs, and the rewrite's
# without XLA (test_autoenable.py runs Keras 3's), under -m heavy
@pytest.mark.parametrize("keras_mode, jit", [
    pytest.param("rewrite", False, marks=pytest.mark.heavy), ("rewrite", True),
    pytest.param("policy", False, marks=pytest.mark.heavy),
    pytest.param("policy", True, marks=pytest.mark.heavy)])
def test_tf_keras_fit_script_under_tf_mpt_enable(keras_mode, jit):
    """rewrite (default): tf_keras stays float32, its train_function is rewritten and the
    optimizer gets tf_mpt's scale; policy: tf_keras's mixed_float16 and LossScaleOptimizer.
    With jit: compile(jit_compile=True), the steps XLA compiles."""
    script = ("import numpy as np, tensorflow as tf, tf_mpt\n"
              "m = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4),\n"
              "                         tf.keras.layers.Dense(1, dtype='float32')])\n"
              f"m.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss='mse', jit_compile={jit})\n"
              "h = m.fit(np.ones((32, 8), 'float32'), np.ones((32, 1), 'float32'), verbose=0)\n"
              "print('module', type(m).__module__.split('.')[0])\n"
              "print('policy', m.layers[0].dtype_policy.name)\n"
              "print('optimizer', type(m.optimizer).__name__)\n"
              "print('scale', type(tf_mpt.loss_scale_of(m.optimizer)).__name__)\n"
              "print('output', m.predict(np.ones((2, 8), 'float32'), verbose=0).dtype)\n"
              "print('finite', bool(np.isfinite(h.history['loss'][-1])))\n")
    env = child_env()
    env.update(TF_MPT_ENABLE="1", TF_MPT_DTYPE="float16", TF_USE_LEGACY_KERAS="1",
               TF_MPT_KERAS=keras_mode, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert said["module"] == "tf_keras"
    assert said["finite"] == "True" and said["output"] == "float32"
    if keras_mode == "policy":
        assert said["policy"] == "mixed_float16"
        assert said["optimizer"].startswith("LossScaleOptimizer")  # tf_keras's own
        assert "tf_mpt: tf_keras global dtype policy set to mixed_float16" in proc.stderr
    else:
        assert said["policy"] == "float32" and said["optimizer"] == "SGD"
        assert said["scale"] == "DynamicLossScale"  # claimed from the rewritten train step
        assert "dtype policy" not in proc.stderr
        assert "tf_mpt: Converted " in proc.stderr and " nodes to float16" in proc.stderr


@pytest.mark.parametrize("make_scale", [tf_mpt.DynamicLossScale,
                                        lambda: tf_mpt.StaticLossScale(128)],
                         ids=["dynamic", "static"])
def test_apply_scaled_gradients_with_a_tf_keras_optimizer_in_a_tf1_graph(make_scale):
    """tf_mpt.apply_scaled_gradients returns a tensor that runs the step in a TF1 Session."""
    x_value, y_value = _data()
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", [8, 1], initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x_value, w) - y_value))
        scale = make_scale()
        grads = tf.gradients(tf_mpt.scale_loss(loss, scale), [w])
        optimizer = tf_keras.optimizers.legacy.SGD(0.1)
        applied = tf_mpt.apply_scaled_gradients(optimizer, grads, [w], scale)
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        first = sess.run(loss)
        results = [sess.run(applied) for _ in range(10)]
        last, iterations = sess.run([loss, optimizer.iterations])
    assert all(results) and iterations == 10
    assert last < UNTRAINED_FRACTION * first


def test_tf_keras_optimizer_under_a_strategy_runs_unscaled_with_one_warning(
        float16_scaled, caplog):
    """Without Keras 3's all-reduce hook no step can be decided for all replicas: the
    gradients stay unscaled (the pending scale is never wired in), with one WARNING, rather
    than scaled with nothing to catch an overflow."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    x, y = _data()
    with strategy.scope():
        tf_keras.utils.set_random_seed(1)
        model = tf_keras.Sequential([tf_keras.Input((8,)),
                                     tf_keras.layers.Dense(16, activation="relu"),
                                     tf_keras.layers.Dense(1, dtype="float32")])
        optimizer = tf_keras.optimizers.Adam(0.01)

    def replica_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            tiny = loss * TINY
        grads = tape.gradient(tiny, model.trainable_variables)
        optimizer.apply_gradients(zip([g / TINY for g in grads], model.trainable_variables))
        return loss

    @tf.function
    def train_step():
        return strategy.run(replica_step)

    with caplog.at_level(logging.WARNING, "tf_mpt"):
        losses = [float(train_step()) for _ in range(STEPS)]
    said = [r.getMessage() for r in caplog.records if "tf.distribute" in r.getMessage()]
    assert len(said) == 1 and "without loss scaling" in said[0], said
    assert auto_scaling.loss_scale_of(optimizer) is None
    assert not losses[-1] < UNTRAINED_FRACTION * losses[0]  # float16 gradients underflowed
