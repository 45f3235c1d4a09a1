"""The registry of gradient computations the automatic path scaled, and which optimizer owns
each one's loss scale (tf_mpt.automatic.gradients takes them, tf_mpt.automatic.optimizers and
the explicit LossScaleOptimizer claim them).

Loss scaling wherever a script takes gradients, with no code edits (the automatic path).

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


import tensorflow as tf

from tf_mpt._opt_out import keep_fp32
from tf_mpt._process.state import STATE, warn_once
from tf_mpt.training import loss_scale as _loss_scale

OPTED_OUT = "opted out"  # a variable whose gradients are scaled by someone else
_VARIABLE_SCALE = "_tf_mpt_loss_scale"  # attribute on a variable: its optimizer's scale
AWAITING = "_tf_mpt_awaiting"  # attribute on a variable: its last eager Record


def install(loss_scale, allreduce_dtype="float32"):
    """Turns automatic scaling on with `loss_scale` ('dynamic' or a number) for optimizers
    that have none yet and gradients all-reduced in `allreduce_dtype` under tf.distribute
    (the patches themselves are made by tf_mpt.automatic)."""
    STATE.default_loss_scale = loss_scale
    STATE.allreduce_dtype = allreduce_dtype


def uninstall():
    STATE.default_loss_scale = None


def installed():
    return STATE.default_loss_scale is not None


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


def in_distribution():
    """True inside a non-default tf.distribute strategy's scope."""
    return tf.distribute.has_strategy()


def graph_records(graph):
    records = STATE.gradient_records.get(graph)
    if records is None:
        records = STATE.gradient_records[graph] = {}
    return records


def scale_of(variables):
    """The one LossScale the variables' optimizer owns, None if none has claimed them,
    OPTED_OUT if any is scaled by someone else, or a tuple if two optimizers claimed them.

    Variables no optimizer has claimed yet do not disagree with the others: a variable whose
    gradient is None (unused by the loss, then filtered out by the script) never reaches an
    optimizer, and the rest of the loss's variables keep their optimizer's scale."""
    found = {id(getattr(v, _VARIABLE_SCALE, None)): getattr(v, _VARIABLE_SCALE, None)
             for v in variables}
    values = list(found.values())
    if any(v is OPTED_OUT for v in values):
        return OPTED_OUT
    claimed = [v for v in values if v is not None]
    if len(claimed) <= 1:
        return claimed[0] if claimed else None
    return tuple(claimed)


def ancestor_records(tensors, graph):
    """The Records whose unscaled gradients `tensors` are computed from (data edges only;
    the walk stops at each unscaling op)."""
    names = STATE.gradient_records.get(graph)
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


# --- the optimizer side -----------------------------------------------------------------------

def claim(records, loss_scale, variables, optimizer_name):
    """The optimizer owning `loss_scale` applies gradients of `records`: pending scales are
    rewired to it, and `variables` use it from now on."""
    if not records and not installed():
        return
    for record in records:
        if record.claimed and record.scale is not loss_scale:
            warn_once(("claimed twice", record.site), "the gradients taken by %s are applied "
                      "by two optimizers; their loss scale follows the first, %s.",
                      record.site, optimizer_name)
            continue
        if record.pending is not None and record.scale is None:
            _rewire(record.pending, loss_scale)
            record.scale = loss_scale
        record.claimed = True
    for v in variables:
        if getattr(v, _VARIABLE_SCALE, None) is not OPTED_OUT:
            setattr(v, _VARIABLE_SCALE, loss_scale)
        if hasattr(v, AWAITING):
            setattr(v, AWAITING, None)


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
    tensors = [t for t in _loss_scale.gradient_tensors(grads, indices=True)
               if isinstance(t, tf.Tensor)]
    if tensors and not tf.executing_eagerly():
        graph = tensors[0].graph
        return ancestor_records(tensors, graph)
    found = []
    for v in variables:
        record = getattr(v, AWAITING, None)
        if record is not None and record not in found:
            found.append(record)
    return found


def opt_out(grads, variables):
    """Someone else scales these gradients (Keras's LossScaleOptimizer, apply_scaled_gradients):
    pending scales stay 1 and the variables' gradients are not scaled again."""
    for record in records_for(grads, variables):
        record.claimed = True
    for v in variables:
        setattr(v, _VARIABLE_SCALE, OPTED_OUT)


def report_unclaimed(graph):
    """One WARNING per gradient computation in `graph` that no optimizer applied."""
    names = STATE.gradient_records.get(graph)
    if not names:
        return
    for record in list(names.values()):
        if not record.claimed and not record.reported:
            record.reported = True
            warn_once(("no optimizer", record.site), "the gradients taken by %s reached no "
                      "optimizer's apply_gradients; they run without loss scaling.",
                      record.site)
