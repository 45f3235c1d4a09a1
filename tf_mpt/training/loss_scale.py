"""Loss scaling: StaticLossScale, DynamicLossScale and get().

Multiplying the loss by S before differentiation multiplies every gradient by S, lifting
small gradients out of float16's underflow range (below ~6e-8 they flush to zero); the
gradients are divided by S before they are applied.

Dynamic rule (per step, on the all-reduced gradients):

    if every gradient is finite:
        apply the update; good_steps += 1; skipped_steps = 0
        if good_steps == increment_period:
            scale = min(scale * multiplier, max_loss_scale)   # only if finite
            good_steps = 0
    else:
        skip the update (no variable, slot or global_step changes)
        scale = max(scale / multiplier, min_loss_scale); good_steps = 0; skipped_steps += 1
        if skipped_steps == WARN_AFTER_SKIPS: one WARNING on stderr (a real overflow, not
            the scale probing downward: that takes a step or two)
        if skipped_steps == max_consecutive_skips: raise, saying what happened and what to try

In a step XLA compiles (jit_compile=True), which has no kernel to print or to assert, the
warning and the stop are left out of the step and run after it, in its caller, on the state
the step left (tf_mpt/_process/xla.py: tf_mpt.function collects them while it traces a
compiled function and runs them after each call; where nothing collects them, one WARNING
says they are missing).

State lives in variables `tf_mpt/current_loss_scale` (float32), `tf_mpt/good_steps` and
`tf_mpt/skipped_steps` (int64: non-finite steps in a row), which tf.compat.v1.train.Saver
and tf.train.Checkpoint save. In a TF1 graph the scale and the skipped steps are also scalar
summaries `tf_mpt/current_loss_scale` and `tf_mpt/skipped_steps` (in the SUMMARIES
collection, so `tf.compat.v1.summary.merge_all()` and a MonitoredTrainingSession's summary
hook write them to TensorBoard); TF2 reads them from `tf_mpt.loss_scale_of(optimizer)`.

Example:
    >>> scale = tf_mpt.loss_scale.get("dynamic")
    >>> opt = tf_mpt.LossScaleOptimizer(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), scale)
"""

import math
import numbers
import sys

import tensorflow as tf

from tf_mpt._process import xla as _xla
from tf_mpt.training import checkpoints as _checkpoints

__all__ = ["LossScale", "StaticLossScale", "DynamicLossScale", "get", "all_finite"]

tf1 = tf.compat.v1

SCOPE = "tf_mpt"
# Non-finite steps in a row after which one WARNING says the scale fights a real overflow: from
# 2^15 a float16 scale needs a step or two to fall below an overflow of the scaled gradients;
# eight in a row is the scale at 2^7 and still overflowing.
WARN_AFTER_SKIPS = 8


def _check_number(name, value, *, positive=True, at_least=None, integer=False):
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    if ok:
        ok = math.isfinite(value) and (value > 0 if positive else True)
    if ok and at_least is not None:
        ok = value >= at_least
    if not ok:
        need = "a positive integer" if integer else "a positive finite number"
        if at_least is not None:
            need += f" >= {at_least}"
        raise ValueError(f"{name} must be {need}. Received: {name}={value!r} "
                         f"(of type {type(value).__name__})")
    return value


def gradient_tensors(grads, indices=False):
    """The values of `grads`: None skipped, an IndexedSlices's values (and its indices when
    `indices`) in its place."""
    out = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            out.extend([g.values, g.indices] if indices else [g.values])
        elif g is not None:
            out.append(g)
    return out


def all_finite(grads):
    """A scalar bool tensor: every gradient (dense or IndexedSlices; None ignored) is finite."""
    checks = [tf.reduce_all(tf.math.is_finite(g)) for g in gradient_tensors(grads)]
    if not checks:
        return tf.constant(True)
    return tf.reduce_all(tf.stack(checks))


class LossScale(tf.Module):
    """Base class. `scale()` is the current scale tensor (float32); `update(grads)` returns
    (update_op, should_apply) given the already all-reduced gradients."""

    is_dynamic = False

    def scale(self):
        raise NotImplementedError

    def __call__(self):
        return self.scale()

    def update(self, grads):
        raise NotImplementedError

    def update_from_finite(self, is_finite):
        """Like update, from a precomputed scalar bool (e.g. agreed across replicas)."""
        raise NotImplementedError

    def variables_for_graph(self):
        """The state variables of the current graph (a static scale has none)."""
        return []


