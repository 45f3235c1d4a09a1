"""Loss scaling wherever a script takes gradients, with no code edits (the automatic path).

With float16 and loss scaling on, the gradient of a float loss with respect to variables,
taken by `tf.gradients` / `tf.compat.v1.gradients` (TF1 graphs) or `GradientTape.gradient`
(TF2, eagerly or in a tf.function), is computed from the scaled loss: the backward pass
starts from S instead of 1, so small float16 gradients survive. Each gradient is divided by
S in float32 before the script sees it, so clipping and logging between `gradient` and
`apply_gradients` see the values of a float32 run. The optimizer that applies them owns one
DynamicLossScale: it skips a step whose gradients are not all finite (no variable, slot or
iteration counter changes) and grows or shrinks its scale.

Which S a gradient computation uses:
  * its variables were applied by an optimizer before: that optimizer's scale;
  * otherwise, in a graph (TF1, or a tf.function being traced): a pending scale, 1 until
    the first optimizer that applies the gradients rewires it to its own scale;
  * otherwise, eagerly: none (S = 1); the optimizer that applies the gradients claims the
    variables, and their next gradient uses its scale.

A pattern that cannot be mapped safely runs unscaled with one WARNING naming it and where
the script does it: gradients that reach no optimizer, a persistent tape's second loss,
gradients taken while another tape records (second order), a gradient of a gradient (TF1),
a loss whose variables belong to two optimizers, a gradient inside a tf.compat.v1
while_loop/cond body, and a Keras optimizer applying under a tf.distribute strategy outside a
replica context or without the all-reduce hook tf_mpt needs (tf_keras optimizers). Under a
strategy, in a replica context (`strategy.run`), the gradients are all-reduced by tf_mpt (in
TF_MPT_ALLREDUCE_DTYPE) and the step is decided once for all replicas. Gradients the script seeds itself (`grad_ys`, `output_gradients`), gradients with
respect to tensors rather than variables, and calls from Keras or TensorFlow themselves
(Keras `fit` has its own loss scaling) are left as they are.

Scale state: `tf_mpt/current_loss_scale`, `good_steps`, `skipped_steps`; a TF1 graph saves
them with its Saver, and a Keras optimizer tracks its scale as `tf_mpt_loss_scale`, so
`tf.train.Checkpoint(optimizer=...)` saves and restores it (a checkpoint without it, from a
float32 run, restores too).
"""

import logging
import sys
import threading
import weakref

import tensorflow as tf

from tf_mpt.rewrite import keep_fp32
from tf_mpt.training import loss_scale as _loss_scale
from tf_mpt.training import scaling as _scaling

__all__ = ["install", "uninstall", "tf_gradients", "tape_gradient", "keras_apply_gradients",
           "keras_apply", "claim", "report_unclaimed", "loss_scale_of", "Record"]

_log = logging.getLogger("tf_mpt")

# Frames of these modules are not "the script": a call from them is TensorFlow's or Keras's.
_LIBRARIES = ("keras", "tf_keras", "tensorflow", "absl")
_SKIPPED_FRAMES = ("tf_mpt", "tensorflow.python.autograph")

_OPTED_OUT = "opted out"  # a variable whose gradients are scaled by someone else
_VARIABLE_SCALE = "_tf_mpt_loss_scale"  # attribute on a variable: its optimizer's scale
_AWAITING = "_tf_mpt_awaiting"  # attribute on a variable: its last eager Record
_OPTIMIZER_SCALE = "tf_mpt_loss_scale"  # checkpoint name of a Keras optimizer's scale

# while installed: the loss scale identifier ('dynamic' or a number) for optimizers that have
# none yet, and the all-reduce dtype choice (TF_MPT_ALLREDUCE_DTYPE)
_state = {"loss_scale": None, "allreduce_dtype": "float32"}
_records = weakref.WeakKeyDictionary()  # graph -> {name of an unscaling op: Record}
_warned = set()
_local = threading.local()


def install(loss_scale, allreduce_dtype="float32"):
    """Turns automatic scaling on with `loss_scale` ('dynamic' or a number) for optimizers
    that have none yet and gradients all-reduced in `allreduce_dtype` under tf.distribute
    (the patches themselves are made by tf_mpt.automatic)."""
    _state["loss_scale"] = loss_scale
    _state["allreduce_dtype"] = allreduce_dtype


