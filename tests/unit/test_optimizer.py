"""LossScaleOptimizer: wraps every TF1 optimizer; skipped steps change nothing."""

import re

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from support.helpers import tf1

OPTIMIZERS = {
    "GradientDescent": lambda: tf1.train.GradientDescentOptimizer(0.1),
    "Momentum": lambda: tf1.train.MomentumOptimizer(0.1, 0.9),
    "Adam": lambda: tf1.train.AdamOptimizer(0.01),
    "RMSProp": lambda: tf1.train.RMSPropOptimizer(0.01),
    "Adagrad": lambda: tf1.train.AdagradOptimizer(0.1),
    "Adadelta": lambda: tf1.train.AdadeltaOptimizer(1.0),
    "Ftrl": lambda: tf1.train.FtrlOptimizer(0.1),
    "ProximalAdagrad": lambda: tf1.train.ProximalAdagradOptimizer(0.1),
}


def _model(make_optimizer, use_resource, loss_scale="dynamic"):
    """Dense weights and an embedding (sparse IndexedSlices gradients), loss * `factor`."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        ids = tf.constant([0, 2, 2, 1])
        factor = tf1.placeholder(tf.float32, [], name="factor")
        init = tf1.random_uniform_initializer(-1, 1, seed=1)
        w = tf1.get_variable("w", [3, 2], initializer=init, use_resource=use_resource)
        emb = tf1.get_variable("emb", [5, 2], initializer=init, use_resource=use_resource)
        y = tf.matmul(x, w) + tf.gather(emb, ids)
        loss = tf.reduce_sum(tf.square(y)) * factor
        opt = tf_mpt.LossScaleOptimizer(make_optimizer(), loss_scale)
        step = tf1.train.get_or_create_global_step()
        train = opt.minimize(loss, global_step=step)
        init_op = tf1.global_variables_initializer()
        model_vars = [v for v in tf1.global_variables() if not v.op.name.startswith("tf_mpt")]
    return graph, dict(train=train, init=init_op, vars=model_vars, opt=opt, step=step)


@pytest.mark.parametrize("use_resource", [False, True], ids=["ref", "resource"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_non_finite_steps_change_no_variable_slot_or_global_step(name, use_resource):
    graph, m = _model(OPTIMIZERS[name], use_resource)
    feeds = {"x:0": np.ones([4, 3], np.float32)}
    with tf1.Session(graph=graph) as sess:
        sess.run(m["init"])
        sess.run(m["train"], {**feeds, "factor:0": 1.0})
        for factor in (np.nan, np.inf):
            before = sess.run(m["vars"])
            sess.run(m["train"], {**feeds, "factor:0": factor})
            after = sess.run(m["vars"])
            for var, b, a in zip(m["vars"], before, after):
                np.testing.assert_array_equal(a, b, err_msg=f"{var.op.name} changed")
        assert sess.run(m["step"]) == 1
        before = sess.run(m["vars"])
        sess.run(m["train"], {**feeds, "factor:0": 1.0})
        assert sess.run(m["step"]) == 2
        changed = [not np.array_equal(b, a) for b, a in zip(before, sess.run(m["vars"]))]
        assert any(changed)
    assert len(m["vars"]) > 3 or name == "GradientDescent"  # slots are among the checked vars


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_finite_steps_match_the_unwrapped_optimizer(name):
    results = []
    for loss_scale in ("dynamic", 1024):
        graph, m = _model(OPTIMIZERS[name], False, loss_scale)
        with tf1.Session(graph=graph) as sess:
            sess.run(m["init"])
            for _ in range(3):
                sess.run(m["train"], {"x:0": np.ones([4, 3], np.float32), "factor:0": 1.0})
            results.append(sess.run(m["vars"][:2]))
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        init = tf1.random_uniform_initializer(-1, 1, seed=1)
        w = tf1.get_variable("w", [3, 2], initializer=init, use_resource=False)
        emb = tf1.get_variable("emb", [5, 2], initializer=init, use_resource=False)
        y = tf.matmul(x, w) + tf.gather(emb, tf.constant([0, 2, 2, 1]))
        train = OPTIMIZERS[name]().minimize(tf.reduce_sum(tf.square(y)))
        init_op = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init_op)
        for _ in range(3):
            sess.run(train, {x: np.ones([4, 3], np.float32)})
        plain = sess.run([w, emb])
    for result in results:
        for got, want in zip(result, plain):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gradients_are_unscaled_dense_and_sparse():
    graph, m = _model(OPTIMIZERS["GradientDescent"], False, 256)
    with graph.as_default():
        loss = graph.get_tensor_by_name("mul:0")
        grads = m["opt"].compute_gradients(loss)
        plain = tf1.train.GradientDescentOptimizer(0.1).compute_gradients(loss)
    assert isinstance(grads[1][0], tf.IndexedSlices)
    feeds = {"x:0": np.ones([4, 3], np.float32), "factor:0": 1.0}
    with tf1.Session(graph=graph) as sess:
        sess.run(m["init"])
        got = sess.run([tf.convert_to_tensor(g) for g, _ in grads], feeds)
        want = sess.run([tf.convert_to_tensor(g) for g, _ in plain], feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_small_float16_gradients_flush_to_zero_without_scaling_and_survive_with_it():
    """The seeds' underflow case: d(sum(x * w * s))/dw = x * s = 1e-4 * 1e-4 = 1e-8 in float16,
    below its smallest subnormal (6e-8), unless the upstream gradient is scaled."""
    graph = tf.Graph()
    with graph.as_default():
        with tf_mpt.mixed_precision_scope("float16") as half:
            w = tf1.get_variable("w", [16], dtype=half, initializer=tf1.ones_initializer())
        x = tf.fill([16], tf.constant(1e-4, tf.float16))
        loss = tf.reduce_sum(x * w * tf.constant(1e-4, tf.float16))
        var = tf1.trainable_variables()[0]
        (plain, _), = tf1.train.GradientDescentOptimizer(1.0).compute_gradients(loss, [var])
        opt = tf_mpt.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(1.0), 2 ** 15)
        (scaled, _), = opt.compute_gradients(loss, [var])
        init = tf1.global_variables_initializer()
    assert var.dtype.base_dtype == tf.float32 and plain.dtype == tf.float32
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        plain_value, scaled_value = sess.run([plain, scaled])
    assert np.all(plain_value == 0)
    # Scaled by 2**15 the product is 3.3e-4, a normal float16: the result keeps 3 digits.
    np.testing.assert_allclose(scaled_value, 1e-8, rtol=1e-2)


def test_wrapping_twice_is_an_error():
    opt = tf_mpt.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(ValueError, match="already a tf_mpt.LossScaleOptimizer"):
        tf_mpt.LossScaleOptimizer(opt)


def test_wrapping_a_non_tf1_optimizer_is_a_type_error():
    import keras
    with pytest.raises(TypeError, match="must be a tf.compat.v1.train.Optimizer") as error:
        tf_mpt.LossScaleOptimizer(keras.optimizers.SGD())
    # the hint names functions that exist
    hinted = re.findall(r"tf_mpt\.(\w+)", str(error.value))
    assert hinted and all(hasattr(tf_mpt, name) for name in hinted), hinted


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_bad_loss_scale_error_names_the_argument_the_user_passed(bad):
    with pytest.raises(ValueError, match=r"^loss_scale must be a positive finite number\. "
                       rf"Received: loss_scale={re.escape(repr(bad))} "):
        tf_mpt.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), bad)


def test_none_loss_scale_is_rejected():
    with pytest.raises(ValueError, match="loss_scale cannot be None"):
        tf_mpt.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), None)


def test_tf2_helper_skips_non_finite_steps_with_a_keras_optimizer():
    import keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    opt = keras.optimizers.Adam(0.01)
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=16, increment_period=2)

    @tf.function
    def step(x, factor):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x)) * factor
            scaled = tf_mpt.scale_loss(loss, scale)
        grads = tape.gradient(scaled, model.trainable_variables)
        return tf_mpt.apply_scaled_gradients(opt, grads, model.trainable_variables, scale)

    x = np.ones((2, 4), np.float32)
    history = []
    for factor in (1.0, np.inf, 1.0, 1.0):
        before = [v.numpy() for v in model.trainable_variables]
        applied = bool(step(x, tf.constant(factor)))
        moved = any(not np.array_equal(b, v.numpy())
                    for b, v in zip(before, model.trainable_variables))
        history.append((applied, moved, float(scale.current_loss_scale.numpy()),
                        int(opt.iterations.numpy())))
    assert history == [(True, True, 16.0, 1), (False, False, 8.0, 1), (True, True, 8.0, 2),
                       (True, True, 16.0, 3)]


def test_allreduce_dtype_choices_and_a_bad_value():
    inner = tf1.train.GradientDescentOptimizer(0.1)
    assert tf_mpt.LossScaleOptimizer(inner).allreduce_dtype == tf.float32  # the default
    assert tf_mpt.LossScaleOptimizer(inner, allreduce_dtype="auto").allreduce_dtype == tf.float16
    static = tf_mpt.LossScaleOptimizer(inner, 128, allreduce_dtype="auto")
    assert static.allreduce_dtype == tf.bfloat16  # no dynamic scale to catch an overflow
    assert tf_mpt.LossScaleOptimizer(
        inner, allreduce_dtype=tf.bfloat16).allreduce_dtype == tf.bfloat16
    with pytest.raises(ValueError, match=r"allreduce_dtype must be one of float32, float16, "
                                         r"bfloat16, auto\. Received: allreduce_dtype='fp8'"):
        tf_mpt.LossScaleOptimizer(inner, allreduce_dtype="fp8")


def test_allreduce_dtype_comes_from_the_environment_when_not_given(monkeypatch):
    inner = tf1.train.GradientDescentOptimizer(0.1)
    monkeypatch.setenv("TF_MPT_ALLREDUCE_DTYPE", "bfloat16")
    assert tf_mpt.LossScaleOptimizer(inner).allreduce_dtype == tf.bfloat16
    monkeypatch.setenv("TF_MPT_ALLREDUCE_DTYPE", "int8")
    with pytest.raises(ValueError, match="TF_MPT_ALLREDUCE_DTYPE must be one of"):
        tf_mpt.LossScaleOptimizer(inner)


def test_skipped_steps_show_in_tf1_summaries_and_a_run_of_them_warns_once(capfd):
    """The scale and the non-finite steps in a row are summaries `tf_mpt/current_loss_scale`
    and `tf_mpt/skipped_steps` (merge_all writes them); a run of WARN_AFTER_SKIPS skipped
    steps says once on stderr that the scale fights a real overflow."""
    from tf_mpt.training import loss_scale as _loss_scale
    graph, m = _model(OPTIMIZERS["Momentum"], True)
    feeds = {"x:0": np.ones([4, 3], np.float32)}
    with graph.as_default():
        merged = tf1.summary.merge_all()
    skips = _loss_scale.WARN_AFTER_SKIPS + 3
    with tf1.Session(graph=graph) as sess:
        sess.run(m["init"])
        capfd.readouterr()
        for _ in range(skips):
            sess.run(m["train"], {**feeds, "factor:0": np.inf})
        summary = tf1.Summary()
        summary.ParseFromString(sess.run(merged))
        values = {v.tag: v.simple_value for v in summary.value}
        assert sess.run(m["step"]) == 0  # no skipped step counts
        sess.run(m["train"], {**feeds, "factor:0": 1.0})
        after = tf1.Summary()
        after.ParseFromString(sess.run(merged))
        assert sess.run(m["step"]) == 1
    assert values == {"tf_mpt/current_loss_scale": 2.0 ** 15 / 2 ** skips,
                      "tf_mpt/skipped_steps": skips}
    assert {v.tag: v.simple_value for v in after.value}["tf_mpt/skipped_steps"] == 0
    err = capfd.readouterr().err
    assert err.count(f"tf_mpt: WARNING: {_loss_scale.WARN_AFTER_SKIPS} training steps in a "
                     "row had non-finite") == 1, err
    assert "it is fighting a real overflow" in err
