"""TensorArray and Stack element dtypes: every op touching one agrees, and it may go half.

A TensorArray (v3 ops) is one storage with one element dtype: `TensorArrayV3` declares it,
`TensorArrayWriteV3` / `ScatterV3` / `SplitV3` put values in (attr T), `ReadV3` / `GatherV3` /
`ConcatV3` take them out (attr dtype), and a gradient array made by `TensorArrayGradV3` has its
source's dtype. The ops find their array through the resource handle, which may pass through
Identity and v1 control flow (Enter, Merge, Switch, Exit, NextIteration). A v1 Stack
(`StackV2` elem_type, `StackPushV2` T, `StackPopV2` elem_type) is the same kind of unit: the
gradient of a v1 while loop keeps the forward values it needs in Stacks, pushed in the
forward loop and popped in the gradient loop, so a half intermediate would otherwise be cast
to float32 and stored so at every step, and cast back after every pop.

The name-based passes leave all of them float32 (they are on no list), so a value written
from a half op is cast to float32 at every write and back at every read. This pass considers
each array as one unit after the painting passes: it goes half when that needs fewer Casts,
weighing a Cast inside a loop (its handle crossed an Enter) as LOOP_WEIGHT Casts outside, and
when it loses nothing: for the array and each of its gradient arrays, every value written is
already half, or every reader feeds only half ops (which round the values anyway). Every vertex of the array is painted together, so the
declaration, the writes and the reads always agree.
"""

import collections

SOURCES = {"TensorArrayV3": "dtype", "StackV2": "elem_type"}
GRADIENTS = ("TensorArrayGradV3", "TensorArrayGradWithShape")
WRITERS = {"TensorArrayWriteV3": "T", "TensorArrayScatterV3": "T", "TensorArraySplitV3": "T",
           "StackPushV2": "T"}
READERS = {"TensorArrayReadV3": "dtype", "TensorArrayGatherV3": "dtype",
           "TensorArrayConcatV3": "dtype", "StackPopV2": "elem_type"}
_PASS_THROUGH = frozenset({"Identity", "RefIdentity", "Enter", "RefEnter", "Exit", "RefExit",
                           "Merge", "RefMerge", "Switch", "RefSwitch", "NextIteration",
                           "RefNextIteration"})
_ENTER = frozenset({"Enter", "RefEnter"})
LOOP_WEIGHT = 10


def _source(view, i):
    """For node i's handle input: (index of the TensorArrayV3 behind it, the array it writes
    or reads, Enters crossed), or None when the handle comes from elsewhere. The array is
    None for the TensorArray itself, else the `source` attr of the TensorArrayGradV3: every
    TensorArrayGradV3 of one array with one source string makes the same gradient array."""
    enters, array = 0, None
    seen = set()
    while True:
        if i in seen or not view.fanin[i]:
            return None
        seen.add(i)
        src, _ = view.fanin[i][0]
        op = view.nodes[src].op
        if op in SOURCES:
            return src, array, enters
        if op in GRADIENTS:
            array = view.nodes[src].attr["source"].s if array is None else array
        elif op not in _PASS_THROUGH:
            return None  # a function argument, a call, ...: not ours to decide
        enters += op in _ENTER
        i = src


def _arrays(p):
    """{source index: [(vertex, role, array, weight)]}; role is 'source', 'writer' or
    'reader'; the gradient arrays of a TensorArray share its entry (and its dtype)."""
    groups = collections.defaultdict(list)
    broken = set()
    for i, node in enumerate(p.view.nodes):
        if node.op in SOURCES:
            groups[i].append((p.node_vertex[i].get(SOURCES[node.op]), "source", None, 0))
            continue
        role = "writer" if node.op in WRITERS else "reader" if node.op in READERS else None
        if role is None:
            continue
        found = _source(p.view, i)
        if found is None:
            continue
        source, array, enters = found
        attr = WRITERS.get(node.op) or READERS[node.op]
        vertex = p.node_vertex[i].get(attr)
        if vertex is None:
            broken.add(source)
        groups[source].append((vertex, role, array,
                               1 + (LOOP_WEIGHT - 1) * (enters > 0)))
    return {s: members for s, members in groups.items() if s not in broken}


def _casts_if(p, members, half):
    """Weighted Casts at the array's writes and reads if its elements are `half`."""
    total = 0
    for v, role, _, weight in members:
        if role == "writer":
            producers = p.fanin[v]
            total += weight * any(p.allow[u] != half for u in producers)
        elif role == "reader":
            consumers = p.consumers_of_output(p.v_node[v], 0)
            total += weight * any((c is None and half) or (c is not None and p.allow[c] != half)
                                  for c in consumers)
    return total


def _safe_in_half(p, members):
    """Half storage loses nothing: for each array (the TensorArray and each gradient array),
    every value written is already half, or every reader feeds only half ops (which round
    the values anyway)."""
    for array in {a for _, _, a, _ in members}:
        written_half = all(p.allow[u] for v, role, a, _ in members
                           if role == "writer" and a == array for u in p.fanin[v])
        read_by_half = all(c is not None and p.allow[c] for v, role, a, _ in members
                           if role == "reader" and a == array
                           for c in p.consumers_of_output(p.v_node[v], 0))
        if not (written_half or read_by_half):
            return False
    return True


def store_tensor_arrays_in_half(p):
    """Paints a TensorArray's declaration, writes and reads half where that saves Casts.

    Kind: paint (whole arrays). Needs: every rule and un-paint before it: it counts Casts around
    the final colours.
    """
    for source, members in _arrays(p).items():
        vertices = [v for v, _, _, _ in members]
        if any(v is None or p.allow[v] or p.deny[v] or not p.candidate(v) for v in vertices):
            continue
        if not _safe_in_half(p, members):
            continue
        if _casts_if(p, members, True) >= _casts_if(p, members, False):
            continue
        name = p.view.nodes[source].name
        for v in vertices:
            p.paint_allow(v, f"TensorArray {name!r} stored in half (fewer Casts at its "
                             "writes and reads)")

