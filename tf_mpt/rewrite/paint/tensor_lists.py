"""TensorLists in one graph: paint flows through a list from its writes to its reads.

A TensorList is a variant tensor; its ops (`TensorListReserve`, `TensorListSetItem`,
`TensorListGetItem`, ...) each carry an `element_dtype`, and all ops of one list must agree.
The variant handle is a fixed-type port, so without help no paint crosses a list: a MatMul
writing into a list and a Tanh reading from it would see no path between them, and the list
would stay float32 with a Cast at each end. Grappler links each writer to each reader of a
list ("ephemeral edges") and treats list ops as clear; this module does the same for every
list made and used in this graph (lists carried into a While loop or a call are the boundary
pass's, `boundaries/tensor_lists.py`):

    link:   writer value vertex -> the list's maker vertex -> reader value vertex,
            every member vertex painted by the clear rules;
    match:  after painting, a list is half only as a whole: deny or a member that cannot be
            half keeps every member float32 (and denies them, so clear rules do not repaint);
            otherwise any half member makes all half.

    x -> [MatMul] -> SetItem(L) ... GetItem(L) -> Tanh -> [MatMul]   becomes
    x -> [MatMul] -> [SetItem(L)] ... [GetItem(L)] -> [Tanh] -> [MatMul], L reserved in half.
"""

import dataclasses

from tf_mpt.rewrite.paint import rules as _paint

# ops that make a list
MAKERS = frozenset({"EmptyTensorList", "TensorListReserve", "TensorListFromTensor"})
# op -> index of the value input (the element vertex types it)
WRITERS = {"TensorListPushBack": 1, "TensorListSetItem": 2, "TensorListPushBackBatch": 1}
# op -> port of the value output
READERS = {"TensorListGetItem": 0, "TensorListPopBack": 1, "TensorListStack": 0,
           "TensorListGather": 0}
# op -> port of the output that continues the list
CONTINUES = {"TensorListPushBack": 0, "TensorListSetItem": 0, "TensorListPopBack": 0,
             "TensorListResize": 0, "TensorListPushBackBatch": 0, "TensorListConcatLists": 0}
# list ops that only look at the list (no element values)
NEUTRAL = frozenset({"TensorListLength", "TensorListElementShape"})
# op -> its input ports that take a list handle (all other list ops: port 0 only)
_HANDLE_PORTS = {"TensorListConcatLists": (0, 1)}
# Ops that move handles without looking at them (a batch of lists packed, split, reshaped):
# op -> the input ports a handle may come in by (None: any); every output carries handles on.
_PASS_THROUGH = {"Identity": (0,), "Reshape": (0,), "Squeeze": (0,), "ExpandDims": (0,),
                 "Pack": None, "Unpack": (0,), "Split": (1,)}
_KEY = "element_dtype"


@dataclasses.dataclass
class ListGroup:
    """One list (or lists joined by TensorListConcatLists or a batch op): a maker's vertex
    (the hub) and every member's element vertex."""
    maker: str
    hub: int
    vertices: list


def _follow(p, maker):
    """(member nodes, broken) of the list `maker` makes; broken when the handle leaves this
    graph's list ops (a While, a call, an op we do not know) or is used as a value."""
    view = p.view
    members = [maker]
    stack, seen = [(maker, 0)], set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for dst, dst_port in view.fanout_of(tensor[0]).get(tensor[1], ()):
            op = view.nodes[dst].op
            members.append(dst)
            if op in _PASS_THROUGH:
                ports = _PASS_THROUGH[op]
                if ports is not None and dst_port not in ports:
                    return members, True
                stack.extend((dst, port) for port in view.fanout_of(dst))
                continue
            known = op in WRITERS or op in READERS or op in CONTINUES or op in NEUTRAL
            if not known or dst_port not in _HANDLE_PORTS.get(op, (0,)):
                return members, True
            if op in CONTINUES:
                stack.append((dst, CONTINUES[op]))
    # a fetched or opted-out member: its handle or values keep float32
    return members, any(p.node_skip_reason[i] is not None for i in members)


