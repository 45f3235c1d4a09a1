"""When the choosing step runs: for which graphs and traced steps it times candidates.

    applies       a graph goes through decision.decide: decided for this CPU (`here`) with a
                  budget, or a cost table file that holds verdicts
    step_reason   why a traced tf.function is timed on copies of its variables
                  (TF_MPT_STEP_TIMING: auto, always, off), or None
    timing_reason the prediction's own grounds: a saving too thin to trust (`thin`), one made
                  of element-wise kernels probed alone (`elementwise_share`)

The thresholds are the Policy's (policy.py); nothing here measures.
"""

from tf_mpt import targets as _targets
from tf_mpt.choose import cache as _verdicts
from tf_mpt.choose import policy as _policy


# the name scopes gradients are built in (tf.GradientTape's, tf.gradients' and a TF1
# optimizer's): a function with such a node computes gradients
_GRADIENT_SCOPES = ("gradient_tape", "gradients")


def worth_timing(report, target, mode, policy=None):
    """Whether a function rewritten with `report` for `target` (a resolved
    tf_mpt.targets.Target) is timed under TF_MPT_STEP_TIMING=`mode` (timing_reason)."""
    policy = policy or _policy.DEFAULT
    return timing_reason(report, target, mode, policy) is not None


def timing_reason(report, target, mode, policy=None):
    """Why a function rewritten with `report` for `target` is timed under
    TF_MPT_STEP_TIMING=`mode`, or None: never with 'off', nor where the decisions were not
    made for this CPU (target.for_this_cpu: not for `rules` or a cost table of another
    machine), nor where nothing was converted; with 'always' otherwise; with 'auto' where
    the predicted saving is below `thin` of the kernel and Cast times it adds up, or where
    half kernels other than contractions make over `elementwise_share` of it
    (report.predicted_elementwise: probed alone, not timed at the node's shapes)."""
    policy = policy or _policy.DEFAULT
    if (mode == "off" or report is None or not report.converted_nodes
            or not target.for_this_cpu):
        return None
    if mode == "always":
        return "TF_MPT_STEP_TIMING=always"
    saving, changed = report.predicted_saving, report.predicted_changed
    if saving < policy.thin * changed:
        return (f"its predicted saving, {saving * 1e3:.3g} ms per run, is under "
                f"{policy.thin:.0%} of the {changed * 1e3:.3g} ms of kernel and Cast times it "
                "adds up")
    if report.predicted_elementwise > policy.elementwise_share * saving:
        return (f"{report.predicted_elementwise * 1e3:.3g} ms of its predicted saving of "
                f"{saving * 1e3:.3g} ms per run (over {policy.elementwise_share:.0%}) is half "
                "kernels other than matrix products and convolutions, each probed alone, not at "
                "the graph's shapes")
    return None


def holds_float32_for_gradients(report, policy=None):
    """Whether a function rewritten with `report` computes gradients (a node in a gradient
    name scope: _GRADIENT_SCOPES) and the cost model kept float32 at least `kept_share` of the
    nodes it weighed: a training step whose forward values the backward pass reads may be
    held in float32, where the op lists' colouring (or a lean version) could hold them in
    half at nearly the same speed; TF_MPT_STEP_TIMING=auto times it where the peak is
    bounded (when.step_applies)."""
    policy = policy or _policy.DEFAULT
    if report is None or not report.weighed_nodes or not report.weighed_nodes[0]:
        return False
    if report.kept_by_cost_model < policy.kept_share * report.weighed_nodes[0]:
        return False
    return computes_gradients(report)


def computes_gradients(report):
    """Whether a node of `report` is in a gradient name scope (_GRADIENT_SCOPES)."""
    return any(part.startswith(_GRADIENT_SCOPES)
               for name in report.decisions for part in name.split("/"))


