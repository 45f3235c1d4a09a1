"""Keep loop variables half across a functional While's boundary.

After each body is rewritten with its signature fixed, a float32 loop variable whose body
casts it to half on entry and back to float32 on exit pays two Casts per iteration. When the
loop condition does not need it in float32 either, the variable is switched to half in the
While's `T`, in the body and cond signatures, and the two Casts per iteration become at most
one Cast on each side of the loop, run once (a float32 reader in the body besides the Casts,
as a gradient's accumulator of the values, then reads one Cast back: one per iteration):

    x -> While(T=[f32]) { a -> Cast(half) -> MatMul -> Cast(f32) -> ret }
    becomes
    x -> Cast(half) -> While(T=[half]) { a -> MatMul -> ret } -> Cast(f32) where float32 is used

A loop invariant (the body returns the argument as it is, as while_v2 does with captured
weights) that the body only casts to half is switched the same way: one Cast before the loop
instead of one per iteration; readers of the loop's output that need float32 read the
float32 tensor the loop was given (the same value, never rounded).

Only While nodes of the main graph whose body and cond functions no other node calls are
changed (a shared function would need a copy per caller), and never a fetched or opted-out
While (its outputs and attrs keep their dtypes).
"""

from tf_mpt import _dtypes
from tf_mpt.rewrite import editor as _editor
from tf_mpt.rewrite.boundaries import bodies as _bodies
from tf_mpt.rewrite.casts import is_our_cast

WHILE_OPS = ("While", "StatelessWhile")
DT_FLOAT = _dtypes.DT_FLOAT


def _try_switch(while_node, index, body, cond, half):
    """Switches loop variable `index` to half in body and cond if that removes body Casts:
    the body casts it to half where it reads it and returns it through a Cast to float32.
    Its other readers in the body (a gradient's accumulator that pushes it) then read one
    Cast of it to float32, still a Cast fewer per iteration; they see the loop's initial
    value rounded to half, as its half readers do (later values are half already)."""
    found = body.readers_of_argument(index)
    exit_cast = body.exit_cast(index)
    if found is None or not found[0] or exit_cast is None:
        return False
    return _switch(while_node, index, body, cond, half, [],
                   before=lambda: body.read_argument_half(index),
                   after=lambda: body.return_before_exit_cast(index, exit_cast))


def _switch(while_node, index, body, cond, half, entry, before=None, after=None):
    """The common tail: if the cond reads the variable only through Casts to half (or not
    at all), drop the body's `entry` Casts and the cond's (running `before` / `after` the
    body's), and make the variable half in the While and both signatures."""
    cond_entry = cond.entry_casts(index)
    if cond_entry is None:
        return False
    if before is not None:
        before()
    body.remove_entry_casts(index, entry)
    if after is not None:
        after()
    cond.remove_entry_casts(index, cond_entry)
    _set_half(while_node, index, body, cond, half)
    return True


def _set_half(while_node, index, body, cond, half):
    """Loop variable `index` is half in the While's T and the body and cond signatures."""
    body.set_half(inputs=[index], outputs=[index])
    cond.set_half(inputs=[index])
    while_node.attr["T"].list.type[index] = half


def _try_switch_invariant(while_node, index, body, cond, half):
    """Switches a loop invariant (the body returns the argument unchanged, maybe through
    Identity nodes) to half when the body only casts it to half, at every iteration: one Cast
    before the loop instead."""
    chain = body.identity_chain(index)
    if chain is None:
        return False
    # what may read the argument besides the Casts: the chain's last Identity, or the
    # return value itself (no chain)
    passes_it_on = chain[-1].name if chain else body.ret_node(index).name
    readers = [node for node, _ in body.editor.readers(body.arg(index))]
    entry = [node for node in readers if is_our_cast(node, DT_FLOAT, half)]
    others = {node.name for node in readers} - {node.name for node in entry}
    if not entry or others - {passes_it_on}:
        return False

    def chain_half():
        for node in chain:
            node.attr["T"].type = half

    return _switch(while_node, index, body, cond, half, entry, before=chain_half)


