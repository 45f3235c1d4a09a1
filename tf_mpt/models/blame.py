"""One-pass blame: the converted nodes whose own half-precision error breaks a model, found
from one run of the float32 model and one of the converted model, every float tensor of
both fetched by name (`tf-mpt convert --auto-deny`, `tf-mpt inspect --numerics --blame`).

Error of a tensor, over the samples (as --validate measures an output):

    error(t) = ||converted(t) - float32(t)||_2 / ||float32(t)||_2    (inf where the converted
                                                                       value is inf or NaN and
                                                                       float32's is finite)

A node's error comes from its inputs' (propagated) or from itself (its half kernel, or the
Cast to half of an input: an overflow, a lost small value). A converted node is blamed when
its error jumps beyond what its inputs' explains:

    error(n) > FLOOR[dtype]  and  error(n) > JUMP * max(error(inputs), ROUNDOFF[dtype])

so the first divergence on each path is blamed, not every node after it. Values outside the
half type's range cannot cross it in either direction: a converted node that writes or reads
a tensor whose float32 values exceed the largest half value (float16 65504: an activation of
1e5, an attention mask of -1e9) is blamed too, so the whole stretch stays float32 until the
values are back in range (keeping only the first node float32 would move the overflow into
the Cast before its reader). A blamed node with no float inputs (a constant stored in half)
has its converted readers blamed with it (they then read it in float32).
"""

import dataclasses
import math

import numpy as np
import tensorflow as tf

from tf_mpt.models import inspection as _inspection
from tf_mpt.rewrite import graph_view as _graph_view

# Unit roundoff of the half types: an input error below it is rounding, not a cause.
ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# A node's error must pass this to be blamed (about 20 units of roundoff: --validate's
# default bound is of this order) ...
FLOOR = {"float16": 1e-2, "bfloat16": 8e-2}
# ... and be this many times what its inputs bring.
JUMP = 8.0


@dataclasses.dataclass
class NodeError:
    """One node's error, the largest over its float outputs, and its inputs'."""
    label: str
    name: str          # the node's name in the frozen graph
    op: str
    error: float
    input_error: float
    half: bool         # the conversion runs it in half
    out_of_range: bool = False  # it reads or writes values beyond the half type's largest

    def jumps(self, dtype):
        """Its own error jumps beyond what its inputs' explains."""
        return self.error > FLOOR[dtype] and \
            self.error > JUMP * max(self.input_error, ROUNDOFF[dtype])

    def blamed(self, dtype):
        return self.half and (self.out_of_range or self.jumps(dtype))


def _relative_error(sum_sq_diff, sum_sq_ref):
    if sum_sq_diff == 0.0:
        return 0.0
    if not math.isfinite(sum_sq_diff):
        return math.inf
    return math.sqrt(sum_sq_diff / sum_sq_ref) if sum_sq_ref else math.sqrt(sum_sq_diff)


def _fetchable(reference, graph, view, converted, only=None):
    """Names of the tensors to compare: float32 outputs of the float32 graph (`reference`,
    imported as `graph`, indexed as `view`) whose node is in the converted graph too and
    outside v1 control flow (Session.run cannot fetch those); with `only` (node names), of
    those nodes and the nodes they read alone."""
    names = {node.name for node in converted.node}
    if only is not None:
        wanted = set(only) | {view.nodes[src].name for name in only if name in view.index
                              for src, _ in view.fanin[view.index[name]]}
        names &= wanted
    skip = _inspection._in_control_flow(reference)  # pylint: disable=protected-access
    return [t.name for op in graph.get_operations() if op.name in names and op.name not in skip
            and op.type not in ("Placeholder",) for t in op.outputs if t.dtype == tf.float32]


def _run(graph, tensors, feeds):
    """[[array per tensor] per sample] of `tensors` (names) of `graph` (a tf.Graph) over
    `feeds` ({placeholder: array} per sample), as float64."""
    targets = [graph.get_tensor_by_name(name) for name in tensors]
    out = []
    with tf.compat.v1.Session(graph=graph) as session:
        for feed in feeds:
            values = session.run(targets, {f"{k}:0": v for k, v in feed.items()})
            out.append([np.asarray(v, np.float64) for v in values])
    return out


