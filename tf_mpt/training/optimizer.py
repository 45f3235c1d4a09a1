"""LossScaleOptimizer: dynamic or static loss scaling for any tf.compat.v1.train.Optimizer.

    compute_gradients(loss):  grads = inner.compute_gradients(loss * S) / S
    apply_gradients(grads):   finite = all grads finite (agreed by every replica)
                              update S (see tf_mpt.loss_scale)
                              if finite: inner.apply_gradients(grads, global_step)
                              else: nothing changes (variables, slots, global_step)

Example:
    >>> opt = tf_mpt.LossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3))
    >>> train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
"""

import tensorflow as tf

from tf_mpt._opt_out import keep_fp32
from tf_mpt._process.state import bypass
from tf_mpt.training import gradient_records as _records
from tf_mpt.training import loss_scale as _loss_scale
from tf_mpt.training.scaling import (all_reduce_in, apply_if_finite, create_slots,
                                     resolve_allreduce_dtype, scale_loss_value, unscale)

tf1 = tf.compat.v1

class LossScaleOptimizer(tf1.train.Optimizer):
    """Wraps a tf.compat.v1.train.Optimizer with loss scaling.

    Args:
        optimizer: the tf.compat.v1.train.Optimizer to wrap (not already wrapped).
        loss_scale: "dynamic" (default), a number (static scale), or a tf_mpt LossScale.
        name: optional name; defaults to "LossScale" + the inner optimizer's name.
        allreduce_dtype: dtype of the gradient all-reduce under tf.distribute: 'float32',
            'float16' (the loss-scaled gradients are cast, summed in float16 and unscaled
            in float32; an overflow in the sum is a non-finite step, skipped on every
            replica), 'bfloat16' (unscaled gradients), 'auto' (float16 with a dynamic
            loss scale, else bfloat16), or None for TF_MPT_ALLREDUCE_DTYPE (default float32).
    """

    def __init__(self, optimizer, loss_scale="dynamic", name=None, allreduce_dtype=None):
        if isinstance(optimizer, LossScaleOptimizer):
            raise ValueError(
                "optimizer is already a tf_mpt.LossScaleOptimizer; wrapping twice would scale "
                "the loss twice. Pass the inner optimizer (optimizer.inner_optimizer) instead.")
        if not isinstance(optimizer, tf1.train.Optimizer):
            raise TypeError(
                "optimizer must be a tf.compat.v1.train.Optimizer (e.g. MomentumOptimizer). "
                f"Received: optimizer={optimizer!r} (of type {type(optimizer).__name__}). For a "
                "Keras optimizer use keras.mixed_precision.LossScaleOptimizer or "
                "tf_mpt.scale_loss and tf_mpt.apply_scaled_gradients with a GradientTape.")
        scale = _loss_scale.get(loss_scale)
        if scale is None:
            raise ValueError("loss_scale cannot be None: pass 'dynamic', a number or a "
                             "LossScale, or use the inner optimizer directly.")
        super().__init__(use_locking=False,
                         name=name or "LossScale" + optimizer.get_name())
        self._optimizer = optimizer
        self._loss_scale = scale
        self._allreduce_dtype = resolve_allreduce_dtype(allreduce_dtype, scale)
        # tf.train.Checkpoint(optimizer=this) saves the inner optimizer and the scale state.
        self._track_trackable(optimizer, "base_optimizer")
        self._track_trackable(scale, "loss_scale")

    @property
    def inner_optimizer(self):
        return self._optimizer

    @property
    def loss_scale(self):
        return self._loss_scale

    @property
    def allreduce_dtype(self):
        """The tf.DType gradients are all-reduced in under tf.distribute."""
        return self._allreduce_dtype

    def compute_gradients(self, loss, var_list=None, gate_gradients=tf1.train.Optimizer.GATE_OP,
                          aggregation_method=None, colocate_gradients_with_ops=False,
                          grad_loss=None):
        """Gradients of `loss * scale`, divided by the scale (same signature as the inner)."""
        # Scaling and unscaling stay float32 under a later graph rewrite (keep_fp32): unscaling
        # a gradient in half precision would flush the small values scaling exists to keep.
        with keep_fp32():
            scale = self._loss_scale.scale()
        if callable(loss):
            def scaled_loss():
                value = loss()
                with keep_fp32():
                    return scale_loss_value(value, scale)
        else:
            with keep_fp32():
                scaled_loss = scale_loss_value(loss, scale)
        grads_and_vars = self._optimizer.compute_gradients(
            scaled_loss, var_list=var_list, gate_gradients=gate_gradients,
            aggregation_method=aggregation_method,
            colocate_gradients_with_ops=colocate_gradients_with_ops, grad_loss=grad_loss)
        with keep_fp32():
            inverse = tf.math.reciprocal(scale)
            return [(unscale(g, inverse), v) for g, v in grads_and_vars]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Applies the gradients only if all are finite (dynamic scale); updates the scale."""
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        # gradients tf_mpt's automatic path scaled (tf.gradients) now use this scale
        _records.claim(_records.records_for([g for g, _ in grads_and_vars], variables),
                       self._loss_scale, variables, self.get_name())
        half_reduce = self._allreduce_dtype != tf.float32 and tf.distribute.has_strategy()
        if not self._loss_scale.is_dynamic and not half_reduce:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        if tf.distribute.has_strategy():
            if tf.distribute.in_cross_replica_context():
                raise ValueError(
                    "apply_gradients() must be called in a replica context (inside "
                    "strategy.run or call_for_each_replica), like the wrapped optimizer's.")
            replica = tf.distribute.get_replica_context()
            if half_reduce:
                grads_and_vars = all_reduce_in(self._allreduce_dtype, replica, grads_and_vars,
                                               self._loss_scale)
            return replica.merge_call(self._distributed_apply,
                                      args=(grads_and_vars, global_step, name, half_reduce))
        return self._apply_if_finite(
            [g for g, _ in grads_and_vars], grads_and_vars, name,
            lambda: self._optimizer.apply_gradients(grads_and_vars, global_step, name))

    def _apply_if_finite(self, decide_from, grads_and_vars, name, apply):
        """The one loss-scaled step (scaling.apply_if_finite) as an op: slots first, the
        scale updated from `decide_from`, `apply` only if they are finite."""
        applied = apply_if_finite(self._loss_scale, decide_from, apply,
                                  make_slots=lambda: self._create_inner_slots(grads_and_vars),
                                  cond=_cond_v1)
        return tf.group(applied, name=name or self.get_name())

    def _distributed_apply(self, distribution, grads_and_vars, global_step, name,
                           reduced=False):
        """Cross-replica: all-reduce (unless `reduced`: done in the replica context, in a
        half type), agree on finiteness, then maybe apply (in that order).

        The all-reduce runs unconditionally, before the conditional: a collective inside a
        branch deadlocks when workers disagree (tensorflow#46863, horovod#3384). The finite
        flag is computed from the reduced gradients, which are the same on every replica, so
        every replica takes the same branch and gets the same new scale; a NaN on one replica
        reaches all of them through the sum.
        """
        variables = [v for _, v in grads_and_vars]
        if reduced:
            reduced = [g for g, _ in grads_and_vars]
        else:
            reduced = distribution.extended.batch_reduce_to(
                tf.distribute.ReduceOp.SUM, grads_and_vars)
        first_copies = [None if g is None else distribution.experimental_local_results(g)[0]
                        for g in reduced]
        return self._apply_if_finite(
            first_copies, grads_and_vars, name,
            lambda: self._apply_reduced(distribution, list(zip(reduced, variables)),
                                        global_step, name))

    def _apply_reduced(self, distribution, reduced_grads_and_vars, global_step, name):
        """The inner optimizer's per-variable updates on already reduced gradients."""
        from tensorflow.python.training import optimizer as tf1_optimizer  # pylint: disable=g-import-not-at-top
        inner = self._optimizer
        pairs = [(g, v) for g, v in reduced_grads_and_vars if g is not None]

        def update(variable, grad):
            processor = tf1_optimizer._get_processor(variable)  # pylint: disable=protected-access
            with tf.name_scope("update_" + variable.name.split(":")[0]):
                return processor.update_op(inner, grad)

        with tf.name_scope(name or inner.get_name()):
            inner._prepare()  # pylint: disable=protected-access
            update_ops = [op for g, v in pairs
                          for op in distribution.extended.update(v, update, args=(g,),
                                                                 group=False)]

            def finish(optimizer, ops):
                return optimizer._finish(ops, "update")  # pylint: disable=protected-access

            devices = distribution.extended.non_slot_devices([v for _, v in pairs])
            finished = distribution.extended.update_non_slot(
                devices, finish, args=(inner, update_ops), group=False)
            if global_step is None:
                return distribution.group(finished)
            with tf.control_dependencies(tf.nest.flatten(finished)):
                return distribution.group(distribution.extended.update(
                    global_step, lambda step: step.assign_add(1), group=False))

    def _create_inner_slots(self, grads_and_vars):
        """Creates the inner optimizer's slots outside the conditional branch."""
        var_list = [v for g, v in grads_and_vars if g is not None]
        with tf.init_scope():
            self._optimizer._create_slots(var_list)  # pylint: disable=protected-access

    def get_slot(self, var, name):
        return self._optimizer.get_slot(var, name)

    def get_slot_names(self):
        return self._optimizer.get_slot_names()

    def variables(self):
        return self._optimizer.variables() + self._loss_scale.variables_for_graph()

    # The inner optimizer does the per-variable work; reaching these is a bug.
    def _apply_dense(self, grad, var):
        raise NotImplementedError("LossScaleOptimizer delegates to its inner optimizer")

    _apply_sparse = _resource_apply_dense = _resource_apply_sparse = _apply_dense


def _cond_v1(pred, true_fn, false_fn):
    """tf.cond that builds v1 control flow in graph mode.

    TF1 optimizers update reference variables (ApplyMomentum takes `float32_ref`), which a
    functional (v2) cond cannot capture; v1 Switch/Merge control flow can.
    """
    if tf.executing_eagerly():
        return true_fn() if bool(pred) else false_fn()
    if hasattr(tf1.get_default_graph(), "outer_graph"):  # a tf.function: no ref variables
        return tf.cond(pred, true_fn, false_fn)
    from tensorflow.python.ops import control_flow_util  # pylint: disable=g-import-not-at-top
    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        return tf1.cond(pred, true_fn, false_fn)
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved


def scale_loss(loss, loss_scale):
    """`loss * scale` for differentiation under a GradientTape (TF2 custom loops).

    Args:
        loss: the loss tensor.
        loss_scale: a tf_mpt LossScale (e.g. tf_mpt.DynamicLossScale()), shared with
            apply_scaled_gradients.
    """
    with keep_fp32():
        return scale_loss_value(loss, _loss_scale.get(loss_scale).scale())


def apply_scaled_gradients(optimizer, scaled_grads, variables, loss_scale):
    """Unscales gradients of a scaled loss and applies them with a Keras optimizer if finite.

    Works eagerly and inside tf.function. The loss scale is updated either way; on a
    non-finite step no variable, optimizer slot or `optimizer.iterations` changes.

    Example:
        >>> scale = tf_mpt.DynamicLossScale()
        >>> @tf.function
        ... def train_step(x, y):
        ...     with tf.GradientTape() as tape:
        ...         loss = loss_fn(y, model(x))
        ...         scaled = tf_mpt.scale_loss(loss, scale)
        ...     grads = tape.gradient(scaled, model.trainable_variables)
        ...     tf_mpt.apply_scaled_gradients(opt, grads, model.trainable_variables, scale)
        ...     return loss

    Args:
        optimizer: a Keras optimizer (anything with apply_gradients(grads_and_vars)).
        scaled_grads: gradients of `scale_loss(loss, loss_scale)`.
        variables: the variables, in the order of `scaled_grads`.
        loss_scale: the same LossScale passed to scale_loss.

    Returns:
        A scalar bool tensor: whether the gradients were applied.
    """
    loss_scale = _loss_scale.get(loss_scale)
    variables = list(variables)
    with keep_fp32():
        inverse = tf.math.reciprocal(loss_scale.scale())
        grads = [unscale(g, inverse) for g in scaled_grads]
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    _records.opt_out(scaled_grads, variables)  # the script scales: no automatic scaling

    def apply():
        with bypass():
            return optimizer.apply_gradients(pairs)

    return apply_if_finite(loss_scale, grads, apply,
                           make_slots=lambda: create_slots(optimizer, variables))
