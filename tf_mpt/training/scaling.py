"""The arithmetic of loss scaling, shared by the optimizers and the automatic path:
scale a loss, unscale a gradient (in float32, IndexedSlices kept sparse), apply a Keras
optimizer's update only if every gradient is finite, all-reduce gradients in a half type."""

import os

import tensorflow as tf

from tf_mpt import config as _config
from tf_mpt._opt_out import keep_fp32
from tf_mpt.training.loss_scale import all_finite as _all_finite

__all__ = ["unscale", "scale_loss_value", "apply_if_finite", "create_slots",
           "resolve_allreduce_dtype", "all_reduce_in"]

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


def apply_if_finite(loss_scale, grads, apply, make_slots=None, cond=None):
    """The one loss-scaled step, used by every optimizer path (tf_mpt.LossScaleOptimizer,
    apply_scaled_gradients, the automatic path's Keras / tf_keras / distributed applies):

        make_slots()                      # outside the conditional: built once
        if the scale is static:           return True after apply()
        finite = all gradients finite     # under a strategy: the all-reduced gradients,
                                          # the same on every replica, so all agree
        update the scale from finite      # grow after a run of good steps, halve otherwise
        if finite: apply()                # else nothing changes
        return finite (a scalar bool tensor; it runs the update and the apply)

    Args:
        loss_scale: the LossScale that scaled the gradients.
        grads: the gradients the decision is made from (None entries ignored).
        apply: makes the update (a Keras optimizer's apply, the TF1 inner optimizer's
            apply_gradients); returns what runs it in a TF1 graph.
        make_slots: makes the optimizer's slots and counters, or None.
        cond: the conditional to build (default tf.cond; the TF1 optimizer passes a v1 cond,
            which reference variables need).
    """
    if make_slots is not None:
        make_slots()
    if not loss_scale.is_dynamic:
        return _true_after(apply())
    update_scale, should_apply = loss_scale.update_from_finite(_all_finite(grads))
    with tf.control_dependencies([update_scale]):
        return (cond or tf.cond)(should_apply, lambda: _true_after(apply()),
                                 lambda: tf.constant(False))


def _true_after(result):
    """A True tensor that runs `result` (the update's tensors or ops): in a TF1 graph only
    what is fetched, or what a conditional branch's output depends on, runs."""
    ran = [t for t in tf.nest.flatten(result) if isinstance(t, (tf.Tensor, tf.Operation))]
    with tf.control_dependencies(ran):
        return tf.constant(True)


def create_slots(optimizer, variables):
    """The optimizer's slots and iteration counter, made before (outside) the conditional
    update: Keras 3 and tf_keras optimizers are built once; a tf_keras OptimizerV2 makes
    the slots it lacks."""
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras OptimizerV2
        optimizer._create_all_weights(variables)  # pylint: disable=protected-access
        return
    if not hasattr(optimizer, "build"):
        return
    built = getattr(optimizer, "built", None)
    if built is None:  # a tf_keras Optimizer says so as `_built`, once built
        built = getattr(optimizer, "_built", False)
    if not built:
        with tf.init_scope():
            optimizer.build(variables)


def resolve_allreduce_dtype(choice, loss_scale):
    """The all-reduce tf.DType for `choice` ('float32' | 'float16' | 'bfloat16' | 'auto',
    a tf.DType, or None for TF_MPT_ALLREDUCE_DTYPE) and the optimizer's LossScale."""
    if choice is None:
        choice = _config.allreduce_dtype_from_env(os.environ)
    if isinstance(choice, tf.DType):
        choice = choice.name
    text = str(choice).strip().lower()
    if text not in _config.ALLREDUCE_DTYPES:
        raise ValueError(f"allreduce_dtype must be one of {', '.join(_config.ALLREDUCE_DTYPES)}"
                         f". Received: allreduce_dtype={choice!r}")
    if text == "auto":
        text = "float16" if loss_scale.is_dynamic else "bfloat16"
    return tf.as_dtype(text)


def all_reduce_in(dtype, replica, grads_and_vars, loss_scale):
    """Replica context: the gradients summed over replicas in `dtype` (float16: the
    loss-scaled gradients, unscaled after the sum in float32; bfloat16: as they are), cast
    back to their own dtype. The collective runs unconditionally, before any branch."""
    with keep_fp32("tf_mpt_allreduce"):
        scale = loss_scale.scale() if dtype == tf.float16 else None
        inverse = None if scale is None else tf.math.reciprocal(scale)

        def to_wire(values):
            if scale is not None:
                values = tf.cast(values, tf.float32) * scale
            return tf.cast(values, dtype)

        def from_wire(values, like):
            values = tf.cast(values, tf.float32)
            if inverse is not None:
                values = values * inverse
            return tf.cast(values, like)

        present = [(i, g) for i, (g, _) in enumerate(grads_and_vars) if g is not None]
        wire = [tf.IndexedSlices(to_wire(g.values), g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices) else to_wire(g) for _, g in present]
        # batch_reduce_to in a merge_call rather than replica.all_reduce: in a TF1 graph the
        # latter's custom gradient looks up the loss scale's per-replica variable by name.
        pairs = [(w, _destination(grads_and_vars[i][1])) for (i, _), w in zip(present, wire)]
        summed = replica.merge_call(_batch_sum, args=(pairs,)) if pairs else []
        out = [g for g, _ in grads_and_vars]
        for (i, g), s in zip(present, summed):
            if isinstance(g, tf.IndexedSlices):
                if isinstance(s, tf.IndexedSlices):
                    out[i] = tf.IndexedSlices(from_wire(s.values, g.dtype), s.indices,
                                              s.dense_shape)
                else:
                    out[i] = from_wire(s, g.dtype)
            else:
                out[i] = from_wire(s, g.dtype)
    return [(g, v) for g, (_, v) in zip(out, grads_and_vars)]


def _destination(variable):
    """The tf.Variable a reduction is sent to (a Keras 3 Variable wraps one as `.value`)."""
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "value", None)
    return inner if isinstance(inner, tf.Variable) else variable


def _batch_sum(distribution, pairs):
    return distribution.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, pairs)
