"""What `tf-mpt inspect` shows: the per-op table, FLOP share, TensorBoard graph, numerics.

Numerics: sample inputs run through the float32 model; for every float32 tensor the largest
magnitude and the smallest nonzero magnitude are compared with the half type's range:

* overflow: |x| above the largest finite half value (float16 65504) becomes inf;
* underflow: 0 < |x| below half the smallest subnormal (float16 2**-25) becomes 0;
* subnormal: |x| below the smallest normal (float16 2**-14) keeps fewer significant bits.

bfloat16 has float32's exponent range, so it overflows and underflows where float32 does.
Tensors are listed in graph order, so the first overflow is the first row marked so.
"""

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from tf_mpt.costs import flops as _flops
from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.rewrite import type_attrs as ta

# (largest finite, smallest normal, smallest subnormal) per half type.
HALF_RANGES = {
    "float16": (65504.0, 2.0 ** -14, 2.0 ** -24),
    "bfloat16": (3.3895313892515355e38, 2.0 ** -126, 2.0 ** -133),
}
COLOURS = ("allow", "deny", "fp32", "none")
COLOUR_ATTR = "_tf_mpt_colour"
REASON_ATTR = "_tf_mpt_reason"


def op_table(report):
    """Lines: per op type, nodes per colour and the most common reason for not half."""
    table = collections.defaultdict(collections.Counter)
    reasons = collections.defaultdict(collections.Counter)
    for decision in report.decisions.values():
        table[decision.op][decision.colour] += 1
        if decision.colour != "allow":
            reasons[decision.op][decision.reason] += 1
    lines = [f"{'op':32} " + " ".join(f"{c:>6}" for c in COLOURS) + "  why not half (most common)"]
    for op in sorted(table, key=lambda o: (-table[o]["allow"], o)):
        why = reasons[op].most_common(1)[0][0] if reasons[op] else ""
        lines.append(f"{op:32} " + " ".join(f"{table[op][c]:6d}" for c in COLOURS) + f"  {why}")
    return lines


def _with_known_batch(graph_def):
    """A copy whose Placeholders have their unknown dimensions set to 1 (for static shapes)."""
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.op == "Placeholder" and "shape" in node.attr:
            for dim in node.attr["shape"].shape.dim:
                if dim.size < 0:
                    dim.size = 1
    return out


def _import(graph_def):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return graph


def flop_share(converted_frozen_graph_def, dtype):
    """(share of MatMul/Conv FLOPs in half or None, ops with unknown shapes) of a converted
    model's frozen graph: counted on the ops as the conversion wrote them (each op's T), with
    unknown dimensions 1, so the share is that of the decisions `convert` makes."""
    graph_def = _with_known_batch(converted_frozen_graph_def)
    return _flops.half_flop_share(_import(graph_def), dtype)


def half_node_names(converted_frozen_graph_def, dtype):
    """Names of the nodes of a converted model's frozen graph (`model.frozen(conversion)`)
    that run in `dtype`: a type attr, or an entry of a type-list attr, is `dtype` (the
    decisions `convert` writes, read off the graph it writes)."""
    half = {tf.as_dtype(dtype).as_datatype_enum}
    return {node.name for node in converted_frozen_graph_def.node
            if ta.computes_in(node, half)}


def annotated(graph_def, report):
    """A copy of a converted GraphDef whose nodes carry their colour and reason as attrs."""
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)

    def annotate(nodes, function):
        for node in nodes:
            key = node.name if function is None else f"{function}/{node.name}"
            decision = report.decisions.get(key)
            if decision is None:  # a Cast the rewrite added
                colour, reason = "cast", "added by tf_mpt"
            else:
                colour, reason = decision.colour, decision.reason
            node.attr[COLOUR_ATTR].s = colour.encode()
            node.attr[REASON_ATTR].s = reason.encode()

    annotate(out.node, None)
    for fdef in out.library.function:
        annotate(fdef.node_def, fdef.signature.name)
    return out


def write_tensorboard(logdir, graphs):
    """Writes {label: annotated GraphDef} to `logdir`, one run (subdirectory) per label."""
    import os  # pylint: disable=g-import-not-at-top
    for label, graph_def in graphs.items():
        writer = tf.summary.create_file_writer(os.path.join(logdir, label))
        with writer.as_default():
            tf.summary.graph(graph_def)
        writer.flush()
        writer.close()


@dataclasses.dataclass
class TensorRange:
    name: str
    op: str
    half: bool            # the conversion runs this tensor in half precision
    elements: int = 0
    max_abs: float = 0.0
    min_nonzero: float = float("inf")
    overflow: int = 0
    underflow: int = 0
    subnormal: int = 0
    nonfinite: int = 0    # already inf/NaN in float32


