"""Automatic loss scaling wherever a script takes gradients (float16, the automatic path):
TF1 tf.gradients + apply_gradients, TF2 GradientTape custom loops (eager and tf.function).

The scripts are unmodified float32 scripts whose gradients underflow in float16 (the loss is
multiplied by 1e-7 and the gradients by 1e7 again, as a tiny-loss script would): they train
to float32's loss with tf_mpt's scaling and do not train without it.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.automatic import switch as _autoenable
from tf_mpt.automatic import optimizers as auto_scaling
from tf_mpt._process import state as tf_mpt_state
from tf_mpt.training import loss_scale as training_loss_scale
from support.helpers import tf1

keras = pytest.importorskip("keras")

TINY = 1e-7  # float16's smallest subnormal is 6e-8: these gradients flush to zero unscaled
STEPS = 40
# The float16 run and the float32 run both fit the same regression; their final losses
# agree to this relative tolerance (float16 rounding of activations and weights).
FINAL_LOSS_RTOL = 0.1
# An unscaled float16 run does not train: its final loss stays above this fraction of the
# starting loss.
UNTRAINED_FRACTION = 0.5


def _enable(**env):
    # TF_MPT_KERAS=policy: the Keras loops here also run eagerly, and compute in half there
    # only under the mixed policy; the default (rewrite) leaves eager code float32 and
    # unscaled (tests/integration/test_tf2_patterns.py covers it)
    config = tf_mpt.Config.from_env({"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "float16",
                                     "TF_MPT_KERAS": "policy", **env})
    return _autoenable.enable(config, gpu_visible=False, native_bfloat16=False)


@pytest.fixture
def float16_scaled():
    settings = _enable()
    assert settings.loss_scaling
    yield settings
    _autoenable.disable()


@pytest.fixture
def float16_unscaled():
    settings = _enable(TF_MPT_LOSS_SCALING="0")
    assert not settings.loss_scaling
    yield settings
    _autoenable.disable()


def _data():
    rng = np.random.RandomState(0)
    x = rng.randn(128, 8).astype(np.float32)
    y = (x @ rng.randn(8, 1)).astype(np.float32)
    return x, y


# --- TF1: tf.gradients, clipping, apply_gradients ---------------------------------------------

def _tf1_script(steps=STEPS, nan_step=None):
    """A TF1 script in the PTB / clipping style: tf.gradients, clip_by_global_norm,
    apply_gradients. Returns (first loss, last loss, clipped norms, skipped state)."""
    x_value, y_value = _data()
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8])
        y = tf1.placeholder(tf.float32, [None, 1])
        factor = tf1.placeholder_with_default(1.0, [])
        w1 = tf1.get_variable("w1", [8, 16], initializer=tf1.glorot_uniform_initializer(seed=1))
        w2 = tf1.get_variable("w2", [16, 1], initializer=tf1.glorot_uniform_initializer(seed=2))
        prediction = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
        loss = tf.reduce_mean(tf.square(prediction - y))
        tvars = tf1.trainable_variables()
        grads = tf.gradients(loss * TINY * factor, tvars)
        clipped, norm = tf.clip_by_global_norm([g / TINY for g in grads], 1e3)
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.MomentumOptimizer(0.02, 0.9).apply_gradients(
            zip(clipped, tvars), global_step=step)
        init = tf1.global_variables_initializer()
        scale_vars = [v for v in tf1.global_variables() if v.op.name.startswith("tf_mpt/")]
    losses, norms = [], []
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        for i in range(steps):
            feed = {x: x_value, y: y_value}
            if i == nan_step:
                feed[factor] = np.nan
                before = sess.run(tvars + [step])
            value, n, _ = sess.run([loss, norm, train], feed)
            if i == nan_step:
                after = sess.run(tvars + [step])
                for b, a in zip(before, after):
                    np.testing.assert_array_equal(a, b)
            losses.append(value)
            norms.append(n)
        state = {v.op.name: sess.run(v) for v in scale_vars}
    return losses, norms, state


@pytest.fixture(scope="module")
def tf1_float32():
    return _tf1_script()


def test_tf1_tf_gradients_script_trains_like_float32_with_scaling(float16_scaled, tf1_float32):
    losses, norms, state = _tf1_script()
    assert state["tf_mpt/current_loss_scale"] == 2.0 ** 15
    assert state["tf_mpt/good_steps"] == STEPS and state["tf_mpt/skipped_steps"] == 0
    np.testing.assert_allclose(losses[-1], tf1_float32[0][-1], rtol=FINAL_LOSS_RTOL)
    # clipping between tf.gradients and apply_gradients saw the unscaled norm
    np.testing.assert_allclose(norms[0], tf1_float32[1][0], rtol=FINAL_LOSS_RTOL)


def test_tf1_tf_gradients_script_does_not_train_in_float16_without_scaling(
        float16_unscaled, tf1_float32):
    losses, _, state = _tf1_script()
    assert state == {}  # nothing claims scaling
    assert not losses[-1] < UNTRAINED_FRACTION * losses[0]
    assert tf1_float32[0][-1] < UNTRAINED_FRACTION * tf1_float32[0][0]


def test_tf1_non_finite_step_changes_nothing_and_halves_the_scale(float16_scaled):
    _, _, state = _tf1_script(steps=3, nan_step=1)  # the script checks nothing changed
    assert state["tf_mpt/current_loss_scale"] == 2.0 ** 14
    assert state["tf_mpt/good_steps"] == 1 and state["tf_mpt/skipped_steps"] == 0


def test_tf1_gradients_that_reach_no_optimizer_are_unscaled_with_one_warning(
        float16_scaled, caplog):
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
        loss = tf.reduce_sum(w * w)
        grads = tf.gradients(loss, [w])
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess, caplog.at_level(logging.WARNING, "tf_mpt"):
        sess.run(init)
        value = sess.run(grads)
        sess.run(grads)
    np.testing.assert_array_equal(value[0], [2.0, 2.0])
    said = [r.getMessage() for r in caplog.records if "reached no optimizer" in r.getMessage()]
    assert len(said) == 1 and "tf.gradients at" in said[0] and __file__ in said[0]


def test_tf1_gradient_of_a_gradient_is_unscaled_with_a_warning(float16_scaled, caplog):
    graph = tf.Graph()
    with graph.as_default(), caplog.at_level(logging.WARNING, "tf_mpt"):
        w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
        loss = tf.reduce_sum(w ** 3)
        first = tf.gradients(loss, [w])[0]
        second = tf.gradients(tf.reduce_sum(first), [w])[0]
        tf1.train.GradientDescentOptimizer(0.1).apply_gradients([(second, w)])
    assert any("a gradient of a gradient" in r.getMessage() for r in caplog.records)
    with tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        np.testing.assert_allclose(sess.run(second), [6.0, 6.0], rtol=1e-2)


def test_tf1_tf_gradients_applied_by_an_explicit_loss_scale_optimizer_use_its_scale(
        float16_scaled, caplog):
    graph = tf.Graph()
    with graph.as_default(), caplog.at_level(logging.WARNING, "tf_mpt"):
        w = tf1.get_variable("w", [2], initializer=tf1.ones_initializer())
        grads = tf.gradients(tf.reduce_sum(w * w), [w])
        scale = tf_mpt.DynamicLossScale(initial_loss_scale=64)
        optimizer = tf_mpt.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), scale)
        train = optimizer.apply_gradients(zip(grads, [w]))
        pending = graph.get_operation_by_name("tf_mpt_loss_scale/pending")
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            seen_scale = sess.run(pending.outputs[0])
            sess.run(train)
            value = sess.run(w)
    assert seen_scale == 64.0  # the backward pass ran from the optimizer's scale
    np.testing.assert_allclose(value, [0.8, 0.8], rtol=1e-6)
    assert not any("reached no optimizer" in r.getMessage() for r in caplog.records)


# --- TF2: GradientTape custom loops --------------------------------------------------------

def _model(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(1, dtype="float32")])


def _tf2_loop(compiled, steps=STEPS, nan_step=None, clip=None, bare_apply=False):
    """An unmodified TF2 custom loop: tape.gradient, optional clipping, apply_gradients (or,
    with `bare_apply`, Keras 3's `optimizer.apply(grads)` on a built optimizer).
    Returns (losses, norms, model, optimizer)."""
    x, y = _data()
    model = _model()
    optimizer = keras.optimizers.Adam(0.01)
    if bare_apply:
        optimizer.build(model.trainable_variables)

    def train_step(x, y, factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            tiny = loss * TINY * factor
        grads = tape.gradient(tiny, model.trainable_variables)
        grads = [g / TINY for g in grads]
        norm = tf.linalg.global_norm(grads)
        if clip is not None:
            grads, _ = tf.clip_by_global_norm(grads, clip)
        if bare_apply:
            optimizer.apply(grads)
        else:
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, norm

    train_step = _compile(train_step, compiled)
    losses, norms = [], []
    for i in range(steps):
        factor = tf.constant(np.nan if i == nan_step else 1.0, tf.float32)
        if i == nan_step:
            before = [v.numpy() for v in model.trainable_variables + optimizer.variables]
        loss, norm = train_step(x, y, factor)
        if i == nan_step:
            after = [v.numpy() for v in model.trainable_variables + optimizer.variables]
            for b, a in zip(before, after):  # weights, slots and iterations
                np.testing.assert_array_equal(a, b)
        losses.append(float(loss))
        norms.append(float(norm))
    return losses, norms, model, optimizer


@pytest.fixture(scope="module")
def tf2_float32():
    losses, norms, _, _ = _tf2_loop(compiled=False)
    return losses, norms


# eager, a tf.function, and one XLA compiles (what Keras 3 and TF's XLA guide give a GPU user)
COMPILED = [pytest.param(False, id="eager"), pytest.param(True, id="tf.function"),
            pytest.param("xla", id="xla")]
# Each test runs compiled by XLA in the default run and, in turn, eager or in a tf.function
# (every test runs all three under -m heavy): each way stays in the default run, in half of
# the tests, within its minutes on the slowest CPU.
COMPILED_EAGER = [COMPILED[0], pytest.param(True, id="tf.function", marks=pytest.mark.heavy),
                  COMPILED[2]]
COMPILED_FUNCTION = [pytest.param(False, id="eager", marks=pytest.mark.heavy), COMPILED[1],
                     COMPILED[2]]


def _compile(train_step, compiled):
    if not compiled:
        return train_step
    return tf.function(train_step, jit_compile=compiled == "xla")


def _first_scaled_step(compiled):
    """Eagerly, a new optimizer's first step runs unscaled (the optimizer is not known when
    the gradient is taken); in a tf.function the trace binds the scale before step 0 runs."""
    return 0 if compiled else 1


@pytest.mark.parametrize("compiled", COMPILED_EAGER)
def test_tf2_custom_loop_trains_like_float32_with_scaling(float16_scaled, tf2_float32,
                                                          compiled):
    losses, norms, model, optimizer = _tf2_loop(compiled)
    assert model.layers[0].compute_dtype == "float16"
    scale = tf_mpt.loss_scale_of(optimizer)  # the public name of automatic.optimizers.loss_scale_of
    assert isinstance(scale, tf_mpt.DynamicLossScale)
    assert float(scale.scale()) == 2.0 ** 15
    np.testing.assert_allclose(losses[-1], tf2_float32[0][-1], rtol=FINAL_LOSS_RTOL)
    # the script's norm (between gradient and apply) is the unscaled one
    first = _first_scaled_step(compiled)
    np.testing.assert_allclose(norms[first], tf2_float32[1][first], rtol=FINAL_LOSS_RTOL)


@pytest.mark.parametrize("compiled", COMPILED_FUNCTION)
def test_tf2_bare_optimizer_apply_is_scaled_and_skips_a_nan_step(float16_scaled, tf2_float32,
                                                                  compiled):
    """optimizer.apply(grads) without variables pairs them with the built optimizer's."""
    losses, _, _, optimizer = _tf2_loop(compiled, nan_step=2, bare_apply=True)  # loop checks
    scale = auto_scaling.loss_scale_of(optimizer)
    assert isinstance(scale, tf_mpt.DynamicLossScale)
    assert float(scale.scale()) == 2.0 ** 14  # halved once, at the NaN step
    assert int(scale.good_steps.numpy()) == STEPS - 3
    assert int(optimizer.iterations.numpy()) == STEPS - 1
    np.testing.assert_allclose(losses[-1], tf2_float32[0][-1], rtol=FINAL_LOSS_RTOL)