def uninstall():
    _state["loss_scale"] = None
    _warned.clear()


def installed():
    return _state["loss_scale"] is not None


class Record:
    """One gradient computation: where the script made it and which scale it uses.

    `scale` is the LossScale in use (None while pending, or eagerly before an optimizer
    claimed the variables: then the gradients are unscaled); `pending` is the Identity op
    holding a pending scale in a graph, rewired by `claim`.
    """

    def __init__(self, site, scale=None, pending=None):
        self.site = site
        self.scale = scale
        self.pending = pending
        self.claimed = False
        self.reported = False

    def __repr__(self):
        return f"Record({self.site}, scale={self.scale!r}, claimed={self.claimed})"


# --- where the call comes from ----------------------------------------------------------------

def _caller():
    """(module name, 'file:line') of the first frame outside tf_mpt and autograph; a line of
    code autograph generated (in a tf.function) is named by the script's own file:line."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
        module = frame.f_globals.get("__name__", "") or ""
        if not any(module == m or module.startswith(m + ".") for m in _SKIPPED_FRAMES):
            return module, _script_line(frame.f_code, frame.f_lineno)
        frame = frame.f_back
    return "", "<unknown>"


_AUTOGRAPH_FILE = "__autograph_generated_file"
_source_maps = {}  # generated file -> {line: 'file:line' of the script}


def _script_line(code, line):
    filename = code.co_filename
    if _AUTOGRAPH_FILE not in filename:
        return f"{filename}:{line}"
    lines = _source_maps.get(filename)
    if lines is None:
        lines = _source_maps[filename] = _autograph_lines(code)
    return lines.get(line, f"{filename}:{line}")


def _autograph_lines(code):
    """{generated line: 'file:line'} from the source map autograph keeps on the converted
    function (its `ag_source_map`); found once per generated file, when a gradient is
    taken in it, i.e. while a tf.function is traced."""
    import gc  # pylint: disable=g-import-not-at-top
    for holder in gc.get_referrers(code):
        source_map = getattr(holder, "ag_source_map", None)
        if isinstance(source_map, dict):
            return {key.lineno: f"{info.loc.filename}:{info.loc.lineno}"
                    for key, info in source_map.items()
                    if getattr(key, "filename", None) == code.co_filename}
    return {}


def _from_library(module):
    return module.split(".")[0] in _LIBRARIES


def _warn_once(key, message, *args):
    if key in _warned:
        return
    _warned.add(key)
    _log.warning(message, *args)


class _Passthrough:
    """While active (this thread), the patched methods do what TensorFlow/Keras would."""

    def __enter__(self):
        self.previous = getattr(_local, "passthrough", False)
        _local.passthrough = True

    def __exit__(self, *exc):
        _local.passthrough = self.previous


def _passing_through():
    return getattr(_local, "passthrough", False)


# --- what may be scaled -----------------------------------------------------------------------

def _is_variable(value):
    if isinstance(value, tf.Variable):
        return True
    keras = sys.modules.get("keras")
    variable_class = getattr(keras, "Variable", None) if keras is not None else None
    return variable_class is not None and isinstance(value, variable_class)


def _float_tensors(values):
    return bool(values) and all(
        isinstance(v, tf.Tensor) and v.dtype.is_floating for v in values)


def _in_distribution():
    """True inside a non-default tf.distribute strategy's scope."""
    return tf.distribute.has_strategy()


def _graph_records(graph):
    records = _records.get(graph)
    if records is None:
        records = _records[graph] = {}
    return records


def _scale_of(variables):
    """The one LossScale the variables' optimizer owns, None if none has claimed them,
    _OPTED_OUT if any is scaled by someone else, or a tuple if they disagree."""
    found = {id(getattr(v, _VARIABLE_SCALE, None)): getattr(v, _VARIABLE_SCALE, None)
             for v in variables}
    values = list(found.values())
    if any(v is _OPTED_OUT for v in values):
        return _OPTED_OUT
    if len(values) == 1:
        return values[0]
    return tuple(values)


# --- the scaled backward pass -----------------------------------------------------------------

