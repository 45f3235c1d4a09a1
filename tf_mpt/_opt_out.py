"""`keep_fp32`: the script's way to keep ops float32, read by the rewrite (no TensorFlow
import until used; importable without the rewrite pipeline, so the training and automatic
code that builds loss-scale ops imports only this)."""

import contextlib

KEEP_FP32_ATTR = "_tf_mpt_keep_fp32"  # node attr: the rewrite leaves this node float32


@contextlib.contextmanager
def keep_fp32(name=None):
    """Context manager: ops created inside keep float32 (attr `_tf_mpt_keep_fp32`).

    Works while building a graph (TF1 graph mode or a tf.function being traced); opens
    `tf.name_scope(name)` too when a name is given.

    Example:
        >>> with tf_mpt.keep_fp32("loss"):
        ...     loss = tf.reduce_mean(tf.square(y - y_hat))
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorflow.core.framework import attr_value_pb2  # pylint: disable=g-import-not-at-top
    graph = tf.compat.v1.get_default_graph()
    attr = {KEEP_FP32_ATTR: attr_value_pb2.AttrValue(b=True)}
    with contextlib.ExitStack() as stack:
        if name is not None:
            stack.enter_context(tf.name_scope(name))
        if not tf.executing_eagerly():
            stack.enter_context(graph._attr_scope(attr))  # pylint: disable=protected-access
        yield