def _model_with_an_unused_variable():
    """(x, y, model, unused, optimizer, variables): the loss will not touch `unused`, so its
    gradient is None (a frozen head, a GAN's other network)."""
    x, y = _data()
    model = _model()
    unused = keras.Variable(np.ones((3,), np.float32), name="unused")
    return x, y, model, unused, keras.optimizers.SGD(0.01), model.trainable_variables + [unused]


@pytest.mark.parametrize("compiled", COMPILED_EAGER)
def test_tf2_none_gradients_are_skipped_as_keras_does(float16_scaled, compiled, caplog):
    """A variable the loss does not touch (a frozen head, a GAN's other network) gets a None
    gradient: the optimizer is built on every variable, as Keras builds it, and applies the
    rest (before: 'Unknown variable' at the first apply)."""
    x, y, model, unused, optimizer, variables = _model_with_an_unused_variable()

    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss, grads[-1] is None

    train_step = _compile(train_step, compiled)
    losses = [train_step() for _ in range(3)]
    assert all(bool(none) for _, none in losses)
    assert float(losses[-1][0]) < float(losses[0][0])
    np.testing.assert_array_equal(unused.numpy(), np.ones((3,), np.float32))
    assert int(optimizer.iterations.numpy()) == 3
    assert isinstance(tf_mpt.loss_scale_of(optimizer), tf_mpt.DynamicLossScale)