def keep_loop_variables_half(graph_def, half, fetched, library):
    """Switches eligible While loop variables of the main graph to half, in place.

    Args:
        graph_def: the rewritten GraphDef, library included.
        half: the half DataType enum.
        fetched: names of the fetched nodes (they and opted-out nodes keep their dtypes).
        library: the bodies.Library of the whole graph.

    Returns the number of loop variables switched.
    """
    outer = _editor.Editor(graph_def, half)
    switched = 0
    for node in _bodies.switchable_nodes(graph_def, WHILE_OPS, fetched):
        body = library.functions.get(node.attr["body"].func.name)
        cond = library.functions.get(node.attr["cond"].func.name)
        if body is None or cond is None or DT_FLOAT not in node.attr["T"].list.type or \
                library.references.get(body.signature.name) != 1 or \
                library.references.get(cond.signature.name) != 1:
            continue
        try:
            body = _bodies.Body(body, library.signatures, half)
            cond = _bodies.Body(cond, library.signatures, half)
        except _bodies.UnsupportedFunction:
            continue
        for index, dtype in enumerate(node.attr["T"].list.type):
            if dtype != DT_FLOAT:
                continue
            if _try_switch(node, index, body, cond, half):
                outer.feed_half(node, index, kept=fetched)
                outer.read_half(node.name, index)
                switched += 1
            elif _try_switch_invariant(node, index, body, cond, half):
                original = node.input[index]
                outer.feed_half(node, index)
                outer.read_half(node.name, index, original)
                switched += 1
        body.write_back()
        cond.write_back()
    outer.finish()
    return switched


# --- loop variables declared half before a body is painted -----------------------------------
#
# A body is rewritten with its signature fixed, so a loop variable it reads in float32 and
# returns in half (a gradient loop's incoming gradient: float32 elementwise ops start from
# it, a half MatMul makes the next one) pays a Cast out at every iteration, and the ops
# reading it stay float32. The orchestrator then rewrites the original body again with such
# variables declared half (`declared_half`): their readers are painted from a half source.


def returned_half_read_float32(fdef, signatures, half, cond=None):
    """Indices of the float32 loop variables that the rewritten body `fdef` returns through
    an exit Cast to float32 but does not cast to half where it reads them (and that the
    rewritten `cond`, when given, reads at most through Casts to half)."""
    try:
        body = _bodies.Body(fdef, signatures, half)
        cond = _bodies.Body(cond, signatures, half) if cond is not None else None
    except _bodies.UnsupportedFunction:
        return []
    found = []
    for k, arg in enumerate(fdef.signature.input_arg):
        if arg.type != DT_FLOAT or k >= len(fdef.signature.output_arg) or \
                fdef.signature.output_arg[k].type != DT_FLOAT:
            continue
        readers = body.readers_of_argument(k)
        if readers is None or readers[0] or body.exit_cast(k) is None:
            continue
        if cond is not None and cond.entry_casts(k) is None:
            continue
        found.append(k)
    return found


def declared_half(fdef, indices, half):
    """A copy of FunctionDef `fdef` whose arguments and return values `indices` are half."""
    copy = type(fdef)()
    copy.CopyFrom(fdef)
    for k in indices:
        copy.signature.input_arg[k].type = half
        copy.signature.output_arg[k].type = half
    return copy


def switch_declared(graph_def, while_node, indices, cond_fdef, signatures, half, fetched):
    """The While `while_node` of `graph_def` (its body already rewritten with `indices`
    declared half) carries them in half: its T, the cond's signature (its Casts to half of
    them undone) and the main graph's Casts around it (`fetched` nodes keep their dtypes).
    In place."""
    cond = _bodies.Body(cond_fdef, signatures, half)
    for k in indices:
        cond.remove_entry_casts(k, cond.entry_casts(k))
        cond.set_half(inputs=[k])
        while_node.attr["T"].list.type[k] = half
    cond.write_back()
    outer = _editor.Editor(graph_def, half)
    for k in indices:
        outer.feed_half(while_node, k, kept=fetched)
        outer.read_half(while_node.name, k)
    outer.finish()
