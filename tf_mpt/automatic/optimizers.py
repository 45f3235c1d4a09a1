"""Claiming gradients for an optimizer under the automatic path: tf.compat.v1 optimizers
compute and apply through a LossScaleOptimizer; Keras and tf_keras optimizers' apply_gradients
/ apply take the gradients tf_mpt scaled, skip non-finite steps and update a loss scale of
their own (under a tf.distribute strategy, after tf_mpt's all-reduce); `loss_scale_of`.
"""

import sys

import tensorflow as tf

from tf_mpt._process import patches as _patches
from tf_mpt.automatic import state as _state
from tf_mpt._process.state import STATE, bypass, bypassing, warn_once
from tf_mpt.training import gradient_records as _records
from tf_mpt.training import loss_scale as _loss_scale
from tf_mpt.training import optimizer as _optimizer
from tf_mpt.training import scaling as _scaling

_OPTIMIZER_SCALE = "tf_mpt_loss_scale"  # checkpoint name of a Keras optimizer's scale


# --- TF1 optimizers: automatic loss scaling -----------------------------------------------

def _scaling_optimizer(optimizer):
    wrapper = getattr(optimizer, "_tf_mpt_loss_scale_optimizer", None)
    if wrapper is None:
        settings = STATE.settings
        wrapper = _optimizer.LossScaleOptimizer(optimizer, settings.loss_scale,
                                                allreduce_dtype=settings.config.allreduce_dtype)
        optimizer._tf_mpt_loss_scale_optimizer = wrapper  # pylint: disable=protected-access
    return wrapper


def _is_wrapper(optimizer):
    return isinstance(optimizer, _optimizer.LossScaleOptimizer)


def compute_gradients(original, optimizer, loss, *args, **kwargs):
    if bypassing() or _is_wrapper(optimizer):
        return original(optimizer, loss, *args, **kwargs)
    with bypass():
        return _scaling_optimizer(optimizer).compute_gradients(loss, *args, **kwargs)


def apply_gradients(original, optimizer, grads_and_vars, *args, **kwargs):
    if bypassing() or _is_wrapper(optimizer):
        return original(optimizer, grads_and_vars, *args, **kwargs)
    with bypass():  # the wrapper claims gradients tf.gradients scaled (gradient_records)
        return _scaling_optimizer(optimizer).apply_gradients(grads_and_vars, *args, **kwargs)


def patch_keras_optimizers():
    """Keras optimizers' apply_gradients / apply (once keras is imported), and tf_keras's
    (Keras 2: `tf.keras` under TF_USE_LEGACY_KERAS=1), its optimizers old and new and its
    LossScaleOptimizers (which opt their variables out), once tf_keras is imported."""
    keras = sys.modules.get("keras")
    base = sys.modules.get("keras.src.optimizers.base_optimizer")
    if keras is not None and base is not None and hasattr(base, "BaseOptimizer"):
        owner = base.BaseOptimizer
        if not _patches.is_applied(owner, "apply"):
            _state.patch(owner, "apply_gradients", keras_apply_gradients)
            _state.patch(owner, "apply", keras_apply)
    for owner in _tf_keras_optimizer_classes():
        if "apply_gradients" in vars(owner) and not _patches.is_applied(owner, "apply_gradients"):
            _state.patch(owner, "apply_gradients", tf_keras_apply_gradients)


def _tf_keras_optimizer_classes():
    """tf_keras's optimizer base classes and LossScaleOptimizers, if tf_keras is imported."""
    if "tf_keras" not in sys.modules:
        return []
    import importlib  # pylint: disable=g-import-not-at-top
    found = []
    for module_name, class_names in (
            ("tf_keras.src.optimizers.optimizer", ("Optimizer",)),
            ("tf_keras.src.optimizers.legacy.optimizer_v2", ("OptimizerV2",)),
            ("tf_keras.src.mixed_precision.loss_scale_optimizer",
             ("LossScaleOptimizer", "LossScaleOptimizerV3"))):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.extend(getattr(module, name) for name in class_names if hasattr(module, name))
    return found


# --- Keras and tf_keras optimizers' apply ----------------------------------------------------

def _keras_loss_scale_optimizer(optimizer):
    """A Keras or tf_keras LossScaleOptimizer (the script scales its loss with it)."""
    keras = sys.modules.get("keras")
    classes = [getattr(getattr(keras, "mixed_precision", None), "LossScaleOptimizer", None)]
    tf_keras = sys.modules.get("tf_keras.src.mixed_precision.loss_scale_optimizer")
    classes.append(getattr(tf_keras, "BaseLossScaleOptimizer", None))
    return any(cls is not None and isinstance(optimizer, cls) for cls in classes)


def _optimizer_scale(optimizer):
    """The optimizer's LossScale (made on first use and tracked for tf.train.Checkpoint)."""
    scale = optimizer.__dict__.get("_tf_mpt_scale")
    if scale is None:
        with tf.init_scope():
            scale = _loss_scale.get(STATE.default_loss_scale)
        optimizer.__dict__["_tf_mpt_scale"] = scale
        track = getattr(optimizer, "_track_trackable", None)
        if track is not None:
            track(scale, _OPTIMIZER_SCALE, overwrite=True)
    return scale