@pytest.mark.parametrize("compiled", COMPILED_FUNCTION)
def test_a_float16_loss_is_seeded_below_inf_when_the_scale_grows_past_float16(
        float16_scaled, compiled):
    """A Keras model under the mixed policy returns a float16 loss; cast(2**16, float16) is
    inf, so with the scale grown to 2**16 the seed stays 2**15 and no step is skipped."""
    x, y = _data()
    model = _model()
    optimizer = keras.optimizers.SGD(0.01)

    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.cast(tf.reduce_mean(tf.square(model(x) - y)), tf.float16)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    train_step = _compile(train_step, compiled)
    losses = [float(train_step())]
    scale = tf_mpt.loss_scale_of(optimizer)
    scale.current_loss_scale.assign(2.0 ** 16)
    losses += [float(train_step()) for _ in range(4)]
    assert int(scale.skipped_steps.numpy()) == 0 and int(scale.good_steps.numpy()) == 5
    assert float(scale.scale()) == 2.0 ** 16
    assert int(optimizer.iterations.numpy()) == 5 and losses[-1] < losses[0]


@pytest.mark.parametrize("compiled", COMPILED_EAGER)
def test_a_variable_whose_none_gradient_is_filtered_out_does_not_unscale_the_rest(
        float16_scaled, compiled, caplog):
    """The script drops None gradients before applying (a GAN generator with an unused
    variable): the unused variable is never claimed, and the loss keeps its optimizer's
    scale at every step (it was unscaled, 'variables of different optimizers')."""
    x, y, model, _, optimizer, variables = _model_with_an_unused_variable()

    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y)) * TINY
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients([(g / TINY, v) for g, v in zip(grads, variables)
                                   if g is not None])
        return loss / TINY

    train_step = _compile(train_step, compiled)
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        losses = [float(train_step()) for _ in range(STEPS)]
    assert "different optimizers" not in caplog.text
    assert isinstance(tf_mpt.loss_scale_of(optimizer), tf_mpt.DynamicLossScale)
    assert losses[-1] < UNTRAINED_FRACTION * losses[0]  # scaled: float16 gradients survive