class StaticLossScale(LossScale):
    """A fixed loss scale. Non-finite gradients are applied as they are (no skipping).

    Args:
        value: the scale, a positive finite number (e.g. 128 or 0.5).
    """

    def __init__(self, value):
        super().__init__(name="static_loss_scale")
        self.value = float(_check_number("value", value))

    def scale(self):
        return tf.constant(self.value, tf.float32)

    def update(self, grads):
        return tf.no_op(), tf.constant(True)

    def update_from_finite(self, is_finite):
        return tf.no_op(), tf.constant(True)

    def __repr__(self):
        return f"StaticLossScale({self.value:g})"


class DynamicLossScale(LossScale):
    """A loss scale that halves on overflow and doubles after a run of finite steps.

    Args:
        initial_loss_scale: starting scale (2**15: about half float16's largest value; a scale
            that is too high falls much faster than one that is too low rises).
        increment_period: finite steps in a row before the scale grows.
        multiplier: growth and shrink factor (> 1).
        min_loss_scale: floor; the scale never falls below it (may be < 1).
        max_loss_scale: ceiling; the scale never grows above it, and never to inf.
        max_consecutive_skips: raise after this many non-finite steps in a row.
    """

    is_dynamic = True

    def __init__(self, initial_loss_scale=2 ** 15, increment_period=2000, multiplier=2.0,
                 min_loss_scale=1.0, max_loss_scale=2 ** 24, max_consecutive_skips=100):
        super().__init__(name="dynamic_loss_scale")
        self.initial_loss_scale = float(_check_number("initial_loss_scale", initial_loss_scale))
        self.increment_period = int(_check_number("increment_period", increment_period,
                                                  integer=True))
        self.multiplier = float(_check_number("multiplier", multiplier))
        if self.multiplier <= 1:
            raise ValueError(f"multiplier must be > 1. Received: multiplier={multiplier!r}")
        self.min_loss_scale = float(_check_number("min_loss_scale", min_loss_scale))
        self.max_loss_scale = float(_check_number("max_loss_scale", max_loss_scale))
        if not self.min_loss_scale <= self.initial_loss_scale <= self.max_loss_scale:
            raise ValueError(
                "need min_loss_scale <= initial_loss_scale <= max_loss_scale. Received: "
                f"min_loss_scale={min_loss_scale!r}, initial_loss_scale={initial_loss_scale!r}, "
                f"max_loss_scale={max_loss_scale!r}")
        self.max_consecutive_skips = int(_check_number(
            "max_consecutive_skips", max_consecutive_skips, integer=True))
        self._graph_state = {}
        self._eager_state = None
        if tf.executing_eagerly():  # TF2: variables exist at once, so checkpoints can restore
            self._eager_state = self._make_eager_variables()

    # --- state ---------------------------------------------------------------------------------

    def _state(self):
        """(current_loss_scale, good_steps, skipped_steps) for the current graph or eager."""
        with tf.init_scope():
            if tf.executing_eagerly():
                if self._eager_state is None:
                    self._eager_state = self._make_eager_variables()
                return self._eager_state
            graph = tf1.get_default_graph()
            state = self._graph_state.get(graph)
            if state is None:
                state = self._graph_state[graph] = self._make_graph_variables(graph)
            return state

    def _specs(self):
        return (("current_loss_scale", self.initial_loss_scale, tf.float32),
                ("good_steps", 0, tf.int64), ("skipped_steps", 0, tf.int64))

    def _make_eager_variables(self):
        made = []
        for name, initial, dtype in self._specs():
            made.append(tf.Variable(initial, name=f"{SCOPE}/{name}", dtype=dtype,
                                    trainable=False,
                                    aggregation=tf.VariableAggregation.NONE))
        self.current_loss_scale, self.good_steps, self.skipped_steps = made
        return tuple(made)

    def _make_graph_variables(self, graph):
        _checkpoints.install_saver_restore_fallback()
        scope, k = SCOPE, 0
        while _has_op(graph, f"{scope}/current_loss_scale"):
            k += 1
            scope = f"{SCOPE}_{k}"
        made = []
        with tf1.variable_scope(tf1.VariableScope(reuse=False, name="")):
            with tf1.variable_scope(scope):
                for name, initial, dtype in self._specs():
                    made.append(tf1.get_variable(
                        name, initializer=tf.constant(initial, dtype), trainable=False,
                        use_resource=True, aggregation=tf.VariableAggregation.NONE))
            # TensorBoard shows what the scale does (a summary reads the variable when run)
            for variable, name in ((made[0], "current_loss_scale"), (made[2], "skipped_steps")):
                # the tag exactly the variable's name (summary.scalar would uniquify it to _1)
                summary = tf.raw_ops.ScalarSummary(tags=f"{scope}/{name}",
                                                   values=variable.read_value(),
                                                   name=f"{scope}/{name}_summary")
                tf1.add_to_collection(tf1.GraphKeys.SUMMARIES, summary)
        return tuple(made)

    def variables_for_graph(self):
        """The state variables of the current graph (created on first use)."""
        return list(self._state())

    def scale(self):
        return tf.identity(self._state()[0])

    # --- update ----------------------------------------------------------------------------------

    def update(self, grads):
        return self.update_from_finite(all_finite(grads))

    def update_from_finite(self, is_finite):
        scale, good, skipped = self._state()

        def on_finite():
            grow = good + 1 >= self.increment_period
            grown = tf.minimum(scale * self.multiplier, self.max_loss_scale)
            new_scale = tf.where(grow & tf.math.is_finite(grown), grown, scale)
            return tf.group(scale.assign(new_scale),
                            good.assign(tf.where(grow, tf.constant(0, tf.int64), good + 1)),
                            skipped.assign(tf.constant(0, tf.int64)))

        compiled = _xla.in_xla_context()
        if compiled:
            _xla.defer(self, self.checks_after_step, (
                "tf_mpt: a training step XLA compiles (jit_compile=True) scales its loss, but "
                "nothing checks its skipped steps after it (it was not traced through "
                f"tf_mpt.function): no warning after {WARN_AFTER_SKIPS} non-finite steps in a "
                f"row and no stop after {self.max_consecutive_skips}. Read "
                "tf_mpt.loss_scale_of(optimizer).skipped_steps, or compile the step with "
                "tf_mpt.function(jit_compile=True)."))

        def on_non_finite():
            new_scale = tf.maximum(scale / self.multiplier, self.min_loss_scale)
            new_skipped = skipped + 1
            # compiled: checked after the step, by its caller (_process/xla.py)
            checks = [] if compiled else self._skip_checks(new_scale, new_skipped)
            with tf.control_dependencies(checks):
                return tf.group(scale.assign(new_scale), good.assign(tf.constant(0, tf.int64)),
                                skipped.assign(new_skipped))

        update_op = tf.cond(is_finite, on_finite, on_non_finite)
        return update_op, is_finite

    def _skip_checks(self, new_scale, new_skipped):
        """The stop (an Assert) and the warning (a print) on `new_skipped` steps in a row."""
        check = tf.debugging.Assert(
            new_skipped < self.max_consecutive_skips,
            [f"tf_mpt: {self.max_consecutive_skips} training steps in a row had non-finite "
             "(inf/NaN) gradients and were skipped; the loss scale is now", new_scale,
             "(min_loss_scale is", self.min_loss_scale, "). If the loss itself is "
             "inf/NaN, the forward pass overflows: keep the op that overflows in float32 "
             "(TF_MPT_DENYLIST_ADD=<op> or tf_mpt.keep_fp32()) or use bfloat16; otherwise "
             "lower min_loss_scale, the learning rate, or check the input data."],
            summarize=1, name="too_many_skipped_steps")
        warn = tf.cond(
            tf.equal(new_skipped, WARN_AFTER_SKIPS),
            lambda: tf.print(
                f"tf_mpt: WARNING: {WARN_AFTER_SKIPS} training steps in a row had non-finite "
                "(inf/NaN) gradients and were skipped (no variable, slot or step counter "
                "changed); the loss scale is now", new_scale, ": it is fighting a real "
                "overflow, not probing. If the loss is inf/NaN the forward pass overflows "
                "(keep that op float32 or use bfloat16); else check the data and the "
                "learning rate.", output_stream=sys.stderr),
            tf.no_op, name="warn_skipped_steps")
        return [check, warn]

    def checks_after_step(self):
        """_skip_checks on the state a compiled step left (in the caller of that step)."""
        scale, _, skipped = self._state()
        return self._skip_checks(scale.read_value(), skipped.read_value())

    def __repr__(self):
        return (f"DynamicLossScale(initial_loss_scale={self.initial_loss_scale:g}, "
                f"increment_period={self.increment_period}, multiplier={self.multiplier:g}, "
                f"min_loss_scale={self.min_loss_scale:g}, max_loss_scale={self.max_loss_scale:g})")


def _has_op(graph, name):
    try:
        graph.get_operation_by_name(name)
        return True
    except KeyError:
        return False


def get(identifier, name="loss_scale"):
    """A LossScale from a number (static), "dynamic", a LossScale (returned as is) or None.

    `name` is the argument's name as the caller's user wrote it, for error messages.
    """
    if identifier is None or isinstance(identifier, LossScale):
        return identifier
    if isinstance(identifier, str) and identifier.strip().lower() == "dynamic":
        return DynamicLossScale()
    if isinstance(identifier, numbers.Real) and not isinstance(identifier, bool):
        return StaticLossScale(_check_number(name, identifier))
    raise ValueError(
        f"{name} must be a positive number, 'dynamic', a tf_mpt LossScale or None. "
        f"Received: {name}={identifier!r} (of type {type(identifier).__name__})")