def node_errors(reference, converted, feeds, dtype, label="graph", only=None):
    """{node name: NodeError} of the nodes of a frozen float32 graph and its conversion's
    frozen graph (same node names), over `feeds`; `only`: of these nodes (names) alone."""
    graph = _inspection._import(reference)  # pylint: disable=protected-access
    view = _graph_view.GraphView(reference)
    tensors = _fetchable(reference, graph, view, converted, only)
    if not tensors:
        return {}
    expected = _run(graph, tensors, feeds)
    converted_graph = _inspection._import(converted)  # pylint: disable=protected-access
    actual = _run(converted_graph, tensors, feeds)
    sums = {name: [0.0, 0.0] for name in tensors}
    largest = {name: 0.0 for name in tensors}  # of the float32 values
    for sample_expected, sample_actual in zip(expected, actual):
        for name, want, got in zip(tensors, sample_expected, sample_actual):
            finite = np.isfinite(want)
            if finite.any():
                largest[name] = max(largest[name], float(np.abs(want[finite]).max()))
            if want.shape != got.shape:
                sums[name][0] = math.inf
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                diff = np.where(finite, got - want, 0.0)
                sums[name][0] += float(np.sum(np.square(diff))) if np.isfinite(
                    got[finite]).all() else math.inf
                sums[name][1] += float(np.sum(np.square(want[finite])))
    tensor_error = {name: _relative_error(*sums[name]) for name in tensors}
    half = _inspection.half_node_names(converted, dtype)
    by_node, outputs_of = {}, {}
    for name, error in tensor_error.items():
        node = name.rsplit(":", 1)[0]
        by_node[node] = max(by_node.get(node, 0.0), error)
        outputs_of.setdefault(node, []).append(name)
    limit = _inspection.HALF_RANGES[dtype][0]
    out = {}
    for node_name, error in by_node.items():
        if only is not None and node_name not in only:
            continue
        i = view.index[node_name]
        inputs = [f"{view.nodes[src].name}:{port}" for src, port in view.fanin[i]]
        outputs = outputs_of[node_name]
        input_error = max((tensor_error.get(t, 0.0) for t in inputs), default=0.0)
        beyond = any(largest.get(t, 0.0) > limit for t in inputs + outputs)
        out[node_name] = NodeError(label, node_name, view.nodes[i].op, error, input_error,
                                   node_name in half, beyond)
    return out


def blame(errors, dtype, reference):
    """The blamed NodeErrors of `errors` (node_errors), in graph order: each converted node
    whose own error jumps or that reads or writes values beyond the half range, and the
    converted readers of a blamed node with no float inputs."""
    view = _graph_view.GraphView(reference)
    blamed = {name for name, e in errors.items() if e.blamed(dtype)}
    for name in list(blamed):
        i = view.index[name]
        if any(view.nodes[src].name in errors for src, _ in view.fanin[i]):
            continue  # it reads float values: keeping it float32 is the fix
        for reader in view.readers(i):
            reader_name = view.nodes[reader].name
            if reader_name in errors and errors[reader_name].half:
                blamed.add(reader_name)
    order = {node.name: k for k, node in enumerate(reference.node)}
    return [errors[name] for name in sorted(blamed, key=order.get)]


def decision_keys(frozen_name, converted_nodes):
    """The (function or None, node name) keys of `converted_nodes` (a Conversion's, for one
    label) that a frozen graph's node `frozen_name` comes from: the same name, or, in a
    SavedModel's frozen graph (calls inlined: `<call>/<name>`), the longest name it ends with."""
    matches = [(function, name) for function, name in converted_nodes
               if frozen_name == name or frozen_name.endswith("/" + name)]
    if not matches:
        return []
    longest = max(len(name) for _, name in matches)
    return [(function, name) for function, name in matches if len(name) == longest]


def find(model, conversion, dtype, feeds, reference=None):
    """[(NodeError, [(function or None, node name) keys to keep float32])] of the nodes
    blamed for `conversion` of `model` over `feeds` (validation samples: [{label: {input:
    array}}]), in graph order per signature: one run of each frozen model. `reference`:
    model.frozen(), when the caller has it."""
    reference = reference or model.frozen()
    converted = model.frozen(conversion)
    nodes = [(function, name) for _, function, name in conversion.converted_nodes]
    out = []
    for label, (graph_def, placeholders) in reference.items():
        if label not in converted:
            continue
        label_feeds = [{placeholders[k]: v for k, v in sample[label].items()}
                       for sample in feeds]
        errors = node_errors(graph_def, converted[label][0], label_feeds, dtype, label)
        out.extend((e, decision_keys(e.name, nodes)) for e in blame(errors, dtype, graph_def))
    return out


def errors_of(model, conversion, dtype, feeds, names, reference=None):
    """{(label, frozen node name): error} of the nodes `names` ((label, name) pairs) in
    `conversion`: what a blamed node's error became once it was kept float32 (only they and
    their inputs are fetched). `reference`: model.frozen(), when the caller has it."""
    reference = reference or model.frozen()
    converted = model.frozen(conversion)
    out = {}
    for label, (graph_def, placeholders) in reference.items():
        wanted = {name for lab, name in names if lab == label}
        if not wanted or label not in converted:
            continue
        label_feeds = [{placeholders[k]: v for k, v in sample[label].items()}
                       for sample in feeds]
        errors = node_errors(graph_def, converted[label][0], label_feeds, dtype, label,
                             only=wanted)
        out.update({(label, n): errors[n].error for n in wanted if n in errors})
    return out
