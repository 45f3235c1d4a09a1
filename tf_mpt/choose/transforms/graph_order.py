"""The graph's order as the transforms read it: input and forward edges, reachability,
topological positions and levels, and the ops a value passes through unchanged."""

import heapq

from tensorflow.core.framework import types_pb2

from tf_mpt.rewrite import casts as _casts


# Ops whose output is their first input's buffer (or the same value, held as long): a value
# held through them is held.
PASS_THROUGH = frozenset(("Identity", "Enter", "RefEnter", "RefIdentity", "Snapshot",
                          "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                          "PreventGradient"))
# A control input from these would not mean "the other input is ready" (a Switch's control
# edge is live on either branch; a Merge's fires on the first input).
NO_TRIGGER = frozenset(("Switch", "RefSwitch", "Merge", "RefMerge", "NextIteration",
                        "RefNextIteration", "LoopCond", "Exit", "RefExit"))
# Consumers that run on any one live input: a control input from another input's producer,
# dead where that input is, would make the Cast dead where the consumer needed it.
ANY_INPUT = frozenset(("Merge", "RefMerge"))
# Graphs with these (TF1 control flow: tf.cond, while_loop) get no ordering edges: a product
# under another branch than the one it would wait for would be dead where it ran before, and a
# loop's frames cannot be crossed by a control edge.
SWITCHES = frozenset(("Switch", "RefSwitch"))
# Readers that are not moved (a loop's or a cond's plumbing; a Merge runs on any one input).
NOT_MOVED = NO_TRIGGER | frozenset(("Enter", "RefEnter"))


def input_edges(view):
    """[the nodes whose outputs node i waits for (data and control inputs), per node]:
    _reachable's edges towards a node's ancestors."""
    return [[src for src, _ in view.fanin[i]] + list(view.control_fanin[i])
            for i in range(len(view))]


def reachable(edges, i):
    """The nodes reachable from node i along `edges` ([next nodes, per node])."""
    seen, todo = {i}, [i]
    while todo:
        for k in edges[todo.pop()]:
            if k not in seen:
                seen.add(k)
                todo.append(k)
    return seen


def topological_positions(view):
    """{node: position} in one topological order (ties by GraphDef order, a tf_mpt Cast
    placed as its input's producer; a loop's NextIteration edges left out), or None where the
    graph has a cycle besides those."""
    pending, readers = forward_edges(view)
    key = list(range(len(view)))  # tf_mpt's Casts (added last) go as their input's producer
    for i, node in enumerate(view.nodes):
        if _casts.is_ours(node) and view.fanin[i]:
            key[i] = view.fanin[i][0][0]
    ready = [(key[i], i) for i in range(len(view)) if not pending[i]]
    heapq.heapify(ready)
    position = {}
    while ready:
        _, i = heapq.heappop(ready)
        position[i] = len(position)
        for reader in readers[i]:
            pending[reader] -= 1
            if not pending[reader]:
                heapq.heappush(ready, (key[reader], reader))
    return position if len(position) == len(view) else None


def back_edge(view, i):
    return view.nodes[i].op in ("NextIteration", "RefNextIteration")


def forward_edges(view):
    """([inputs to wait for, per node], [readers, per node]) over data and control edges, one
    entry per edge, a loop's NextIteration edges left out."""
    pending = [0] * len(view)
    readers = [[] for _ in range(len(view))]
    for i in range(len(view)):
        for src in [s for s, _ in view.fanin[i]] + list(view.control_fanin[i]):
            if not back_edge(view, src):
                pending[i] += 1
                readers[src].append(i)
    return pending, readers


def levels(view):
    """[longest path from a source, per node] over data and control edges (a loop's
    NextIteration edges left out), or None where the graph has a cycle besides those."""
    pending, readers = forward_edges(view)
    level = [0] * len(view)
    ready = [i for i in range(len(view)) if not pending[i]]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for reader in readers[i]:
            level[reader] = max(level[reader], level[i] + 1)
            pending[reader] -= 1
            if not pending[reader]:
                ready.append(reader)
    return level if done == len(view) else None


def as_identity(node):
    """A Cast to float32 of what is now a float32 value becomes an Identity (its name
    kept)."""
    node.op = "Identity"
    for attr in ("SrcT", "DstT", "Truncate"):
        if attr in node.attr:
            del node.attr[attr]
    node.attr["T"].type = types_pb2.DT_FLOAT


def finish(out, removed, added):
    kept = [node for node in out.node if node.name not in removed]
    del out.node[:]
    out.node.extend(kept)
    out.node.extend(added)