def _pending_scale():
    """An Identity of 1.0 that `claim` rewires to an optimizer's scale (graph mode)."""
    with tf.control_dependencies(None), keep_fp32("tf_mpt_loss_scale"):
        return tf.identity(tf.constant(1.0, tf.float32, name="unclaimed"), name="pending")


def _scaled(differentiate, targets, scale_tensor, record, graph):
    """differentiate(seeds) with seeds = S (per target, in its dtype); the gradients it
    returns (a structure, None allowed), each divided by S in float32."""
    with keep_fp32("tf_mpt_scale"):
        seeds = [tf.fill(tf.shape(t), tf.cast(scale_tensor, t.dtype)) for t in targets]
    grads = differentiate(seeds)
    with keep_fp32("tf_mpt_unscale"):
        inverse = tf.math.reciprocal(scale_tensor)
        unscaled = tf.nest.map_structure(lambda g: _scaling.unscale(g, inverse), grads)
    if graph is not None:
        names = _graph_records(graph)
        for g in tf.nest.flatten(unscaled):
            if g is None:
                continue
            values = g.values if isinstance(g, tf.IndexedSlices) else g
            names[values.op.name] = record
    return unscaled


def _ancestor_records(tensors, graph):
    """The Records whose unscaled gradients `tensors` are computed from (data edges only;
    the walk stops at each unscaling op)."""
    names = _records.get(graph)
    if not names:
        return []
    found, seen = [], set()
    stack = [t.op for t in tensors if t is not None and getattr(t, "graph", None) is graph]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        record = names.get(op.name)
        if record is not None:
            if record not in found:
                found.append(record)
            continue
        stack.extend(t.op for t in op.inputs)
    return found


def _flat_gradient_tensors(grads):
    out = []
    for g in grads:
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            out.extend([g.values, g.indices])
        elif isinstance(g, tf.Tensor):
            out.append(g)
    return out


# --- TF1: tf.gradients / tf.compat.v1.gradients -----------------------------------------------

def tf_gradients(original, ys, xs, grad_ys=None, *args, **kwargs):
    """`original(ys, xs, ...)`, from the scaled loss when the call is the script's, of float
    ys with respect to variables, in a graph."""
    if not installed() or _passing_through() or grad_ys is not None or tf.executing_eagerly():
        return original(ys, xs, grad_ys, *args, **kwargs)
    module, site = _caller()
    targets, sources = tf.nest.flatten(ys), tf.nest.flatten(xs)
    if (_from_library(module) or not _float_tensors(targets) or not sources
            or not all(_is_variable(x) for x in sources)):
        return original(ys, xs, grad_ys, *args, **kwargs)
    what = f"tf.gradients at {site}"
    graph = targets[0].graph
    if _ancestor_records(targets, graph):
        _warn_once(("second order", site), "%s differentiates gradients tf_mpt scaled "
                   "(a gradient of a gradient); it runs without loss scaling.", what)
        return original(ys, xs, grad_ys, *args, **kwargs)
    if graph._get_control_flow_context() is not None:  # pylint: disable=protected-access
        _warn_once(("control flow", site), "%s is inside a tf.compat.v1 while_loop or cond; "
                   "its gradients run without loss scaling.", what)
        return original(ys, xs, grad_ys, *args, **kwargs)
    return _scaled_gradients(
        what, sources, targets, graph,
        lambda seeds: original(ys, xs, seeds, *args, **kwargs))


def _scaled_gradients(what, sources, targets, graph, differentiate):
    """Shared by tf.gradients and a tape: picks the scale (see the module docstring)."""
    scale = _scale_of(sources)
    if scale is _OPTED_OUT:
        return differentiate(None)
    if isinstance(scale, tuple):
        _warn_once(("two optimizers", what), "%s takes the gradient of one loss with respect "
                   "to variables of different optimizers; it runs without loss scaling "
                   "(take one gradient per optimizer).", what)
        return differentiate(None)
    if scale is not None:
        record = Record(what, scale=scale)
        with keep_fp32():
            scale_tensor = scale.scale()
    elif graph is not None:
        scale_tensor = _pending_scale()
        record = Record(what, pending=scale_tensor.op)
    else:
        _check_previous_eager(sources, what)
        record = Record(what)
        grads = differentiate(None)
        for v in sources:
            setattr(v, _AWAITING, record)
        return grads
    grads = _scaled(differentiate, targets, scale_tensor, record, graph)
    if graph is None:
        for v in sources:
            setattr(v, _AWAITING, record)
    return grads


