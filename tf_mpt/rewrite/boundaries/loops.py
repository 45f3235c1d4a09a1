"""Keep loop variables half across a functional While's boundary.

After each body is rewritten with its signature fixed, a float32 loop variable whose body
casts it to half on entry and back to float32 on exit pays two Casts per iteration. When the
loop condition does not need it in float32 either, the variable is switched to half in the
While's `T`, in the body and cond signatures, and the two Casts per iteration become at most
one Cast on each side of the loop, run once:

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

from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.casts import is_cast
from tf_mpt.rewrite.casts import is_our_cast
from tf_mpt.rewrite.function_bodies import called_functions
from tf_mpt.rewrite.graph_view import parse_input

_WHILE_OPS = ("While", "StatelessWhile")


def _function_references(graph_def):
    counts = {}

    def count(nodes):
        for node in nodes:
            for func in called_functions(node):
                counts[func.name] = counts.get(func.name, 0) + 1

    count(graph_def.node)
    for fdef in graph_def.library.function:
        count(fdef.node_def)
    return counts


def _arg_consumers(fdef, arg):
    """[(node, input index)] reading argument `arg` in a FunctionDef body."""
    return [(n, k) for n in fdef.node_def for k, t in enumerate(n.input) if t == arg]


def _half_entry_casts(fdef, arg, half):
    """Our Casts to half that are the only readers of `arg`, or None if something else reads it."""
    consumers = _arg_consumers(fdef, arg)
    if any(not is_our_cast(n, ta.DT_FLOAT, half) for n, _ in consumers):
        return None
    if any(out == arg for out in fdef.ret.values()):
        return None
    return [n for n, _ in consumers]


def _remove_entry_casts(fdef, arg, casts):
    names = {c.name for c in casts}
    for node in fdef.node_def:
        for k, tensor in enumerate(node.input):
            if tensor.split(":")[0] in names and not tensor.startswith("^"):
                node.input[k] = arg
    _delete_nodes(fdef, names)


def _delete_nodes(fdef, names):
    keep = [n for n in fdef.node_def if n.name not in names]
    del fdef.node_def[:]
    fdef.node_def.extend(keep)


def return_before_exit_cast(body, out_name, exit_cast):
    """The function returns its exit Cast's input as `out_name`; the Cast goes when nothing
    else reads it (another output or a node may)."""
    body.ret[out_name] = exit_cast.input[0]
    still_read = any(t.split(":")[0].lstrip("^") == exit_cast.name for n in body.node_def
                     for t in n.input) or any(
                         v.split(":")[0] == exit_cast.name for v in body.ret.values())
    if not still_read:
        _delete_nodes(body, {exit_cast.name})


def _try_switch(while_node, index, body, cond, half):
    """Switches loop variable `index` to half in body and cond if that removes body Casts."""
    body_arg = body.signature.input_arg[index].name
    body_out = body.signature.output_arg[index].name
    cond_arg = cond.signature.input_arg[index].name
    entry = _half_entry_casts(body, body_arg, half)
    ret_name = body.ret[body_out].split(":")[0]
    exit_cast = next((n for n in body.node_def if n.name == ret_name), None)
    if not entry or exit_cast is None or not is_our_cast(exit_cast, half, ta.DT_FLOAT):
        return False
    cond_entry = _half_entry_casts(cond, cond_arg, half)
    if cond_entry is None:
        return False
    _remove_entry_casts(body, body_arg, entry)
    return_before_exit_cast(body, body_out, exit_cast)
    _remove_entry_casts(cond, cond_arg, cond_entry)
    _set_half(while_node, index, body, cond, half)
    return True


def _set_half(while_node, index, body, cond, half):
    """Loop variable `index` is half in the While's T and the body and cond signatures."""
    body.signature.input_arg[index].type = half
    body.signature.output_arg[index].type = half
    cond.signature.input_arg[index].type = half
    while_node.attr["T"].list.type[index] = half


def _identity_chain(body, out_name, arg):
    """The Identity nodes through which `body` returns `arg` unchanged as `out_name` (returned
    one first; [] when it returns the argument itself), or None when the output is not the
    argument or a chain node has another reader."""
    nodes = {n.name: n for n in body.node_def}
    chain, ref = [], body.ret[out_name]
    while ref != arg:
        node = nodes.get(ref.split(":")[0])
        data = [t for t in node.input if not t.startswith("^")] if node is not None else []
        if node is None or node.op != "Identity" or len(data) != 1:
            return None
        chain.append(node)
        ref = data[0]
    names = {n.name for n in chain}
    for node in body.node_def:
        for tensor in node.input:
            name = tensor.lstrip("^").split(":")[0]
            if name in names and node.name not in names:
                return None  # another node reads the chain
    if any(ref.split(":")[0] in names for name, ref in body.ret.items() if name != out_name):
        return None
    return chain


def _try_switch_invariant(while_node, index, body, cond, half):
    """Switches a loop invariant (the body returns the argument unchanged, maybe through
    Identity nodes) to half when the body only casts it to half, at every iteration: one Cast
    before the loop instead."""
    body_arg = body.signature.input_arg[index].name
    body_out = body.signature.output_arg[index].name
    cond_arg = cond.signature.input_arg[index].name
    chain = _identity_chain(body, body_out, body_arg)
    if chain is None:
        return False
    last = {chain[-1].name} if chain else set()
    readers = _arg_consumers(body, body_arg)
    entry = [n for n, _ in readers if is_our_cast(n, ta.DT_FLOAT, half)]
    if not entry or any(n not in entry and n.name not in last for n, _ in readers):
        return False
    if sum(ref == body_arg for ref in body.ret.values()) > (0 if chain else 1):
        return False  # another output returns the argument too
    cond_entry = _half_entry_casts(cond, cond_arg, half)
    if cond_entry is None:
        return False
    for node in chain:  # before removing nodes, which copies the body's NodeDefs
        node.attr["T"].type = half
    _remove_entry_casts(body, body_arg, entry)
    _remove_entry_casts(cond, cond_arg, cond_entry)
    _set_half(while_node, index, body, cond, half)
    return True


