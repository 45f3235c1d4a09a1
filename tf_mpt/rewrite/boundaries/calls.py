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

from tf_mpt.rewrite import editor as _editor
from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.boundaries import bodies as _bodies
from tf_mpt.rewrite.casts import is_our_cast

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


def _outer_readers(outer, node, port, half):
    """(tf_mpt's Casts to half reading node:port, other readers) in the main graph."""
    readers = [reader for reader, _ in outer.readers(node.name, port)]
    casts = sum(is_our_cast(reader, ta.DT_FLOAT, half) for reader in readers)
    return casts, len(readers) - casts


def _float32_positions(node, attr):
    return [k for k, dtype in enumerate(node.attr[attr].list.type) if dtype == ta.DT_FLOAT]


class _Plan:
    """The switches worth making at one call node."""

    def __init__(self, outer, node, bodies, half):
        _, offset = CALL_OPS[node.op]
        self.args, self.rets = [], []
        for k in _float32_positions(node, "Tin"):
            entries = [b.entry_casts(k) for b in bodies]
            producer, _ = outer.producer(node.input[offset + k])
            added = 0 if producer is not None and is_our_cast(producer, half, ta.DT_FLOAT) else 1
            if all(e is not None for e in entries) and sum(map(len, entries)) > added:
                self.args.append(k)
        for k in _float32_positions(node, "Tout"):
            exits = [b.exit_cast(k) for b in bodies]
            casts, others = _outer_readers(outer, node, k, half)
            if all(e is not None for e in exits) and len(exits) + casts > (1 if others else 0):
                self.rets.append(k)

    def __bool__(self):
        return bool(self.args or self.rets)


def _switch_arg(node, bodies, k, half):
    for body in bodies:
        body.remove_entry_casts(k, body.entry_casts(k))
        body.set_half(inputs=[k])
    node.attr["Tin"].list.type[k] = half


def _switch_ret(node, bodies, k, half):
    for body in bodies:
        body.return_before_exit_cast(k, body.exit_cast(k))
        body.set_half(outputs=[k])
    node.attr["Tout"].list.type[k] = half


def keep_call_values_half(graph_def, half, fetched, library):
    """Switches eligible call arguments and results of the main graph to half, in place.

    The arguments are those of loops.keep_loop_variables_half (specialised copies of the
    called functions go into `library`). Returns the number of arguments and results
    switched.
    """
    total = 0
    while True:  # a switch at one call can make one at its neighbour worth it
        switched = _sweep(graph_def, half, fetched, library)
        if not switched:
            return total
        total += switched


def _sweep(graph_def, half, fetched, library):
    outer = _editor.Editor(graph_def, half)
    switched = 0
    for node in _bodies.switchable_nodes(graph_def, CALL_OPS, fetched):
        funcs = _functions_of(node)
        fdefs = [library.functions.get(f.name) for f in funcs]
        if not funcs or any(f is None or f.signature.name in library.with_gradient
                            or any(a.type_attr or a.type_list_attr or a.number_attr
                                   for a in list(f.signature.input_arg)
                                   + list(f.signature.output_arg))
                            for f in fdefs):
            continue
        try:
            bodies = [_bodies.Body(f, library.signatures, half) for f in fdefs]
        except _bodies.UnsupportedFunction:
            continue
        plan = _Plan(outer, node, bodies, half)
        if not plan:
            continue
        names = [f.name for f in funcs]
        for i, (func, body) in enumerate(zip(funcs, bodies)):
            if library.references.get(func.name, 0) > 1 or names.count(func.name) > 1:
                # its edits go to the copy
                body.fdef = library.specialise(func, f"{body.name}{SPECIALISED}{node.name}_{i}")
        _, offset = CALL_OPS[node.op]
        for k in plan.args:
            _switch_arg(node, bodies, k, half)
            outer.feed_half(node, offset + k)
            switched += 1
        for k in plan.rets:
            _switch_ret(node, bodies, k, half)
            outer.read_half(node.name, k)
            switched += 1
        for body in bodies:
            body.write_back()
    outer.finish()
    return switched
