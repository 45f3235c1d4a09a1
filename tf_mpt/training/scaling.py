"""The arithmetic of loss scaling, shared by the optimizers and the automatic path:
scale a loss, unscale a gradient (in float32, IndexedSlices kept sparse), apply a Keras
optimizer's update only if every gradient is finite."""

import tensorflow as tf

__all__ = ["unscale", "scale_loss_value", "apply_if_finite"]

_HALF = (tf.float16, tf.bfloat16)


def unscale(grad, inverse):
    """grad * inverse, computed in float32 for half gradients; IndexedSlices kept sparse."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(unscale(grad.values, inverse), grad.indices, grad.dense_shape)
    if grad.dtype in _HALF:
        return tf.cast(tf.cast(grad, tf.float32) * inverse, grad.dtype)
    return grad * tf.cast(inverse, grad.dtype)


def scale_loss_value(loss, scale):
    """loss * scale, computed in float32 for a half loss."""
    if loss.dtype in _HALF:
        return tf.cast(tf.cast(loss, tf.float32) * scale, loss.dtype)
    return loss * tf.cast(scale, loss.dtype)


def apply_if_finite(optimizer, pairs, loss_scale, apply):
    """Runs `apply()` (a Keras optimizer's update of `pairs`) only if every gradient is
    finite, for a dynamic `loss_scale`, whose state is updated either way; a static scale
    always applies. The optimizer's slots are built first, outside the conditional.

    Returns a scalar bool tensor: whether the gradients were applied.
    """
    if hasattr(optimizer, "build") and not getattr(optimizer, "built", True):
        with tf.init_scope():
            optimizer.build([v for _, v in pairs])  # slots are created outside the conditional
    if not loss_scale.is_dynamic:
        apply()
        return tf.constant(True)
    update_scale, should_apply = loss_scale.update([g for g, _ in pairs])

    def apply_and_say_so():
        apply()
        return tf.constant(True)

    with tf.control_dependencies([update_scale]):
        return tf.cond(should_apply, apply_and_say_so, lambda: tf.constant(False))
