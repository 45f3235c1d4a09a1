"""Decisions across call boundaries: PartitionedCall, StatefulPartitionedCall, If and Case.

Each library function is first rewritten with its signature fixed, so a value that is half on
both sides of a call crosses it as float32 between two Casts:

    [MatMul] -> Cast(f32) -> Call(Tin=[f32]) { a -> Cast(half) -> [MatMul] }

Afterwards, for each call of the main graph, an argument whose every reader in the function
(every branch of an If/Case) is tf_mpt's Cast to half, and a result that every branch returns
through tf_mpt's Cast to float32, is switched to half in the call's Tin/Tout and in the
function's signature when that removes more Casts than it adds:

    [MatMul] -> Call(Tin=[half]) { a -> [MatMul] }

A function that other nodes call too is specialised first: this call gets a copy under a new
name, so every other caller keeps the signature it was built for. Functions with a registered
gradient, fetched or opted-out call nodes, and polymorphic signatures are left alone.
"""

from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.graph_view import parse_input
from tf_mpt.rewrite.boundaries.loops import _Outer
from tf_mpt.rewrite.boundaries.loops import return_before_exit_cast
from tf_mpt.rewrite.boundaries.loops import _function_references
from tf_mpt.rewrite.boundaries.loops import _half_entry_casts
from tf_mpt.rewrite.casts import is_our_cast
from tf_mpt.rewrite.boundaries.loops import _remove_entry_casts

# op -> (function-valued attrs, index of the first argument among the node's inputs)
CALL_OPS = {"PartitionedCall": (("f",), 0), "StatefulPartitionedCall": (("f",), 0),
            "If": (("then_branch", "else_branch"), 1),
            "StatelessIf": (("then_branch", "else_branch"), 1),
            "Case": (("branches",), 1), "StatelessCase": (("branches",), 1)}
SPECIALISED = "_tf_mpt_call_"


def _functions_of(node):
    """The NameAttrList protos naming the functions `node` calls (in place, renameable)."""
    attrs, _ = CALL_OPS[node.op]
    out = []
    for attr in attrs:
        value = node.attr[attr]
        out.extend(value.list.func if attr == "branches" else [value.func])
    return out


def _exit_cast(fdef, out_name, half):
    """tf_mpt's Cast to float32 whose output `out_name` returns, or None."""
    name = fdef.ret[out_name].split(":")[0]
    node = next((n for n in fdef.node_def if n.name == name), None)
    return node if node is not None and is_our_cast(node, half, ta.DT_FLOAT) else None


def _outer_readers(graph_def, node, port, half):
    """(tf_mpt's Casts to half reading node:port, other readers) in the main graph."""
    casts, others = 0, 0
    for reader in graph_def.node:
        for tensor in reader.input:
            if not tensor.startswith("^") and parse_input(tensor) == (node.name, port):
                if is_our_cast(reader, ta.DT_FLOAT, half):
                    casts += 1
                else:
                    others += 1
    return casts, others


class _Plan:
    """The switches worth making at one call node."""

    def __init__(self, graph_def, by_name, node, bodies, half):
        _, offset = CALL_OPS[node.op]
        self.args, self.rets = [], []
        for k, dtype in enumerate(node.attr["Tin"].list.type):
            if dtype != ta.DT_FLOAT:
                continue
            entries = [_half_entry_casts(b, b.signature.input_arg[k].name, half) for b in bodies]
            if any(e is None for e in entries):
                continue
            removed = sum(len(e) for e in entries)
            producer = by_name.get(parse_input(node.input[offset + k])[0])
            added = 0 if producer is not None and is_our_cast(producer, half, ta.DT_FLOAT) else 1
            if removed > added:
                self.args.append(k)
        for k, dtype in enumerate(node.attr["Tout"].list.type):
            if dtype != ta.DT_FLOAT:
                continue
            exits = [_exit_cast(b, b.signature.output_arg[k].name, half) for b in bodies]
            if any(e is None for e in exits):
                continue
            casts, others = _outer_readers(graph_def, node, k, half)
            if len(exits) + casts > (1 if others else 0):
                self.rets.append(k)

    def __bool__(self):
        return bool(self.args or self.rets)


def _switch_arg(node, bodies, k, half):
    for body in bodies:
        arg = body.signature.input_arg[k]
        _remove_entry_casts(body, arg.name, _half_entry_casts(body, arg.name, half))
        arg.type = half
    node.attr["Tin"].list.type[k] = half


def _switch_ret(node, bodies, k, half):
    for body in bodies:
        out = body.signature.output_arg[k]
        return_before_exit_cast(body, out.name, _exit_cast(body, out.name, half))
        out.type = half
    node.attr["Tout"].list.type[k] = half


def keep_call_values_half(graph_def, half, fetched):
    """Switches eligible call arguments and results of the main graph to half, in place.

    Args:
        graph_def: the rewritten GraphDef, library included.
        half: the half DataType enum.
        fetched: names of the fetched nodes (they and opted-out nodes keep their dtypes).

    Returns the number of arguments and results switched.
    """
    total = 0
    while True:  # a switch at one call can make one at its neighbour worth it
        switched = _sweep(graph_def, half, fetched)
        if not switched:
            return total
        total += switched


def _sweep(graph_def, half, fetched):
    library = {f.signature.name: f for f in graph_def.library.function}
    with_gradient = {g.function_name for g in graph_def.library.gradient}
    references = _function_references(graph_def)
    by_name = {n.name: n for n in graph_def.node}
    outer = _Outer(graph_def, half)
    switched = 0
    for node in list(graph_def.node):
        if node.op not in CALL_OPS or node.name in fetched or (
                ta.KEEP_FP32_ATTR in node.attr and node.attr[ta.KEEP_FP32_ATTR].b):
            continue
        funcs = _functions_of(node)
        bodies = [library.get(f.name) for f in funcs]
        if not funcs or any(b is None or b.signature.name in with_gradient
                            or any(a.type_attr or a.type_list_attr or a.number_attr
                                   for a in list(b.signature.input_arg)
                                   + list(b.signature.output_arg))
                            for b in bodies):
            continue
        plan = _Plan(graph_def, by_name, node, bodies, half)
        if not plan:
            continue
        for i, (func, body) in enumerate(zip(funcs, bodies)):
            if references.get(func.name, 0) > 1 or bodies.count(body) > 1:
                copy = graph_def.library.function.add()
                copy.CopyFrom(body)
                copy.signature.name = f"{body.signature.name}{SPECIALISED}{node.name}_{i}"
                references[func.name] -= 1
                func.name = copy.signature.name
                library[copy.signature.name] = copy
                bodies[i] = copy
        _, offset = CALL_OPS[node.op]
        for k in plan.args:
            _switch_arg(node, bodies, k, half)
            outer.feed_half(node, offset + k)
            switched += 1
        for k in plan.rets:
            _switch_ret(node, bodies, k, half)
            outer.read_half(node, k)
            switched += 1
    outer.finish()
    return switched