def holds_half_loop_buffers_for_gradients(report):
    """The number of a loop's buffers (TensorLists, loop variables) a function rewritten with
    `report` keeps in half, where it computes gradients (_GRADIENT_SCOPES), else 0: the
    backward pass of a loop reads what its forward iterations accumulate, and a half value
    accumulated beside the float32 one it was cast from is held once per iteration (a Keras
    LSTM's fit step, untimed, held 2.14x float32's peak tensors on Sapphire Rapids);
    TF_MPT_STEP_TIMING=auto times it where the peak is bounded (when.step_applies)."""
    if report is None:
        return 0
    buffers = report.tensor_lists_kept_half + report.loop_variables_kept_half
    return buffers if buffers and computes_gradients(report) else 0


def timed_here(config, target):
    """Whether a rewrite for the resolved `target` times its candidates: only where its
    decisions are for this CPU as measured (`here`) and the budget is not 0."""
    return config.timing_budget > 0 and target.kind == _targets.HERE


def applies(config, target, dtype):
    """Whether a rewrite for the resolved `target` goes through `decide`: for this CPU
    (`here`) with a budget; for a cost table file that holds verdicts (`tf-mpt measure
    --model`), or while such a table is being measured."""
    if timed_here(config, target):
        return True
    return target.kind == "table" and target.table is not None and (
        _verdicts.measuring_for_a_table() or bool(_verdicts.in_table(target.table, dtype)))


def step_applies(config, target, report):
    """Whether a traced tf.function rewritten with `report` for the resolved `target` has
    its candidates timed (on copies of its variables): step_reason says why."""
    return step_reason(config, target, report) is not None


def step_reason(config, target, report, compiled=False):
    """Why a traced tf.function rewritten with `report` for the resolved `target` has its
    candidates timed, or None: where step timing would time it
    (when.timing_reason: decided for this CPU, TF_MPT_STEP_TIMING; with
    TF_MPT_MEMORY=least, auto acts as always: what a step holds is not predicted; with
    float32, the default, auto acts as always for a step computing gradients where the cost
    model kept a share of its nodes float32, when.holds_float32_for_gradients, or
    through a loop whose buffers it keeps half, holds_half_loop_buffers_for_gradients; with
    TF_MPT_MEMORY_PRICE, for every step computing gradients; `compiled`, a step XLA compiles:
    always, the cost model's kernel times being TensorFlow's kernels', not XLA's) and the
    budget is not 0."""
    policy = _policy.Policy.from_config(config)
    if policy.budget <= 0:
        return None
    mode = policy.step_timing
    reason = timing_reason(report, target, mode, policy)
    if reason is not None or mode != "auto" or \
            timing_reason(report, target, "always", policy) is None:
        return reason
    if compiled:
        return ("XLA compiles it (jit_compile): the cost model adds up TensorFlow's kernels, "
                "not what XLA makes of the step (on a CPU it computes half contractions in "
                "float32 between converts)")
    if policy.least:
        return "TF_MPT_MEMORY=least: what each candidate holds is measured, not predicted"
    if prices_float32(policy, report):
        return (f"it computes gradients and TF_MPT_MEMORY_PRICE={policy.memory_price:g}: what "
                "it holds for the backward pass is measured, not predicted")
    if policy.memory == "float32" and holds_float32_for_gradients(report, policy):
        return (f"it computes gradients and the cost model kept {report.kept_by_cost_model} "
                f"of the {report.weighed_nodes[0]} nodes it weighed float32: what it holds "
                "for the backward pass is measured, not predicted")
    buffers = holds_half_loop_buffers_for_gradients(report) \
        if policy.memory == "float32" else 0
    if buffers:
        return (f"it computes gradients through a loop with {buffers} buffer(s) (TensorLists, "
                "loop variables) kept half: what its iterations hold for the backward pass "
                "is measured, not predicted")
    return None


def prices_float32(policy, report):
    """Whether float32's own lean version is tried for memory (TF_MPT_MEMORY_PRICE set) in a
    graph rewritten with `report` under `policy` (a Policy): where it computes gradients
    (computes_gradients), since a lean version holds in half what a backward pass reads late
    (an inference step's float32 graph has next to nothing to save, and its timing would
    spend the budget for nothing: a Keras evaluate step's did)."""
    return bool(policy.price) and computes_gradients(report)