def _in_control_flow(graph_def):
    """Nodes downstream of a v1 Switch or Enter: possibly dead or in a loop frame, so not
    fetchable by Session.run; they are not inspected."""
    readers = collections.defaultdict(list)
    for node in graph_def.node:
        for text in node.input:
            readers[_graph_view.parse_input(text)[0]].append(node.name)
    stack = [n.name for n in graph_def.node if n.op in ("Switch", "RefSwitch", "Enter",
                                                         "RefEnter")]
    seen = set(stack)
    while stack:
        for reader in readers[stack.pop()]:
            if reader not in seen:
                seen.add(reader)
                stack.append(reader)
    return seen


def numerics(frozen_graph_def, feeds, dtype, half_nodes):
    """[TensorRange] of the float32 tensors, in graph order, and the number not inspected.

    feeds: [{placeholder name: array}] (one Session.run each); half_nodes: node names the
    conversion runs in half.
    """
    largest, normal, subnormal = HALF_RANGES[dtype]
    graph = _import(frozen_graph_def)
    skip = _in_control_flow(frozen_graph_def)
    fed = {name for feed in feeds for name in feed}
    tensors, skipped = [], 0
    for op in graph.get_operations():
        for tensor in op.outputs:
            if tensor.dtype != tf.float32:
                continue
            if op.name in skip or op.name in fed:
                skipped += op.name in skip
                continue
            tensors.append(tensor)
    ranges = [TensorRange(t.name, t.op.type, t.op.name in half_nodes) for t in tensors]
    with tf.compat.v1.Session(graph=graph) as session:
        for feed in feeds:
            values = session.run(tensors, {f"{k}:0": v for k, v in feed.items()})
            for entry, value in zip(ranges, values):
                magnitude = np.abs(np.asarray(value, np.float64)).ravel()
                finite = magnitude[np.isfinite(magnitude)]
                entry.elements += magnitude.size
                entry.nonfinite += magnitude.size - finite.size
                if finite.size:
                    entry.max_abs = max(entry.max_abs, float(finite.max()))
                nonzero = finite[finite > 0]
                if nonzero.size:
                    entry.min_nonzero = min(entry.min_nonzero, float(nonzero.min()))
                entry.overflow += int(np.count_nonzero(finite > largest))
                entry.underflow += int(np.count_nonzero((finite > 0) & (finite < subnormal / 2)))
                entry.subnormal += int(np.count_nonzero((finite >= subnormal / 2)
                                                        & (finite < normal)))
    return ranges, skipped


def numerics_lines(ranges, skipped, dtype, samples):
    largest, normal, subnormal = HALF_RANGES[dtype]
    lines = [f"{len(ranges)} float32 tensor(s) on {samples} sample(s); {dtype}: largest "
             f"{largest:.6g}, smallest normal {normal:.3g}, smallest subnormal {subnormal:.3g}"]
    if skipped:
        lines.append(f"({skipped} tensor(s) inside v1 loops or conds not inspected)")
    flagged = [r for r in ranges if r.overflow or r.underflow or r.nonfinite]
    first = next((r for r in ranges if r.overflow), None)
    if first is None:
        lines.append(f"no tensor overflows {dtype}.")
    else:
        where = "runs in half" if first.half else "stays float32 after conversion"
        lines.append(f"first overflow: {first.name} ({first.op}, {where}): max |x| = "
                     f"{first.max_abs:.4g} > {largest:.6g} in {first.overflow} of "
                     f"{first.elements} elements")
    if flagged:
        lines.append(f"{'tensor':44} {'op':16} {'half':>4} {'max |x|':>10} {'min |x|>0':>10} "
                     f"{'overflow':>9} {'to zero':>9} {'subnormal':>9}")
        for r in flagged:
            min_nonzero = r.min_nonzero if r.min_nonzero != float("inf") else 0.0
            lines.append(f"{r.name:44} {r.op:16} {'yes' if r.half else 'no':>4} "
                         f"{r.max_abs:10.3g} {min_nonzero:10.3g} {r.overflow:9d} "
                         f"{r.underflow:9d} {r.subnormal:9d}")
    return lines


REDUCTION_OPS = ("CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
                 "NcclAllReduce", "AddN")


def reduction_ops(graph_def):
    """Sorted distinct [op type, dtype] of the ops that can sum values across replicas
    (collectives, NCCL, AddN) in a GraphDef and its function library: which dtype a
    distributed training step all-reduces its gradients in."""
    nodes = list(_function_bodies.all_nodes(graph_def))
    return sorted({(n.op, tf.as_dtype(n.attr["T"].type).name) for n in nodes
                   if n.op in REDUCTION_OPS and "T" in n.attr})