def _keras_apply(optimizer, grads, variables, apply):
    """A Keras optimizer applies (grads, variables) by calling `apply(grads, variables)`;
    with scaled gradients it skips non-finite steps and updates its scale.

    Returns (scaled, result): whether tf_mpt's scale decided the step, and apply's result
    (when it did not) or the step's bool "applied" tensor (when it did; None in a
    tf.distribute replica context)."""
    grads, variables = list(grads), list(variables)
    if not _records.installed() or bypassing():
        return False, apply(grads, variables)
    if (_keras_loss_scale_optimizer(optimizer)
            or getattr(optimizer, "loss_scale_factor", None) is not None):
        _records.opt_out(grads, variables)  # the script scales its loss itself
        with bypass():
            return False, apply(grads, variables)
    records = _records.records_for(grads, variables)
    if not records:
        with bypass():
            return False, apply(grads, variables)
    if _records.in_distribution() and (tf.distribute.in_cross_replica_context()
                                       or not _can_skip_keras_reduce(optimizer)):
        # no safe step to decide: these variables' gradients run unscaled from now on
        warn_once(("distribution", type(optimizer).__name__), "%s applies gradients under a "
                  "tf.distribute strategy outside a replica context, or without the "
                  "all-reduce hook tf_mpt needs (a Keras 3 optimizer in strategy.run has "
                  "it); its gradients run without loss scaling.", type(optimizer).__name__)
        _records.opt_out(grads, variables)
        with bypass():
            return False, apply(grads, variables)
    scale = _optimizer_scale(optimizer)
    _records.claim(records, scale, variables, type(optimizer).__name__)
    if _records.in_distribution():
        _distributed_keras_apply(optimizer, grads, variables, scale, apply)
        return True, None

    def run():
        with bypass():
            return apply(grads, variables)

    return True, _scaling.apply_if_finite(
        scale, grads, run,
        make_slots=lambda: _scaling.create_slots(optimizer, variables))


def _distributed_keras_apply(optimizer, grads, variables, scale, apply):
    """Replica context: all-reduce the gradients (in TF_MPT_ALLREDUCE_DTYPE, unconditionally),
    then in the cross-replica context decide once from the reduced gradients (the same on
    every replica), update the scale, and maybe apply them on every replica with the Keras
    optimizer, whose own all-reduce is skipped for that call (they are reduced already)."""
    replica = tf.distribute.get_replica_context()
    dtype = _scaling.resolve_allreduce_dtype(STATE.allreduce_dtype, scale)
    with bypass():
        reduced = _scaling.all_reduce_in(dtype, replica, list(zip(grads, variables)), scale)
    reduced_grads = [g for g, _ in reduced]

    def apply_reduced(*local_grads):
        with bypass():
            apply(list(local_grads), variables)

    def cross_replica(distribution, *reduced_grads):
        firsts = [None if g is None else distribution.experimental_local_results(g)[0]
                  for g in reduced_grads]

        def run():
            with _reduced_already(optimizer):
                distribution.extended.call_for_each_replica(apply_reduced, args=reduced_grads)

        return _scaling.apply_if_finite(
            scale, firsts, run, make_slots=lambda: _scaling.create_slots(optimizer, variables))

    replica.merge_call(cross_replica, args=tuple(reduced_grads))


class _reduced_already:  # pylint: disable=invalid-name
    """While active, the Keras optimizer does not all-reduce the gradients it applies."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def __enter__(self):
        self.optimizer._all_reduce_sum_gradients = list  # pylint: disable=protected-access

    def __exit__(self, *exc):
        del self.optimizer._all_reduce_sum_gradients  # pylint: disable=protected-access


def _can_skip_keras_reduce(optimizer):
    return callable(getattr(type(optimizer), "_all_reduce_sum_gradients", None))


def keras_apply_gradients(original, optimizer, grads_and_vars, *args, **kwargs):
    """Patched keras Optimizer.apply_gradients(grads_and_vars); returns the iterations."""
    pairs = list(grads_and_vars)
    _keras_apply(optimizer, [g for g, _ in pairs], [v for _, v in pairs],
                 lambda g, v: original(optimizer, list(zip(g, v)), *args, **kwargs))
    return optimizer.iterations


def tf_keras_apply_gradients(original, optimizer, grads_and_vars, *args, **kwargs):
    """Patched tf_keras (Keras 2) Optimizer / OptimizerV2 / LossScaleOptimizer
    apply_gradients. Returns what the original returns, or when tf_mpt's scale decides the
    step: the iterations variable (eagerly and in a tf.function), an op running the step (a
    TF1 graph)."""
    pairs = list(grads_and_vars)
    scaled, result = _keras_apply(
        optimizer, [g for g, _ in pairs], [v for _, v in pairs],
        lambda g, v: original(optimizer, list(zip(g, v)), *args, **kwargs))
    if not scaled:
        return result
    if tf.executing_eagerly() or tf.inside_function() or result is None:
        return optimizer.iterations
    return tf.group(result, name="tf_mpt_apply_gradients")


def keras_apply(original, optimizer, grads, trainable_variables=None, *args, **kwargs):
    """Patched keras Optimizer.apply(grads, trainable_variables); without variables, a built
    optimizer's own (as Keras pairs them)."""
    if trainable_variables is None:
        known = getattr(optimizer, "_trainable_variables", None)
        if (not getattr(optimizer, "built", False) or known is None
                or len(known) != len(list(grads))):
            return original(optimizer, grads, trainable_variables, *args, **kwargs)
        trainable_variables = list(known)
    _keras_apply(optimizer, grads, trainable_variables,
                 lambda g, v: original(optimizer, g, v, *args, **kwargs))
    return None


def loss_scale_of(optimizer):
    """The LossScale tf_mpt's automatic path gave `optimizer` (a Keras optimizer, or a
    tf.compat.v1 optimizer it wrapped), or None if it has none."""
    scale = getattr(optimizer, "__dict__", {}).get("_tf_mpt_scale")
    if scale is None:
        wrapper = getattr(optimizer, "_tf_mpt_loss_scale_optimizer", None)
        scale = wrapper.loss_scale if wrapper is not None else None
    return scale

