"""Checkpoints: loss-scale state round-trips; float32 and mixed checkpoints interchange."""

import numpy as np
import tensorflow as tf

import tf_mpt
from tf_mpt._process import patches as _patches
from support.helpers import tf1


def _model(mixed, use_resource=False):
    """A 2-layer MLP; `mixed` stores float16 weights in float32 and scales the loss."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        factor = tf1.placeholder_with_default(1.0, [], name="factor")
        dtype = tf.float16 if mixed else tf.float32
        init = tf1.random_uniform_initializer(-1, 1, seed=3)
        with tf_mpt.mixed_precision_scope("float16") if mixed else _nothing():
            w1 = tf1.get_variable("w1", [4, 8], dtype=dtype, initializer=init,
                                  use_resource=use_resource)
            w2 = tf1.get_variable("w2", [8, 1], dtype=dtype, initializer=init,
                                  use_resource=use_resource)
        y = tf.matmul(tf.nn.relu(tf.matmul(tf.cast(x, dtype), w1)), w2)
        loss = tf.reduce_mean(tf.square(tf.cast(y, tf.float32))) * factor
        opt = tf1.train.MomentumOptimizer(0.01, 0.9)
        if mixed:
            opt = tf_mpt.LossScaleOptimizer(
                opt, tf_mpt.DynamicLossScale(initial_loss_scale=64, increment_period=2))
        train = opt.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        tf1.global_variables_initializer()
        saver = tf1.train.Saver()
    return graph, train, saver


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _values(graph, sess, prefix=""):
    with graph.as_default():
        return {v.op.name: sess.run(v) for v in tf1.global_variables()
                if v.op.name.startswith(prefix)}


FEED = {"x:0": np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)}


def test_saver_round_trips_every_loss_scale_field(tmp_path):
    graph, train, saver = _model(mixed=True)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        for factor in (1.0, np.inf, 1.0):  # scale 64 -> 32 (skip) -> good_steps 1
            sess.run(train, {**FEED, "factor:0": factor})
        saved = _values(graph, sess)
        path = saver.save(sess, str(tmp_path / "m"))
        for factor in (1.0, np.nan, np.nan):
            sess.run(train, {**FEED, "factor:0": factor})
        assert _values(graph, sess, "tf_mpt") != {k: v for k, v in saved.items()
                                                  if k.startswith("tf_mpt")}
        saver.restore(sess, path)
        restored = _values(graph, sess)
    assert {k: restored[k].item() for k in restored if k.startswith("tf_mpt")} == {
        "tf_mpt/current_loss_scale": 32.0, "tf_mpt/good_steps": 1, "tf_mpt/skipped_steps": 0}
    for name, value in saved.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)


def test_float32_checkpoint_restores_into_the_mixed_model(tmp_path):
    graph32, train32, saver32 = _model(mixed=False)
    with tf1.Session(graph=graph32) as sess:
        sess.run("init")
        sess.run(train32, FEED)
        weights = _values(graph32, sess)
        path = saver32.save(sess, str(tmp_path / "fp32"))
    graph, train, saver = _model(mixed=True)
    with tf1.Session(graph=graph) as sess:
        saver.restore(sess, path)
        restored = _values(graph, sess)
        sess.run(train, FEED)  # trains on from the restored state
    for name, value in weights.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    assert restored["tf_mpt/current_loss_scale"] == 64.0  # the initial scale
    assert restored["tf_mpt/good_steps"] == 0


def test_mixed_checkpoint_restores_into_the_float32_model(tmp_path):
    graph, train, saver = _model(mixed=True, use_resource=True)
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        sess.run(train, FEED)
        weights = _values(graph, sess)
        path = saver.save(sess, str(tmp_path / "mixed"))
    graph32, _, saver32 = _model(mixed=False, use_resource=True)
    with tf1.Session(graph=graph32) as sess:
        saver32.restore(sess, path)
        restored = _values(graph32, sess)
    assert set(restored) == {k for k in weights if not k.startswith("tf_mpt")}
    for name, value in restored.items():
        assert value.dtype == weights[name].dtype
        np.testing.assert_array_equal(value, weights[name], err_msg=name)


def test_a_checkpoint_missing_model_variables_still_fails(tmp_path):
    graph32, _, saver32 = _model(mixed=False)
    with tf1.Session(graph=graph32) as sess:
        sess.run("init")
        path = saver32.save(sess, str(tmp_path / "fp32"))
    graph = tf.Graph()
    with graph.as_default():
        tf1.get_variable("not_in_checkpoint", [2])
        tf_mpt.DynamicLossScale().variables_for_graph()
        saver = tf1.train.Saver()
    with tf1.Session(graph=graph) as sess:
        try:
            saver.restore(sess, path)
        except tf.errors.NotFoundError as error:
            assert "not_in_checkpoint" in str(error)
        else:
            raise AssertionError("restore should fail for a missing model variable")


def test_tf_train_checkpoint_of_the_optimizer_holds_the_scale_state(tmp_path):
    w = tf.Variable([1.0, 2.0])
    opt = tf_mpt.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1),
                                    tf_mpt.DynamicLossScale(initial_loss_scale=64))
    opt.minimize(lambda: tf.reduce_sum(w) * np.nan, var_list=[w])  # skipped: scale -> 32
    path = tf.train.Checkpoint(optimizer=opt, w=w).save(str(tmp_path / "ckpt"))
    fresh_scale = tf_mpt.DynamicLossScale(initial_loss_scale=64)
    fresh = tf_mpt.LossScaleOptimizer(tf1.train.GradientDescentOptimizer(0.1), fresh_scale)
    tf.train.Checkpoint(optimizer=fresh, w=tf.Variable([0.0, 0.0])).restore(path)
    assert [v.numpy().item() for v in fresh_scale.variables_for_graph()] == [32.0, 0, 1]


def test_disable_undoes_the_saver_fallback_and_the_next_loss_scale_reinstalls_it(tmp_path):
    saver_class = tf1.train.Saver
    _model(mixed=True)  # a DynamicLossScale made graph variables: the fallback is in place
    assert _patches.is_applied(saver_class, "restore")
    original = _patches.originals(saver_class)["restore"]
    tf_mpt.disable()
    assert saver_class.restore is original and not _patches.is_applied(saver_class, "restore")
    graph32, _, saver32 = _model(mixed=False)
    with tf1.Session(graph=graph32) as sess:
        sess.run("init")
        path = saver32.save(sess, str(tmp_path / "fp32"))
    graph, _, saver = _model(mixed=True)  # installs it again
    assert _patches.is_applied(saver_class, "restore")
    with tf1.Session(graph=graph) as sess:
        saver.restore(sess, path)
        assert _values(graph, sess)["tf_mpt/current_loss_scale"] == 64.0
