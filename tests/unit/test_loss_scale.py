"""Loss-scale trajectories: exact powers of two, floor, ceiling, no inf, the skip error."""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from support.helpers import tf1


def _trajectory(loss_scale, finite_pattern):
    """Runs update() once per entry (True: finite grads); returns (scale, good, skipped) after each."""
    graph = tf.Graph()
    with graph.as_default():
        value = tf1.placeholder(tf.float32, [], name="value")
        update, should_apply = loss_scale.update([tf.fill([3], value), None])
        state = loss_scale.variables_for_graph()
        init = tf1.global_variables_initializer()
    out = []
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        for finite in finite_pattern:
            _, applied = sess.run([update, should_apply], {value: 1.0 if finite else np.nan})
            assert applied == finite
            out.append(tuple(x.item() for x in sess.run(state)))
    return out


def test_dynamic_scale_grows_after_increment_period_and_halves_on_overflow():
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=8, increment_period=3, multiplier=2)
    got = _trajectory(scale, [True, True, True, True, False, True, True, True])
    assert got == [(8.0, 1, 0), (8.0, 2, 0), (16.0, 0, 0), (16.0, 1, 0), (8.0, 0, 1),
                   (8.0, 1, 0), (8.0, 2, 0), (16.0, 0, 0)]


def test_dynamic_scale_never_falls_below_the_floor():
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=4, min_loss_scale=1)
    got = [s for s, _, _ in _trajectory(scale, [False] * 4)]
    assert got == [2.0, 1.0, 1.0, 1.0]


def test_floor_below_one_is_allowed():
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=1, min_loss_scale=0.25)
    assert [s for s, _, _ in _trajectory(scale, [False] * 3)] == [0.5, 0.25, 0.25]


def test_dynamic_scale_never_grows_above_the_ceiling():
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=8, increment_period=1,
                                    max_loss_scale=16)
    assert [s for s, _, _ in _trajectory(scale, [True] * 3)] == [16.0, 16.0, 16.0]


def test_dynamic_scale_never_grows_to_inf():
    biggest = float(np.finfo(np.float32).max)
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=2.0 ** 127, increment_period=1,
                                    max_loss_scale=biggest)
    got = [s for s, _, _ in _trajectory(scale, [True] * 3)]
    assert all(np.isfinite(got)) and got[-1] == np.float32(biggest)


def test_defaults_match_the_tf1_defaults():
    scale = tf_mpt.DynamicLossScale()
    assert (scale.initial_loss_scale, scale.increment_period, scale.multiplier,
            scale.min_loss_scale, scale.max_loss_scale, scale.max_consecutive_skips) == (
        2.0 ** 15, 2000, 2.0, 1.0, 2.0 ** 24, 100)


def test_too_many_consecutive_skips_raise_a_clear_error():
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=4, max_consecutive_skips=3)
    _trajectory(scale, [False, False, True, False, False])  # a finite step resets the count
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="3 training steps in a row had non-finite"):
        _trajectory(tf_mpt.DynamicLossScale(max_consecutive_skips=3), [False] * 3)


def test_static_scale_is_constant_and_always_applies():
    scale = tf_mpt.StaticLossScale(128)
    graph = tf.Graph()
    with graph.as_default():
        update, should_apply = scale.update([tf.constant([np.nan])])
        value = scale.scale()
    with tf1.Session(graph=graph) as sess:
        assert sess.run([value, should_apply]) == [128.0, True]


@pytest.mark.parametrize("identifier, expected", [
    (None, type(None)), ("dynamic", tf_mpt.DynamicLossScale), (512, tf_mpt.StaticLossScale),
    (0.5, tf_mpt.StaticLossScale)])
def test_get_accepts_number_dynamic_instance_or_none(identifier, expected):
    assert isinstance(tf_mpt.loss_scale.get(identifier), expected)
    instance = tf_mpt.DynamicLossScale()
    assert tf_mpt.loss_scale.get(instance) is instance


@pytest.mark.parametrize("bad", [-1, 0, "static", float("inf"), True, [2]])
def test_get_rejects_bad_values_naming_them(bad):
    with pytest.raises(ValueError, match=r"^loss_scale must be .*Received: loss_scale=") as error:
        tf_mpt.loss_scale.get(bad)
    assert "value=" not in str(error.value)


def test_static_loss_scale_names_its_own_argument():
    with pytest.raises(ValueError, match=r"^value must be a positive finite number\. "
                       r"Received: value=0 "):
        tf_mpt.StaticLossScale(0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(increment_period=0), "increment_period must be a positive integer"),
    (dict(increment_period=2.5), "increment_period must be a positive integer"),
    (dict(multiplier=1.0), "multiplier must be > 1"),
    (dict(min_loss_scale=8, initial_loss_scale=4), "min_loss_scale <= initial_loss_scale"),
    (dict(max_loss_scale=float("inf")), "max_loss_scale must be a positive finite number"),
])
def test_dynamic_parameters_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tf_mpt.DynamicLossScale(**kwargs)


def test_state_variables_are_named_and_typed():
    graph = tf.Graph()
    with graph.as_default():
        first, second = tf_mpt.DynamicLossScale(), tf_mpt.DynamicLossScale()
        names = [(v.op.name, v.dtype.base_dtype) for v in first.variables_for_graph()]
        names2 = [v.op.name for v in second.variables_for_graph()]
        assert first.variables_for_graph() == first.variables_for_graph()
    assert names == [("tf_mpt/current_loss_scale", tf.float32), ("tf_mpt/good_steps", tf.int64),
                     ("tf_mpt/skipped_steps", tf.int64)]
    assert names2 == ["tf_mpt_1/current_loss_scale", "tf_mpt_1/good_steps",
                      "tf_mpt_1/skipped_steps"]


def test_eager_state_round_trips_through_tf_train_checkpoint(tmp_path):
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=16, increment_period=2)
    scale.update([tf.constant([1.0])])
    scale.update([tf.constant([np.inf])])
    saved = [v.numpy().item() for v in scale.variables_for_graph()]
    path = tf.train.Checkpoint(loss_scale=scale).save(str(tmp_path / "ckpt"))
    scale.update([tf.constant([1.0])])
    restored = tf_mpt.DynamicLossScale(initial_loss_scale=16, increment_period=2)
    tf.train.Checkpoint(loss_scale=restored).restore(path).assert_consumed()
    assert [v.numpy().item() for v in restored.variables_for_graph()] == saved == [8.0, 0, 1]


@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_tf2_skipped_steps_are_readable_and_a_run_of_them_warns_once(capfd, mode):
    from tf_mpt.training import loss_scale as _loss_scale
    scale = tf_mpt.DynamicLossScale()
    update = scale.update if mode == "eager" else tf.function(scale.update)
    capfd.readouterr()
    for _ in range(_loss_scale.WARN_AFTER_SKIPS + 1):
        update([tf.constant([1.0, np.inf])])
    assert int(scale.skipped_steps.numpy()) == _loss_scale.WARN_AFTER_SKIPS + 1
    err = capfd.readouterr().err
    assert err.count("tf_mpt: WARNING: 8 training steps in a row had non-finite") == 1, err
    update([tf.constant([1.0, 2.0])])
    assert int(scale.skipped_steps.numpy()) == 0
