"""Late casts: a half Cast of a value held across the step made once per consumer, when
the consumer's other input is ready."""

from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import types_pb2

from tf_mpt.choose.transforms import graph_order as _graph_order
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import type_attrs as _ta
from tf_mpt.rewrite.graph_view import GraphView


# The ops whose output is a value that lives across the step whatever the step does with it.
HELD_SOURCES = frozenset((
    "ReadVariableOp", "VariableV2", "Variable", "Const", "HostConst", "Placeholder",
    "PlaceholderWithDefault", "StackPopV2", "StackPop"))
# late casts in a functional While's body: its arguments are per iteration, not held; a
# variable's read and a value read from a list (a while_v2 gradient's accumulator) are.
LOOP_HELD_SOURCES = frozenset((
    "ReadVariableOp", "Const", "HostConst", "TensorListPopBack", "TensorListGetItem"))


def held(view, i, seen=0, sources=HELD_SOURCES):
    node = view.nodes[i]
    if node.op in sources:
        return True
    if node.op in _graph_order.PASS_THROUGH and view.fanin[i] and seen < 16:
        return held(view, view.fanin[i][0][0], seen + 1, sources)
    return False


def _half_cast_targets(view, sources=HELD_SOURCES):
    """{cast index: [(consumer, port), ...]} for tf_mpt's float32 -> half Casts of held
    values, with data readers only, no control reader and no control input (a Cast that
    waits already: late_casts made it)."""
    found = {}
    for i, node in enumerate(view.nodes):
        if not _casts.is_ours(node) or node.attr["SrcT"].type != types_pb2.DT_FLOAT or \
                node.attr["DstT"].type not in _ta.HALF_TYPES:
            continue
        if view.has_control_fanout[i] or view.control_fanin[i] or not view.fanin[i] or \
                not held(view, view.fanin[i][0][0], sources=sources):
            continue
        readers = [c for port, cs in view.fanout_of(i).items() if port == 0 for c in cs]
        if readers:
            found[i] = readers
    return found


def _trigger(view, consumer, targets, sources=HELD_SOURCES):
    """The name of the producer of `consumer`'s first data input that is neither a held
    value nor one of the Casts `targets` (of held values) nor a Placeholder (in a loop's
    body, an argument: there from the iteration's start), or None."""
    if view.nodes[consumer].op in _graph_order.ANY_INPUT:
        return None
    for src, _ in view.fanin[consumer]:
        if src in targets or held(view, src, sources=sources) or \
                view.nodes[src].op in _graph_order.NO_TRIGGER or \
                view.nodes[src].op == "Placeholder":
            continue
        return view.nodes[src].name
    return None


def late_casts(graph_def, sources=HELD_SOURCES):
    """graph_def with its half Casts of held values (made by `sources`, through
    pass-through ops) made per consumer, each after the consumer's other input (see the
    module's docstring). Returns (GraphDef, Casts moved)."""
    view = GraphView(graph_def)
    targets = _half_cast_targets(view, sources)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    taken = {node.name for node in nodes}
    moved, removed = 0, set()
    added = []
    for cast, readers in targets.items():
        triggers = [_trigger(view, consumer, targets, sources) for consumer, _ in readers]
        if not any(triggers):
            continue
        original = nodes[cast]
        if len(readers) == 1:
            original.input.append(f"^{triggers[0]}")
            moved += 1
            continue
        for (consumer, port), trigger in zip(readers, triggers):
            clone = _casts.new_cast(taken, original.input[0], types_pb2.DT_FLOAT,
                                    original.attr["DstT"].type, original.device)
            if trigger:
                clone.input.append(f"^{trigger}")
            nodes[consumer].input[port] = clone.name  # (GraphView: data inputs come first)
            added.append(clone)
        removed.add(original.name)
        moved += 1
    if not moved:
        return graph_def, 0
    _graph_order.finish(out, removed, added)
    return out, moved


def may_wait_on(view, src):
    """Whether a control input from node src means "its value is ready": not a held value (there
    from the step's start), not a loop's or a cond's plumbing."""
    return not held(view, src) and view.nodes[src].op not in _graph_order.NO_TRIGGER