def _check_previous_eager(sources, what):
    for v in sources:
        previous = getattr(v, _AWAITING, None)
        if previous is not None and not previous.claimed and not previous.reported:
            previous.reported = True
            _warn_once(("no optimizer", previous.site), "the gradients taken by %s reached no "
                       "optimizer's apply_gradients; they run without loss scaling until an "
                       "optimizer applies gradients of these variables.", previous.site)
            return


# --- TF2: GradientTape.gradient -----------------------------------------------------------------

def tape_gradient(original, tape, target, sources, output_gradients=None, *args, **kwargs):
    """GradientTape.gradient, from the scaled loss when the call is the script's, of float
    targets with respect to variables."""
    if not installed() or _passing_through() or output_gradients is not None:
        return original(tape, target, sources, output_gradients, *args, **kwargs)
    module, site = _caller()
    targets, flat_sources = tf.nest.flatten(target), tf.nest.flatten(sources)
    if (_from_library(module) or not _float_tensors(targets) or not flat_sources
            or not all(_is_variable(s) for s in flat_sources)):
        return original(tape, target, sources, output_gradients, *args, **kwargs)
    what = f"GradientTape.gradient at {site}"

    def unscaled():
        return original(tape, target, sources, None, *args, **kwargs)

    if tape._persistent:  # pylint: disable=protected-access
        taken = getattr(tape, "_tf_mpt_losses", 0)
        tape._tf_mpt_losses = taken + 1  # pylint: disable=protected-access
        if taken:
            _warn_once(("persistent", site), "%s takes a second gradient from a persistent "
                       "GradientTape; gradients after the tape's first run without loss "
                       "scaling (use one tape per loss to scale each).", what)
            return unscaled()
    if tape._recording and not tape._persistent:  # pylint: disable=protected-access
        tape._pop_tape()  # pylint: disable=protected-access  (what gradient() does first)
    from tensorflow.python.eager import record as _record  # pylint: disable=g-import-not-at-top
    if _record.could_possibly_record():
        _warn_once(("second order", site), "%s is taken while another GradientTape records "
                   "(second-order gradients); it runs without loss scaling.", what)
        return unscaled()
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    return _scaled_gradients(
        what, flat_sources, targets, graph,
        lambda seeds: original(tape, target, sources, seeds, *args, **kwargs))


# --- the optimizer side -----------------------------------------------------------------------

def claim(records, loss_scale, variables, optimizer_name):
    """The optimizer owning `loss_scale` applies gradients of `records`: pending scales are
    rewired to it, and `variables` use it from now on."""
    if not records and not installed():
        return
    for record in records:
        if record.claimed and record.scale is not loss_scale:
            _warn_once(("claimed twice", record.site), "the gradients taken by %s are applied "
                       "by two optimizers; their loss scale follows the first, %s.",
                       record.site, optimizer_name)
            continue
        if record.pending is not None and record.scale is None:
            _rewire(record.pending, loss_scale)
            record.scale = loss_scale
        record.claimed = True
    for v in variables:
        if getattr(v, _VARIABLE_SCALE, None) is not _OPTED_OUT:
            setattr(v, _VARIABLE_SCALE, loss_scale)
        if hasattr(v, _AWAITING):
            setattr(v, _AWAITING, None)


def _rewire(pending, loss_scale):
    graph = pending.graph
    context = graph._get_control_flow_context()  # pylint: disable=protected-access
    graph._set_control_flow_context(None)  # pylint: disable=protected-access
    try:
        with graph.as_default(), tf.control_dependencies(None), keep_fp32("tf_mpt_loss_scale"):
            value = loss_scale.scale()
        pending._update_input(0, value)  # pylint: disable=protected-access
    finally:
        graph._set_control_flow_context(context)  # pylint: disable=protected-access