def test_a_static_scale_from_the_environment_is_usable_through_loss_scale_of(tf2_float32):
    """TF_MPT_LOSS_SCALE=32768: the optimizer's scale is a StaticLossScale with the same
    interface as a dynamic one (its state is empty), and the loop trains like float32."""
    _enable(TF_MPT_LOSS_SCALE="32768")
    try:
        losses, _, _, optimizer = _tf2_loop(compiled=True)
        scale = tf_mpt.loss_scale_of(optimizer)
        assert isinstance(scale, tf_mpt.StaticLossScale) and not scale.is_dynamic
        assert float(scale.scale()) == 32768.0 and scale.variables_for_graph() == []
        np.testing.assert_allclose(losses[-1], tf2_float32[0][-1], rtol=FINAL_LOSS_RTOL)
    finally:
        _autoenable.disable()


@pytest.mark.parametrize("compiled", COMPILED_FUNCTION)
def test_tf2_custom_loop_does_not_train_in_float16_without_scaling(
        float16_unscaled, tf2_float32, compiled):
    losses, _, _, optimizer = _tf2_loop(compiled)
    assert auto_scaling.loss_scale_of(optimizer) is None
    assert not losses[-1] < UNTRAINED_FRACTION * losses[0]
    assert tf2_float32[0][-1] < UNTRAINED_FRACTION * tf2_float32[0][0]


