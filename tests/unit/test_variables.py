"""float32_storage_getter and mixed_precision_scope: float32 master weights, same names."""

import pytest
import tensorflow as tf

import tf_mpt
from support.helpers import tf1


@pytest.mark.parametrize("use_resource", [False, True], ids=["ref", "resource"])
def test_half_trainable_variables_are_stored_in_float32_and_read_in_half(half_dtype,
                                                                         use_resource):
    graph = tf.Graph()
    with graph.as_default():
        with tf1.variable_scope("net", custom_getter=tf_mpt.float32_storage_getter):
            w = tf1.get_variable("w", [3, 2], dtype=half_dtype, use_resource=use_resource)
            tf1.get_variable("b", [2], dtype=tf.float32, use_resource=use_resource)
            tf1.get_variable("s", [2], dtype=half_dtype, trainable=False,
                             use_resource=use_resource)
        stored = {v.op.name: v.dtype.base_dtype for v in tf1.global_variables()}
        loss = tf.reduce_sum(tf.cast(w, tf.float32))
        (grad, var), = tf1.train.GradientDescentOptimizer(0.1).compute_gradients(
            loss, [tf1.trainable_variables()[0]])
    assert w.dtype == tf.as_dtype(half_dtype)
    assert stored == {"net/w": tf.float32, "net/b": tf.float32, "net/s": tf.as_dtype(half_dtype)}
    assert var.op.name == "net/w" and grad.dtype == tf.float32


def test_mixed_precision_scope_reopens_the_current_scope_and_yields_the_dtype():
    graph = tf.Graph()
    with graph.as_default():
        with tf1.variable_scope("model"):
            with tf_mpt.mixed_precision_scope("bfloat16") as half:
                w = tf1.get_variable("w", [2, 2], dtype=half)
        names = [v.op.name for v in tf1.global_variables()]
        dtypes = [v.dtype.base_dtype for v in tf1.global_variables()]
    assert half == tf.bfloat16 and w.dtype == tf.bfloat16
    assert names == ["model/w"] and dtypes == [tf.float32]


def test_mixed_precision_scope_composes_with_an_existing_getter():
    seen = []

    def recording_getter(getter, name, *args, **kwargs):
        seen.append((name, kwargs.get("dtype")))
        return getter(name, *args, **kwargs)

    graph = tf.Graph()
    with graph.as_default():
        with tf1.variable_scope("m", custom_getter=recording_getter):
            with tf_mpt.mixed_precision_scope("float16"):
                w = tf1.get_variable("w", [2], dtype=tf.float16)
    assert w.dtype == tf.float16
    assert seen == [("m/w", tf.float32)]


def test_bad_dtype_is_rejected():
    with pytest.raises(ValueError, match="dtype must be 'float16' or 'bfloat16'"):
        with tf_mpt.mixed_precision_scope("int8"):
            pass
