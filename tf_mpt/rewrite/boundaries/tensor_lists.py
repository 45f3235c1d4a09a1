"""TF2 TensorLists across While loops: one element dtype per list, half where it saves Casts.

A TensorList is a variant tensor: made in the main graph (`EmptyTensorList`,
`TensorListReserve`), carried into a While body as a loop variable, written there
(`TensorListPushBack`, `TensorListSetItem`), carried out and into another loop (the gradient
of a while_v2 loop keeps the forward values it needs in such lists, pushed in the forward body
and popped in the gradient body) and read (`TensorListPopBack`, `TensorListGetItem`,
`TensorListStack`). Every op of one list must agree on `element_dtype`.

Bodies are rewritten one at a time with their signatures fixed, and the list ops are on no
list, so a half value is cast to float32 before every push and back to half after every pop,
at every loop step. This pass follows each list made in the main graph through the main
graph's While loops (their body and cond functions, when no other node calls them) and
switches the whole list to half when that needs no more Casts (on a tie the Casts only move,
and the list's memory halves) and loses nothing (every value written is already half, or
every value read goes straight to a Cast to half). A list that
reaches anything else (a call, an op that is not a list op) is left alone.
"""

from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.boundaries import bodies as _bodies
from tf_mpt.rewrite.casts import is_our_cast
from tf_mpt.rewrite.editor import tensor_name as _editor_tensor

MAKERS = ("EmptyTensorList", "TensorListReserve")
# op -> index of the value input
WRITERS = {"TensorListPushBack": 1, "TensorListSetItem": 2}
# op -> port of the value output
READERS = {"TensorListPopBack": 1, "TensorListGetItem": 0, "TensorListStack": 0}
# list ops that only look at the list (no element values)
NEUTRAL = ("TensorListLength", "TensorListElementShape")
# op -> port of the output that continues the list
CONTINUES = {"TensorListPushBack": 0, "TensorListSetItem": 0, "TensorListPopBack": 0}
_WHILE_OPS = ("While", "StatelessWhile")
_IDENTITY = ("Identity",)
# ops whose output is a variable's buffer, not a copy of it
_VARIABLE_READS = ("ReadVariableOp",)


class _Group:
    def __init__(self):
        self.members = []   # (scope, node)
        self.writers = []   # (scope, node)
        self.readers = []   # (scope, node)
        self.broken = False


def _scopes(graph_def, half, library):
    """{None: main scope, function name: scope} for the bodies/conds of main-graph Whiles
    that no other node calls."""
    scopes = {None: _bodies.MainGraph(graph_def, half)}
    for node in graph_def.node:
        if node.op not in _WHILE_OPS:
            continue
        for attr in ("body", "cond"):
            name = node.attr[attr].func.name
            if name in scopes or name not in library.functions or \
                    library.references.get(name) != 1:
                continue
            try:
                scopes[name] = _bodies.Body(library.functions[name], library.signatures, half)
            except _bodies.UnsupportedFunction:
                continue
    return scopes


def _follow(scopes, start_scope, start_node):
    """The group of list ops reachable from one maker."""
    group = _Group()
    group.members.append((start_scope, start_node))
    stack = [(start_scope, (start_node.name, 0))]
    seen = set()
    while stack:
        scope, tensor = stack.pop()
        if (scope.name, tensor) in seen:
            continue
        seen.add((scope.name, tensor))
        for node, k in scope.editor.readers(*tensor):
            op = node.op
            if op in WRITERS or op in READERS or op in NEUTRAL:
                if k != 0:  # the list is this op's value or index: not a list use
                    group.broken = True
                    continue
                if op in WRITERS:
                    group.writers.append((scope, node))
                if op in READERS:
                    group.readers.append((scope, node))
                if op not in NEUTRAL:
                    group.members.append((scope, node))
                if op in CONTINUES:
                    stack.append((scope, (node.name, CONTINUES[op])))
            elif op in _IDENTITY:  # a body's return value is an Identity here too
                stack.append((scope, (node.name, 0)))
            elif op in _WHILE_OPS and scope.name is None:
                for attr in ("body", "cond"):
                    inner = scopes.get(node.attr[attr].func.name)
                    if inner is None:
                        group.broken = True
                        continue
                    arg = inner.arg(k)
                    stack.append((inner, (arg, 0)))
                stack.append((scope, (node.name, k)))
            else:
                group.broken = True
    return group


def _half_consumers(scope, node, port, half):
    readers = scope.editor.readers(node.name, port)
    return ([r for r, _ in readers if is_our_cast(r, ta.DT_FLOAT, half)],
            [r for r, _ in readers if not is_our_cast(r, ta.DT_FLOAT, half)])