@pytest.mark.parametrize("compiled", COMPILED_EAGER)
def test_tf2_non_finite_step_changes_no_weight_slot_or_iteration(float16_scaled, compiled):
    _, _, _, optimizer = _tf2_loop(compiled, steps=4, nan_step=2)  # the loop checks
    scale = auto_scaling.loss_scale_of(optimizer)
    assert float(scale.scale()) == 2.0 ** 14
    assert int(scale.skipped_steps.numpy()) == 0 and int(scale.good_steps.numpy()) == 1
    assert int(optimizer.iterations.numpy()) == 3


@pytest.mark.parametrize("compiled", COMPILED_FUNCTION)
def test_tf2_steps_skipped_in_a_row_warn_then_stop_the_loop(float16_scaled, compiled, capfd):
    """Every gradient NaN: the scale halves each step, one warning after WARN_AFTER_SKIPS
    steps in a row, and the step at max_consecutive_skips raises. In a step XLA compiles
    (no print or assert kernel there) the same two checks run after it, in its caller."""
    x, y = _data()
    model = _model()
    optimizer = keras.optimizers.SGD(0.01)

    def train_step(factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y)) * factor
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return loss

    train_step = _compile(train_step, compiled)
    nan = tf.constant(np.nan, tf.float32)
    steps, warned_at = 0, None
    with pytest.raises(tf.errors.InvalidArgumentError, match="training steps in a row had "
                       "non-finite"):
        while steps < 200:
            train_step(nan)
            steps += 1
            if warned_at is None and "steps in a row had non-finite" in capfd.readouterr().err:
                warned_at = steps
    scale = auto_scaling.loss_scale_of(optimizer)
    assert warned_at == training_loss_scale.WARN_AFTER_SKIPS
    assert steps == scale.max_consecutive_skips - 1  # the next step raised
    assert float(scale.scale()) == scale.min_loss_scale  # halved all the way down
    assert int(optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("compiled", COMPILED_EAGER)
def test_tf2_clipping_sees_unscaled_norms(float16_scaled, tf2_float32, compiled):
    losses, norms, _, _ = _tf2_loop(compiled, clip=1.0)
    first = _first_scaled_step(compiled)
    assert norms[first] == pytest.approx(tf2_float32[1][first], rel=FINAL_LOSS_RTOL)
    assert all(n < 1e3 for n in norms)  # never the scaled (x 32768) norm


@pytest.mark.parametrize("compiled", COMPILED_FUNCTION)
def test_tf2_gan_two_optimizers_get_their_own_scales(float16_scaled, compiled):
    generator, discriminator = _model(1), _model(2)
    g_opt, d_opt = keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3)
    x, _ = _data()

    def train_step(x, d_factor):
        with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
            fake = tf.tile(generator(x), [1, 8])
            real_score, fake_score = discriminator(x), discriminator(fake)
            d_loss = tf.reduce_mean(tf.nn.softplus(fake_score) + tf.nn.softplus(-real_score))
            g_loss = tf.reduce_mean(tf.nn.softplus(-fake_score))
            d_loss = d_loss * d_factor
        g_grads = g_tape.gradient(g_loss, generator.trainable_variables)
        d_grads = d_tape.gradient(d_loss, discriminator.trainable_variables)
        g_opt.apply_gradients(zip(g_grads, generator.trainable_variables))
        d_opt.apply_gradients(zip(d_grads, discriminator.trainable_variables))

    train_step = _compile(train_step, compiled)
    train_step(x, tf.constant(1.0))
    train_step(x, tf.constant(np.inf))  # the discriminator's step overflows, not the generator's
    g_scale, d_scale = auto_scaling.loss_scale_of(g_opt), auto_scaling.loss_scale_of(d_opt)
    assert g_scale is not d_scale
    assert float(g_scale.scale()) == 2.0 ** 15 and float(d_scale.scale()) == 2.0 ** 14
    assert int(g_opt.iterations.numpy()) == 2 and int(d_opt.iterations.numpy()) == 1


