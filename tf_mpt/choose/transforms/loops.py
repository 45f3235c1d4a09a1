"""Late casts and accumulation in order inside a functional While's bodies."""

from tensorflow.core.framework import graph_pb2

from tf_mpt.choose.transforms import late_casts as _late_casts
from tf_mpt.choose.transforms import ordering as _ordering
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.rewrite.graph_view import GraphView


_WHILE_OPS = frozenset(("While", "StatelessWhile"))
# accumulated in order: the ops that sum a product into a loop variable
_ACCUMULATORS = frozenset(("AddN", "AddV2", "Add"))


def _loop_bodies(graph_def):
    """The names of the library functions that are a While's body (in the main graph or in
    a function)."""
    found = set()
    for node in _function_bodies.all_nodes(graph_def):
        if node.op in _WHILE_OPS and node.attr["body"].func.name:
            found.add(node.attr["body"].func.name)
    return found


def _in_loop_bodies(graph_def, change):
    """graph_def with `change` (GraphDef -> (GraphDef, count)) made in each functional While
    body of its library (function_bodies.function_to_graph_def: the arguments are
    Placeholders); a body that cannot be converted is left as it is. Returns (GraphDef,
    the counts' sum)."""
    bodies = _loop_bodies(graph_def)
    if not bodies:
        return graph_def, 0
    signatures = {f.signature.name: f.signature for f in graph_def.library.function}
    out, total = None, 0
    for k, fdef in enumerate(graph_def.library.function):
        if fdef.signature.name not in bodies:
            continue
        try:
            body, _ = _function_bodies.function_to_graph_def(fdef, signatures)
            changed, count = change(body)
            if not count:
                continue
            new = _function_bodies.graph_def_to_function(changed, fdef, signatures)
        except (_function_bodies.UnsupportedFunction, KeyError, ValueError):
            continue
        if out is None:
            out = graph_pb2.GraphDef()
            out.CopyFrom(graph_def)
        out.library.function[k].CopyFrom(new)
        total += count
    return (out, total) if total else (graph_def, 0)


def late_casts_in_loops(graph_def):
    """graph_def with late casts made in its functional While loops' bodies, where the values
    that live across an iteration's work are LOOP_HELD_SOURCES' (a variable's read, a value
    read from a list: a while_v2 gradient's pop of a weight's read); the body's arguments are
    per iteration (a recurrent state), so a weight's half Cast waits for the state's. The
    iterations running side by side (a forward loop racing ahead of its recurrence, a
    gradient loop popping ahead) then do not each hold a half copy of the weight before the
    product that reads it can run. Returns (GraphDef, Casts moved)."""
    return _in_loop_bodies(graph_def, lambda body: _late_casts.late_casts(
        body, _late_casts.LOOP_HELD_SOURCES))


def _accumulated_in_order(body):
    """(body, products changed): each matrix product whose result (through Casts and
    Identity) is added to an argument of the body (AddN, AddV2, Add, reading the argument
    or an Identity of it: a gradient loop's sum of a weight's per-step gradients, a loop
    variable) waits for what it is added to, the previous iteration's sum."""
    view = GraphView(body)
    out = graph_pb2.GraphDef()
    out.CopyFrom(body)
    changed = set()
    for node_index, node in enumerate(view.nodes):
        if node.op not in _ACCUMULATORS:
            continue
        sources = [src for src, _ in view.fanin[node_index]]
        arguments = [src for src in sources if _an_argument(view, src)]
        if len(arguments) != 1:
            continue
        for src in sources:
            product = src
            for _ in range(4):  # (through tf_mpt's Casts and Identity)
                if view.nodes[product].op in _ordering.PRODUCTS or not view.fanin[product] or not (
                        _casts.is_ours(view.nodes[product]) or
                        view.nodes[product].op == "Identity"):
                    break
                product = view.fanin[product][0][0]
            if view.nodes[product].op not in _ordering.PRODUCTS or \
                    arguments[0] in view.control_fanin[product]:
                continue
            out.node[product].input.append(f"^{view.nodes[arguments[0]].name}")
            changed.add(product)
    return (out, len(changed)) if changed else (body, 0)


def _an_argument(view, i):
    """Whether node i is a body's argument (a Placeholder), or Identity of one."""
    for _ in range(8):
        if view.nodes[i].op == "Placeholder":
            return True
        if view.nodes[i].op != "Identity" or not view.fanin[i]:
            return False
        i = view.fanin[i][0][0]
    return False


def accumulated_in_order(graph_def):
    """graph_def with the products of its functional While loops' bodies that are summed into
    a loop variable waiting for that variable (_accumulated_in_order): a gradient loop's
    per-step weight gradients are not computed ahead of the sum, up to one per iteration
    running side by side (the Keras LSTM's gradient loop held 29 of them). Returns
    (GraphDef, products changed)."""
    return _in_loop_bodies(graph_def, _accumulated_in_order)
