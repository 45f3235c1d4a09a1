"""A variable's update runs in the variable's dtype: the element-wise arithmetic whose values
flow only into writes of float32 variables keeps float32 (an analysis for phase 0's skip
reasons; no graph edits).

An optimizer's update (Adam's `m += (g - m) * (1 - beta_1)`, momentum, weight decay, a
batch norm's moving averages) adds small steps to float32 values. Painted half where the
gradient arrives half (an infer op follows an allow op), the step is rounded to 8 bits of
mantissa before it is added, and Adam's `g * g` loses what loss scaling saved. Keras's mixed
policy computes the update in float32; so does tf_mpt: the half gradient is cast once, where
it leaves the matrix product that made it.

Only element-wise ops are kept: a reduction or a contraction that makes a gradient from
activations (BiasAddGrad, Sum, MatMul) is left to the paint, so the Cast sits on the
weight-sized gradient, never on an activation.
"""

from tf_mpt import report as _report
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.rewrite import type_attrs as ta

# Writes of a variable: the ports typed by the attr named here carry the written values.
_WRITE_DTYPE_ATTR = {
    "Assign": "T", "AssignAdd": "T", "AssignSub": "T",
    "AssignVariableOp": "dtype", "AssignAddVariableOp": "dtype", "AssignSubVariableOp": "dtype",
    "ResourceScatterAdd": "dtype", "ResourceScatterDiv": "dtype", "ResourceScatterMax": "dtype",
    "ResourceScatterMin": "dtype", "ResourceScatterMul": "dtype", "ResourceScatterSub": "dtype",
    "ResourceScatterUpdate": "dtype",
    "ResourceScatterNdAdd": "T", "ResourceScatterNdSub": "T", "ResourceScatterNdUpdate": "T",
    "ScatterAdd": "T", "ScatterDiv": "T", "ScatterMax": "T", "ScatterMin": "T",
    "ScatterMul": "T", "ScatterSub": "T", "ScatterUpdate": "T",
    "ScatterNdAdd": "T", "ScatterNdSub": "T", "ScatterNdUpdate": "T",
}
# The fused optimizer kernels (ResourceApplyAdam, SparseApplyMomentum, ...): every port typed
# by T is a value the update reads.
_APPLY_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")

# The element-wise ops optimizers and moving averages compute an update with. An op not here
# ends the walk upstream: it is left to the paint.
UPDATE_ARITHMETIC_OPS = frozenset({
    # arithmetic
    "Abs", "Add", "AddN", "AddV2", "Div", "DivNoNan", "Exp", "Log", "Maximum", "Minimum",
    "Mul", "MulNoNan", "Neg", "Pow", "RealDiv", "Reciprocal", "Rsqrt", "Sign", "Sqrt",
    "Square", "SquaredDifference", "Sub", "Tanh",
    # selection and clipping (a loss scale's "skip the step" where, clip_by_value)
    "ClipByValue", "Select", "SelectV2",
    # pass-through
    "Cast", "Identity", "IdentityN", "Snapshot",
    # constants the update reads (beta_1, epsilon, 1 - beta_1): Const stays float32 too
    "Const", "Fill", "ZerosLike", "OnesLike",
})


def _write_value_ports(node, nt, view):
    """The input ports of `node` that carry values written into a float32 variable, or ().
    A TF1 variable's initializer is not an update: its arithmetic is float32 anyway (nothing
    half reaches it)."""
    if _graph_view.initialized_variable(node, view.op_of) is not None:
        return ()
    if node.op in _WRITE_DTYPE_ATTR:
        attr = _WRITE_DTYPE_ATTR[node.op]
    elif node.op.startswith(_APPLY_PREFIXES):
        attr = "T"
    else:
        return ()
    if nt.dtypes.get(attr) != ta.DT_FLOAT:
        return ()
    return tuple(port for port, key in enumerate(nt.in_keys) if key == attr)


def variable_update_reasons(view, types, allow=frozenset()):
    """{node index: reason} for each element-wise node whose every data consumer is a write of
    a float32 variable's value, or a node of this set: it keeps float32. An op of `allow` (the
    allow list: an op a user put there, TF_MPT_ALLOWLIST_ADD=Mul, asked for half wherever it
    is) is not kept, and the walk does not pass it.

    (g: a half weight gradient; m: a float32 slot)
        [g] -> Sub(g, m) -> Mul(., 1 - beta_1) -> AssignAddVariableOp(m)
    keeps Sub and Mul float32; the rewrite casts g to float32 once, before Sub.
    """
    nodes = view.nodes
    pending = [sum(len(edges) for edges in view.fanout_of(i).values())
               for i in range(len(nodes))]
    work = []  # (producer index, the name of a write its value reaches), one per edge
    for i, (node, nt) in enumerate(zip(nodes, types)):
        if not nt.known or nt.is_function:
            continue
        fanin = view.fanin[i]
        for port in _write_value_ports(node, nt, view):
            if port < len(fanin):  # (a malformed node is the type index's to report)
                work.append((fanin[port][0], node.name))
    reasons = {}
    while work:
        i, write = work.pop()
        pending[i] -= 1  # reaches 0 once: when the last of its consumer edges is popped
        if pending[i] or nodes[i].op in allow or \
                not _is_update_arithmetic(nodes[i], types[i]):
            continue
        reasons[i] = (f"{_report.UPDATE_REASON}: its values flow only into {write!r} "
                      "(the update runs in the variable's dtype)")
        for src, _ in view.fanin[i]:
            work.append((src, write))
    return reasons


def _is_update_arithmetic(node, nt):
    return (nt.known and not nt.is_function and node.op in UPDATE_ARITHMETIC_OPS
            and ta.DT_FLOAT in nt.dtypes.values())