def test_tf2_tape_whose_gradients_reach_no_optimizer_warns_once_and_is_unscaled(
        float16_scaled, caplog):
    w = tf.Variable([1.0, 2.0])
    with caplog.at_level(logging.WARNING, "tf_mpt"):
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * w)
            grad = tape.gradient(loss, [w])[0]
            w.assign_sub(0.1 * grad)  # a hand-written update, no optimizer
    said = [r.getMessage() for r in caplog.records if "reached no optimizer" in r.getMessage()]
    assert len(said) == 1 and "GradientTape.gradient at" in said[0]
    np.testing.assert_allclose(w.numpy(), np.array([1.0, 2.0]) * 0.8 ** 3, rtol=1e-6)


def test_tf2_tape_in_a_tf_function_that_reaches_no_optimizer_warns_at_trace(
        float16_scaled, caplog):
    w = tf.Variable([1.0, 2.0])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * w)
        grad = tape.gradient(loss, [w])[0]  # the call the warning names
        w.assign_sub(0.1 * grad)
        return grad

    with caplog.at_level(logging.WARNING, "tf_mpt"):
        grad = step()
    said = [r.getMessage() for r in caplog.records if "reached no optimizer" in r.getMessage()]
    # the script's file:line, not the code autograph generated from it
    with open(__file__) as f:
        line = 1 + [i for i, text in enumerate(f) if "# the call the warning names" in text][0]
    assert len(said) == 1 and f"GradientTape.gradient at {__file__}:{line} " in said[0], said
    np.testing.assert_allclose(grad.numpy(), [2.0, 4.0], rtol=1e-2)


def test_tf2_persistent_tape_second_loss_is_unscaled_with_a_warning(float16_scaled, caplog):
    model = _model()
    optimizer = keras.optimizers.SGD(0.01)
    x, y = _data()
    with caplog.at_level(logging.WARNING, "tf_mpt"):
        for _ in range(2):
            with tf.GradientTape(persistent=True) as tape:
                prediction = model(x)
                loss_a = tf.reduce_mean(tf.square(prediction - y))
                loss_b = tf.reduce_mean(tf.abs(prediction - y))
            grads_a = tape.gradient(loss_a, model.trainable_variables)
            grads_b = tape.gradient(loss_b, model.trainable_variables)
            optimizer.apply_gradients(
                zip([a + b for a, b in zip(grads_a, grads_b)], model.trainable_variables))
            del tape
    assert any("second gradient from a persistent" in r.getMessage() for r in caplog.records)
    assert int(optimizer.iterations.numpy()) == 2


