"""Saved in half: a float32 value a late reader keeps alive held as a half copy, each late
reader reading a Cast of it to float32."""

import collections

from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import types_pb2

from tf_mpt.choose.transforms import graph_order as _graph_order
from tf_mpt.choose import policy as _policy
from tf_mpt.choose.transforms import late_casts as _late_casts
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import type_attrs as _ta
from tf_mpt.rewrite.graph_view import GraphView
from tf_mpt.rewrite.paint import shapes as _shapes


_HALF_LISTS = ("allow", "infer", "clear")


def _half_type(view):
    """The half type of the candidate's Casts (the most common), or None."""
    found = collections.Counter(
        node.attr["DstT"].type for node in view.nodes
        if _casts.is_ours(node) and node.attr["SrcT"].type == types_pb2.DT_FLOAT and
        node.attr["DstT"].type in _ta.HALF_TYPES)
    return found.most_common(1)[0][0] if found else None


def _output_type(node, port):
    try:
        types = _ta.node_types(node, {})
    except Exception:  # pylint: disable=broad-except
        return None  # (an op this TensorFlow does not know: its outputs are not guessed)
    if not types.known or port >= len(types.out_keys) or types.out_keys[port] is None:
        return None
    return types.dtypes.get(types.out_keys[port])


def _deepest_other(view, reader, value, level):
    """The deepest input (data or control) of `reader` besides node `value`, as a node, that
    may be waited on (late_casts.may_wait_on), or None."""
    best = None
    for src in [s for s, _ in view.fanin[reader]] + list(view.control_fanin[reader]):
        if src == value or not _late_casts.may_wait_on(view, src):
            continue
        if best is None or level[src] > level[best]:
            best = src
    return best


def saved_in_half(graph_def, lists=None, shapes=None, new_copies=True, half=None,
                  policy=None):
    """graph_def with the float32 values its late readers keep alive held in half (see the
    module's docstring); `lists` (lists.OpLists) names the readers that may read a value
    rounded to half (None: only values that are Casts up from half are changed); `shapes`
    ({node name: [shape per output]}, with .get) sizes the values (None: inferred from the
    GraphDef, paint/shapes.py). Without `new_copies`, only values with a half copy already
    (a Cast up from half, the candidate's Cast to half) are changed: each costs one Cast up
    at its late readers, not a Cast down as well, and frees its float32 bytes whole (a Keras
    Transformer's fit step on Sapphire Rapids: 0.85x the candidate's step peak at its speed,
    where the values with new copies too reached 0.72x at 1-4% slower). `half` (a DataType)
    is the type of the copies where the graph has no half Casts of its own (float32's own
    lean version: its compute float32, what its backward pass reads saved in half; None:
    such a graph is left alone). A reader is late, and a value worth saving, by `policy`'s
    late_levels and min_saved_elements (None: the default Policy's). Returns (GraphDef,
    values changed)."""
    policy = policy or _policy.DEFAULT
    view = GraphView(graph_def)
    half = _half_type(view) or half
    level = _graph_order.levels(view) if half is not None else None
    if level is None:
        return graph_def, 0
    if shapes is None:
        shapes = _shapes.graph_def_shapes(graph_def, view)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    taken = {node.name for node in nodes}
    added, changed = [], 0
    for i, node in enumerate(view.nodes):
        if _late_casts.held(view, i):
            continue
        for port, readers in sorted(view.fanout_of(i).items()):
            if elements(shapes, view, i, port) < policy.min_saved_elements:
                continue
            plan = _saving_plan(view, i, port, readers, half, level, lists, policy.late_levels)
            if plan is None or (plan[0] is None and not new_copies):
                continue
            source, late = plan
            tensor = node.name if port == 0 else f"{node.name}:{port}"
            if source is None:  # a new half copy, made where the value is
                copy = _casts.new_cast(taken, tensor, types_pb2.DT_FLOAT, half, node.device)
                added.append(copy)
                source = copy.name
            by_trigger = collections.defaultdict(list)
            for reader, reader_port, trigger in late:
                by_trigger[trigger].append((reader, reader_port))
            for trigger, moved in sorted(by_trigger.items()):
                back = _casts.new_cast(taken, source, half, types_pb2.DT_FLOAT,
                                       nodes[moved[0][0]].device)
                back.input.append(f"^{view.nodes[trigger].name}")
                added.append(back)
                for reader, reader_port in moved:
                    nodes[reader].input[reader_port] = back.name
            changed += 1
    if not changed:
        return graph_def, 0
    _graph_order.finish(out, set(), added)
    return out, changed


def elements(shapes, view, i, port):
    """The elements of output `port` of node i by its static shape (a tf_mpt Cast's: its
    input's), an unknown dimension counted as 1; 0 for an unknown rank (a value whose size is
    not known, such as one computed from a variable whose shape the GraphDef alone does not
    carry, is left alone)."""
    node = view.nodes[i]
    if _casts.is_ours(node) and view.fanin[i]:
        i, port = view.fanin[i][0]
        node = view.nodes[i]
    entry = shapes.get(node.name)
    if entry is None or port >= len(entry) or entry[port] is None:
        return 0
    count = 1
    for size in entry[port]:
        count *= size if size is not None and size > 0 else 1
    return count


def _saving_plan(view, i, port, readers, half, level, lists, late_levels):
    """(the half copy's tensor name, or None for a new Cast; [(late reader, its input port,
    the node it waits for)]) for output `port` of node i, or None where it is not held in
    half: no late reader, or one that cannot be moved."""
    node = view.nodes[i]
    exact = _casts.is_our_cast(node, half, types_pb2.DT_FLOAT) and port == 0
    source = node.input[0] if exact else None
    if not exact:
        if _output_type(node, port) != types_pb2.DT_FLOAT:
            return None
        for reader, _ in readers:
            copy = view.nodes[reader]
            if _casts.is_our_cast(copy, types_pb2.DT_FLOAT, half) and \
                    not view.control_fanin[reader]:
                source = copy.name
                break
    late = []
    for reader, reader_port in readers:
        reader_node = view.nodes[reader]
        if reader_node.name == source or level[reader] <= level[i] + late_levels:
            continue
        trigger = _deepest_other(view, reader, i, level)
        if reader_node.op in _graph_order.NOT_MOVED or trigger is None or \
                level[trigger] < level[i] + late_levels:
            return None  # (late, but not for an input it could wait on: the value stays)
        if not exact and (lists is None or lists.list_of(reader_node.op) not in _HALF_LISTS):
            return None
        late.append((reader, reader_port, trigger))
    return (source, late) if late else None