def _writes_a_variables_read(scope, node, half):
    """Whether the value `node` writes is tf_mpt's Cast to half (without control inputs) of a
    variable's read (through Identity): a float32 list of the read holds the variable's own
    buffer at every step, a half list a copy per step (a while_v2 gradient's accumulator of a
    weight the body reads each iteration: one half copy of the weight per iteration)."""
    cast, _ = scope.editor.producer(node.input[WRITERS[node.op]])
    if cast is None or len(cast.input) != 1 or not is_our_cast(cast, ta.DT_FLOAT, half):
        return False
    producer, _ = scope.editor.producer(cast.input[0])
    for _ in range(8):
        if producer is None:
            return False
        if producer.op in _VARIABLE_READS:
            return True
        if producer.op not in _IDENTITY:
            return False
        producer, _ = scope.editor.producer(producer.input[0])
    return False


def _decide(group, half):
    """True if switching the group to half removes Casts and loses nothing."""
    if group.broken or not group.writers:
        return False
    if any(n.attr["element_dtype"].type != ta.DT_FLOAT for _, n in group.members):
        return False
    written_half = [p is not None and is_our_cast(p, half, ta.DT_FLOAT)
                    for p, _ in (s.editor.producer(n.input[WRITERS[n.op]])
                                 for s, n in group.writers)]
    reads = [_half_consumers(s, n, READERS[n.op], half) for s, n in group.readers]
    read_half = [bool(casts) and not others for casts, others in reads]
    if not (all(written_half) or all(read_half)):
        return False
    now = sum(written_half) + sum(bool(casts) for casts, _ in reads)
    after = written_half.count(False) + sum(bool(others) for _, others in reads)
    # On a tie the Casts only move; half storage still halves the list's memory (a
    # gradient's accumulators hold one value per loop step).
    return after <= now


def _switch(group, half):
    """Every op of the group goes half; values written reach the list in half and values
    read leave it in half (tf_mpt's Casts around it undone, float32 readers given a Cast)."""
    for scope, node in group.members:
        node.attr["element_dtype"].type = half
        scope.changed = True
    for scope, node in group.writers:
        scope.editor.feed_half(node, WRITERS[node.op])
    for scope, node in group.readers:
        scope.editor.read_half(node.name, READERS[node.op])


def _to_float32(group, half):
    """The group's ops go float32: each writer pushes the float32 value its half value was
    cast from, each reader's value is cast to half for its readers (tf_mpt's Casts of it to
    float32 bypassed)."""
    for scope, node in group.members:
        node.attr["element_dtype"].type = ta.DT_FLOAT
        scope.changed = True
    for scope, node in group.writers:
        k = WRITERS[node.op]
        cast, _ = scope.editor.producer(node.input[k])
        scope.editor.set_input(node, k, cast.input[0])
        scope.editor.drop_unread([cast.name])
    for scope, node in group.readers:
        port = READERS[node.op]
        value = _editor_tensor(node.name, port)
        readers = list(scope.editor.readers(node.name, port))
        half_value = scope.editor.cast(value, half, ta.DT_FLOAT)
        for reader, k in readers:
            if is_our_cast(reader, half, ta.DT_FLOAT):
                scope.editor.bypass(reader.name, value)
            else:
                scope.editor.set_input(reader, k, half_value)


def float32_lists_of_variable_reads(graph_def):
    """A copy of graph_def (a rewrite's result) with its half TensorLists whose every
    written value is tf_mpt's Cast of a variable's read (_writes_a_variables_read: a
    while_v2 gradient's accumulator of a weight the forward body reads) made float32: a
    float32 list's entries are the variable's own buffer, a half list's a copy per loop
    step; the reads popped are cast to half where they are read (a Cast per step). Returns
    (GraphDef, lists switched); the input where none is."""
    halves = {n.attr["element_dtype"].type for n in graph_def.node if n.op in MAKERS} & \
        set(ta.HALF_TYPES)
    if len(halves) != 1:
        return graph_def, 0
    half = halves.pop()
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    library = _bodies.Library(out)
    scopes = _scopes(out, half, library)
    main = scopes[None]
    switched = 0
    for node in list(out.node):
        if node.op not in MAKERS or node.attr["element_dtype"].type != half:
            continue
        group = _follow(scopes, main, node)
        if group.broken or not group.writers or \
                any(n.attr["element_dtype"].type != half for _, n in group.members) or \
                not all(_writes_a_variables_read(s, n, half) for s, n in group.writers):
            continue
        _to_float32(group, half)
        switched += 1
    if not switched:
        return graph_def, 0
    for scope in scopes.values():
        scope.write_back()
    return out, switched


def keep_tensor_lists_half(graph_def, half, library):
    """Switches eligible TensorLists of the main graph's While loops to half, in place.

    Returns the number of lists switched.
    """
    scopes = _scopes(graph_def, half, library)
    main = scopes[None]
    switched = 0
    for node in list(graph_def.node):
        if node.op not in MAKERS:
            continue
        group = _follow(scopes, main, node)
        if _decide(group, half):
            _switch(group, half)
            switched += 1
    if not switched:
        return 0
    for scope in scopes.values():
        scope.write_back()
    return switched