def test_tf2_second_order_gradients_are_unscaled_with_a_warning(float16_scaled, caplog):
    w = tf.Variable([1.0, 2.0])
    optimizer = keras.optimizers.SGD(0.1)
    with caplog.at_level(logging.WARNING, "tf_mpt"):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = tf.reduce_sum(w ** 3)
            first = inner.gradient(loss, [w])[0]
            penalty = tf.reduce_sum(first)
        second = outer.gradient(penalty, [w])[0]
        optimizer.apply_gradients([(second, w)])
    assert any("another GradientTape records" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(first.numpy(), [3.0, 12.0], rtol=1e-6)
    np.testing.assert_allclose(second.numpy(), [6.0, 12.0], rtol=1e-6)


def test_tf2_seeded_gradients_and_gradients_of_tensors_are_left_alone(float16_scaled):
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(w)
        x = w * 1.0
        loss = tf.reduce_sum(x * x)
    seeded = tape.gradient(loss, [w], output_gradients=tf.constant(3.0))[0]
    of_tensor = tape.gradient(loss, x)
    np.testing.assert_allclose(seeded.numpy(), [6.0, 12.0])
    np.testing.assert_allclose(of_tensor.numpy(), [2.0, 4.0])


def test_keras_fit_keeps_keras_loss_scaling_and_gets_no_second_scale(float16_scaled):
    x, y = _data()
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert auto_scaling.loss_scale_of(model.optimizer) is None
    assert auto_scaling.loss_scale_of(model.optimizer.inner_optimizer) is None


def test_tf2_scale_state_is_checkpointed_and_a_float32_checkpoint_restores(
        float16_scaled, tmp_path):
    x, y = _data()
    # a float32 checkpoint (no scale state) restores into the mixed run
    _autoenable.disable()
    model32 = _model()
    opt32 = keras.optimizers.Adam(0.01)
    opt32.apply_gradients(zip([tf.zeros_like(v) for v in model32.trainable_variables],
                              model32.trainable_variables))
    path32 = tf.train.Checkpoint(model=model32, optimizer=opt32).save(str(tmp_path / "f32"))
    _enable()
    _, _, model, optimizer = _tf2_loop(compiled=False, steps=3, nan_step=1)
    scale = auto_scaling.loss_scale_of(optimizer)
    assert float(scale.scale()) == 2.0 ** 14
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "mixed"))

    fresh_model, fresh_opt = _model(5), keras.optimizers.Adam(0.01)
    tf.train.Checkpoint(model=fresh_model, optimizer=fresh_opt).restore(path)
    # the scale is made at the first apply and then restored from the checkpoint
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(fresh_model(x) - y))
    grads = tape.gradient(loss, fresh_model.trainable_variables)
    fresh_opt.apply_gradients(zip(grads, fresh_model.trainable_variables))
    restored = auto_scaling.loss_scale_of(fresh_opt)
    assert float(restored.scale()) == 2.0 ** 14
    assert int(restored.good_steps.numpy()) == 2  # 1 saved + this step

    mixed_model, mixed_opt = _model(6), keras.optimizers.Adam(0.01)
    status = tf.train.Checkpoint(model=mixed_model, optimizer=mixed_opt).restore(path32)
    status.assert_existing_objects_matched()
    for a, b in zip(mixed_model.trainable_variables, model32.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tf2_custom_loop_under_a_distribution_strategy_is_scaled(float16_scaled):
    """One replica in-process; two replicas and workers: test_distribution.py."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        w = tf.Variable([1.0, 2.0])
        optimizer = keras.optimizers.SGD(0.1)

    def step(factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * w) * factor
        grads = tape.gradient(loss, [w])
        optimizer.apply_gradients(zip(grads, [w]))

    train = tf.function(lambda factor: strategy.run(step, args=(factor,)))
    train(tf.constant(1.0))
    train(tf.constant(np.nan))
    scale = auto_scaling.loss_scale_of(optimizer)
    assert float(scale.scale()) == 2.0 ** 14  # the NaN step halved it ...
    assert int(optimizer.iterations.numpy()) == 1  # ... and was skipped
    np.testing.assert_allclose(w.numpy(), [0.8, 1.6], rtol=1e-3)


@pytest.mark.parametrize("compiled", COMPILED_EAGER)
def test_a_loop_that_scales_by_hand_is_not_scaled_twice(float16_scaled, compiled):
    model = _model()
    optimizer = keras.optimizers.SGD(0.01)
    scale = tf_mpt.DynamicLossScale()
    x, y = _data()

    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            scaled = tf_mpt.scale_loss(loss, scale)
        grads = tape.gradient(scaled, model.trainable_variables)
        tf_mpt.apply_scaled_gradients(optimizer, grads, model.trainable_variables, scale)
        return grads

    train_step = _compile(train_step, compiled)
    for _ in range(3):
        with tf_mpt_state.bypass():
            with tf.GradientTape() as tape:
                plain = tf.reduce_mean(tf.square(model(x) - y))
            expected = tape.gradient(plain, model.trainable_variables)
        grads = train_step()
    assert auto_scaling.loss_scale_of(optimizer) is None
    assert int(scale.good_steps.numpy()) == 3 and int(optimizer.iterations.numpy()) == 3
    # the gradients carry the script's scale only, not tf_mpt's on top
    np.testing.assert_allclose(grads[-1].numpy() / float(scale.scale()), expected[-1].numpy(),
                               rtol=5e-2, atol=1e-3)