def records_for(grads, variables):
    """The Records the gradients come from: in a graph by walking back from them; eagerly
    from the variables' last gradient computation."""
    tensors = _flat_gradient_tensors(grads)
    if tensors and not tf.executing_eagerly():
        graph = tensors[0].graph
        return _ancestor_records(tensors, graph)
    found = []
    for v in variables:
        record = getattr(v, _AWAITING, None)
        if record is not None and record not in found:
            found.append(record)
    return found


def opt_out(grads, variables):
    """Someone else scales these gradients (Keras's LossScaleOptimizer, apply_scaled_gradients):
    pending scales stay 1 and the variables' gradients are not scaled again."""
    for record in records_for(grads, variables):
        record.claimed = True
    for v in variables:
        setattr(v, _VARIABLE_SCALE, _OPTED_OUT)


def report_unclaimed(graph):
    """One WARNING per gradient computation in `graph` that no optimizer applied."""
    names = _records.get(graph)
    if not names:
        return
    for record in list(names.values()):
        if not record.claimed and not record.reported:
            record.reported = True
            _warn_once(("no optimizer", record.site), "the gradients taken by %s reached no "
                       "optimizer's apply_gradients; they run without loss scaling.",
                       record.site)


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
            scale = _loss_scale.get(_state["loss_scale"])
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
    if not installed() or _passing_through():
        return False, apply(grads, variables)
    if (_keras_loss_scale_optimizer(optimizer)
            or getattr(optimizer, "loss_scale_factor", None) is not None):
        opt_out(grads, variables)  # the script scales its loss itself
        with _Passthrough():
            return False, apply(grads, variables)
    records = records_for(grads, variables)
    if not records:
        with _Passthrough():
            return False, apply(grads, variables)
    if _in_distribution() and (tf.distribute.in_cross_replica_context()
                               or not _can_skip_keras_reduce(optimizer)):
        # no safe step to decide: these variables' gradients run unscaled from now on
        _warn_once(("distribution", type(optimizer).__name__), "%s applies gradients under a "
                   "tf.distribute strategy outside a replica context, or without the "
                   "all-reduce hook tf_mpt needs (a Keras 3 optimizer in strategy.run has "
                   "it); its gradients run without loss scaling.", type(optimizer).__name__)
        opt_out(grads, variables)
        with _Passthrough():
            return False, apply(grads, variables)
    scale = _optimizer_scale(optimizer)
    claim(records, scale, variables, type(optimizer).__name__)
    if _in_distribution():
        _distributed_keras_apply(optimizer, grads, variables, scale, apply)
        return True, None
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]

    def run():
        with _Passthrough():
            return apply(grads, variables)

    return True, _scaling.apply_if_finite(optimizer, pairs, scale, run)


def _distributed_keras_apply(optimizer, grads, variables, scale, apply):
    """Replica context: all-reduce the gradients (in TF_MPT_ALLREDUCE_DTYPE, unconditionally),
    then in the cross-replica context decide once from the reduced gradients (the same on
    every replica), update the scale, and maybe apply them on every replica with the Keras
    optimizer, whose own all-reduce is skipped for that call (they are reduced already)."""
    replica = tf.distribute.get_replica_context()
    dtype = _scaling.resolve_allreduce_dtype(_state["allreduce_dtype"], scale)
    with _Passthrough():
        reduced = _scaling.all_reduce_in(dtype, replica, list(zip(grads, variables)), scale)
    reduced_grads = [g for g, _ in reduced]

    def apply_reduced(*local_grads):
        with _Passthrough():
            apply(list(local_grads), variables)

    def cross_replica(distribution, *reduced_grads):
        firsts = [None if g is None else distribution.experimental_local_results(g)[0]
                  for g in reduced_grads]
        _scaling.create_slots(optimizer, variables)  # outside the conditional
        update_scale, should_apply = scale.update_from_finite(
            _loss_scale.all_finite(firsts))

        def run():
            with _reduced_already(optimizer):
                distribution.extended.call_for_each_replica(apply_reduced, args=reduced_grads)
            return tf.constant(True)

        with tf.control_dependencies([update_scale]):
            return tf.cond(should_apply, run, lambda: tf.constant(False))

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


def passthrough():
    """Context manager: gradients and applies inside are not scaled automatically."""
    return _Passthrough()