def _joined_lists(p):
    """[(maker indices, member node indices)] of the usable lists; lists that meet (packed
    into one batch, concatenated) are one, and unusable if any part is."""
    parent = {}

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner, followed = {}, {}
    for i, node in enumerate(p.view.nodes):
        if node.op not in MAKERS:
            continue
        parent[i] = i
        members, broken = _follow(p, i)
        followed[i] = (members, broken)
        for m in members:
            if m in owner:
                parent[root(i)] = root(owner[m])
            else:
                owner[m] = i
    joined = {}
    for maker, (members, broken) in followed.items():
        entry = joined.setdefault(root(maker), ([], set(), [False]))
        entry[0].append(maker)
        entry[1].update(members)
        entry[2][0] |= broken
    return [(makers, members) for makers, members, (broken,) in joined.values() if not broken]


def link_tensor_list_writers_to_readers(p):
    """Each list made in this graph gets edges writer -> maker -> reader between the element
    vertices of its ops, which are painted by the clear rules from then on.

    x -> [MatMul] -> SetItem(L) ... GetItem(L) -> Tanh   gains the edges
    SetItem.element_dtype -> Reserve(L).element_dtype -> GetItem.element_dtype.

    Kind: link (adds element edges, paints nothing). Needs: the index only; runs before every
    paint pass.
    """
    for makers, members in _joined_lists(p):
        hub = p.node_vertex[makers[0]].get(_KEY)
        if hub is None:
            continue
        vertices = []
        for m in sorted(members):
            op = p.view.nodes[m].op
            v = p.node_vertex[m].get(_KEY)
            if v is None:
                continue
            vertices.append(v)
            p.v_list[v] = "clear"
            if v == hub:
                continue
            if op in WRITERS or op == "TensorListFromTensor":
                p.fanout[v].append(hub)
                p.fanin[hub].append(v)
            if op in READERS:
                p.fanout[hub].append(v)
                p.fanin[v].append(hub)
        p.tensor_list_groups.append(ListGroup(p.view.nodes[makers[0]].name, hub, vertices))


def force_colour_match_on_tensor_lists(p):
    """A list is half only as a whole: deny, or a member that may not be half, keeps all of
    it float32 (denied, so no clear rule repaints it); else one half member makes all half.

    [SetItem(L)] ... GetItem(L)   becomes   [SetItem(L)] ... [GetItem(L)]  (no deny member).

    Kind: paint (a list's deny or half, as a whole).
    Needs: propagate_deny_forward_through_clear_and_infer.
    """
    for group in p.tensor_list_groups:
        vertices = group.vertices
        if all(p.allow[v] for v in vertices):
            continue
        blocker = next((v for v in vertices if p.deny[v]), None)
        if blocker is None:
            if not any(p.allow[v] for v in vertices):
                continue  # float32 throughout
            blocker = next((v for v in vertices if not p.allow[v] and not p.candidate(v)), None)
        if blocker is None:
            for v in vertices:
                if not p.allow[v]:
                    p.paint_allow(v, f"TensorList {group.maker!r} is half as a whole")
            continue
        why = p.reason[blocker] or p.why_not(blocker)
        reason = (f"TensorList {group.maker!r} stays float32 as a whole: its member "
                  f"{p.node_name(blocker)!r} cannot be half ({why})")
        for v in vertices:
            if p.converted[v]:
                p.unpaint(v, reason)
            if not p.allow[v]:
                p.deny[v] = True
                p.reason[v] = reason


def match_tensor_lists_and_repeat_until_stable(p):
    """The colour match, then passes 4 and 5 again (a list made half feeds infer ops that now
    follow it), until nothing changes.

    [MatMul] -> [SetItem(L)] ... GetItem(L) -> Tanh   becomes
    [MatMul] -> [SetItem(L)] ... [GetItem(L)] -> [Tanh].

    Kind: paint. Needs: repeat_infer_and_clear_until_stable.
    """
    if not p.tensor_list_groups:
        return
    while True:
        before = (sum(p.allow), sum(p.deny))
        force_colour_match_on_tensor_lists(p)
        _paint.repeat_infer_and_clear_until_stable(p)
        if (sum(p.allow), sum(p.deny)) == before:
            return


def unpaint_split_tensor_lists(p):
    """After the cost model: a list it split (some members half, some not) is float32 whole.

    [SetItem(L)] ... GetItem(L)   becomes   SetItem(L) ... GetItem(L).

    Kind: un-paint. Needs: keep_unprofitable_clusters_fp32.
    """
    for group in p.tensor_list_groups:
        vertices = group.vertices
        if all(p.allow[v] for v in vertices) or not any(p.converted[v] for v in vertices):
            continue
        for v in vertices:
            if p.converted[v]:
                p.unpaint(v, f"TensorList {group.maker!r} was split by the cost model; "
                             "it stays float32 as a whole")