class _Outer:
    """Edits of the main graph around switched While nodes.

    Each (tensor, dtype) conversion has one Cast, shared with the Casts already in the graph;
    a value switched to half that a Cast from half (tf_mpt's or the graph's own) made float32
    is read before that Cast, and tf_mpt's Cast is dropped when nothing else reads it (a loop
    fed by another switched loop reads its half output directly).
    """

    def __init__(self, graph_def, half):
        self.graph_def, self.half = graph_def, half
        self.by_name = {n.name: n for n in graph_def.node}
        self.taken = set(self.by_name)
        self.new = []
        self.removed = {}  # name of a Cast made redundant -> the tensor its readers now read
        self.bypassed = set()  # tf_mpt's Casts to float32 a loop variable stopped reading
        self.casts = {}  # (tensor as (node, port), dtype) -> a Cast of that tensor to dtype
        for node in graph_def.node:
            if node.op == "Cast" and len(node.input) == 1:  # no control inputs
                self.casts.setdefault((parse_input(node.input[0]), node.attr["DstT"].type),
                                      node.name)

    def _cast(self, tensor, to):
        key = (parse_input(tensor), to)
        name = self.casts.get(key)
        if name is None:
            producer = self.by_name.get(key[0][0])
            from_dtype = self.half if to == ta.DT_FLOAT else ta.DT_FLOAT
            cast = _casts.new_cast(self.taken, tensor, from_dtype, to,
                                   producer.device if producer is not None else "")
            self.new.append(cast)
            self.by_name[cast.name] = cast
            name = self.casts[key] = cast.name
        return name

    def feed_half(self, while_node, index):
        tensor = while_node.input[index]
        name, _ = parse_input(tensor)
        producer = self.by_name.get(name)
        if producer is not None and is_cast(producer, self.half, ta.DT_FLOAT) and \
                len(producer.input) == 1:  # a Cast with control inputs is kept: they order it
            while_node.input[index] = producer.input[0]
            if is_our_cast(producer, self.half, ta.DT_FLOAT):
                self.bypassed.add(producer.name)
        else:
            while_node.input[index] = self._cast(tensor, self.half)

    def read_half(self, while_node, index, original=None):
        """Readers of a While output switched to half: tf_mpt's Casts to half read it as it
        is; every other reader reads a Cast of it to float32 or, for a loop invariant,
        `original`: the float32 tensor the loop was given (the same value, unrounded)."""
        out = while_node.name if index == 0 else f"{while_node.name}:{index}"
        fp32 = original
        for node in list(self.graph_def.node) + list(self.new):
            if node.name in self.removed:
                continue
            for k, tensor in enumerate(node.input):
                if tensor.startswith("^") or parse_input(tensor) != (while_node.name, index):
                    continue
                if is_our_cast(node, ta.DT_FLOAT, self.half):
                    self.removed[node.name] = out  # its readers read the half output itself
                    continue
                if fp32 is None:
                    fp32 = self._cast(out, ta.DT_FLOAT)
                node.input[k] = fp32

    def finish(self):
        self.graph_def.node.extend(self.new)
        for node in self.graph_def.node:
            for k, tensor in enumerate(node.input):
                name, port = parse_input(tensor)
                if port >= 0 and name in self.removed:
                    node.input[k] = self.removed[name]
        read = {parse_input(t)[0] for n in self.graph_def.node if n.name not in self.removed
                for t in n.input}
        unread = (self.bypassed | {n.name for n in self.new}) - read
        drop = set(self.removed) | unread
        keep = [n for n in self.graph_def.node if n.name not in drop]
        del self.graph_def.node[:]
        self.graph_def.node.extend(keep)


def keep_loop_variables_half(graph_def, half, fetched):
    """Switches eligible While loop variables of the main graph to half, in place.

    Args:
        graph_def: the rewritten GraphDef, library included.
        half: the half DataType enum.
        fetched: names of the fetched nodes (they and opted-out nodes keep their dtypes).

    Returns the number of loop variables switched.
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    references = _function_references(graph_def)
    outer = _Outer(graph_def, half)
    switched = 0
    for node in list(graph_def.node):
        if node.op not in _WHILE_OPS or node.name in fetched or (
                ta.KEEP_FP32_ATTR in node.attr and node.attr[ta.KEEP_FP32_ATTR].b):
            continue
        body = library.get(node.attr["body"].func.name)
        cond = library.get(node.attr["cond"].func.name)
        if body is None or cond is None or references.get(body.signature.name) != 1 or \
                references.get(cond.signature.name) != 1:
            continue
        for index, dtype in enumerate(node.attr["T"].list.type):
            if dtype != ta.DT_FLOAT:
                continue
            if _try_switch(node, index, body, cond, half):
                outer.feed_half(node, index)
                outer.read_half(node, index)
                switched += 1
            elif _try_switch_invariant(node, index, body, cond, half):
                original = node.input[index]
                outer.feed_half(node, index)
                outer.read_half(node, index, original)
                switched += 1
    outer.finish()
    return switched
