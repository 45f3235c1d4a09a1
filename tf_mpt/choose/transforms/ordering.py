"""Ordered products, float32 products and anchored waits: when a weight gradient's half
product and its Casts run, and what waits for an arithmetic chain's start."""

import collections

from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import types_pb2

from tf_mpt.choose.transforms import graph_order as _graph_order
from tf_mpt.choose.transforms import late_casts as _late_casts
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import type_attrs as _ta
from tf_mpt.rewrite.graph_view import GraphView, parse_input


PRODUCTS = frozenset(("MatMul", "BatchMatMul", "BatchMatMulV2"))
# anchored waits: element-wise arithmetic that Grappler's constant folding and arithmetic
# optimizer may rewrite in place (reassociating a chain of products or sums by a constant,
# keeping the nodes' names).
ARITHMETIC = frozenset(("Mul", "AddV2", "Add", "Sub", "RealDiv", "Div", "DivNoNan", "MulNoNan",
                        "Neg", "BiasAdd"))


def ordered_products(graph_def):
    """graph_def with its half matrix products that are read only as float32 (weights'
    gradients, on their way to a float32 optimizer) ordered: each runs after the other
    products reading its inputs (the gradient with respect to the layer's input) and after
    the previous one's Casts to float32, so two weight gradients are not held in both dtypes
    at once; its Casts to float32 wait for the first readers of those other products (past
    Identity: a ReluGrad of the input's gradient), so what those readers free (an
    activation) is not held beside the weight gradient in both dtypes. Edges between
    products go along one topological order of the graph (no cycle can form); a Cast's are
    not added where they would make one. None are added in a graph with TF1 control flow
    (_SWITCHES). Returns (GraphDef, products ordered)."""
    if any(node.op in _graph_order.SWITCHES for node in graph_def.node):
        return graph_def, 0
    view = GraphView(graph_def)
    position = _graph_order.topological_positions(view)
    if position is None:
        return graph_def, 0
    gradients = []  # (position, product, its Casts to float32)
    for i, node in enumerate(view.nodes):
        if node.op in PRODUCTS and node.attr["T"].type in _ta.HALF_TYPES:
            found = _read_as_float32(view, i, node.attr["T"].type)
            if found is not None:
                gradients.append((position[i], i, found[1]))
    gradients.sort()
    _, forward = _graph_order.forward_edges(view)
    backward = _graph_order.input_edges(view)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    ordered, previous, cast_waits = set(), (), []
    for _, i, casts in gradients:
        before = {k for k in previous if position[k] < position[i]}
        siblings = set()
        for src, port in view.fanin[i]:
            siblings.update(reader for reader, _ in view.fanout_of(src).get(port, ())
                            if reader != i and view.nodes[reader].op in PRODUCTS)
        before.update(k for k in siblings if position[k] < position[i])
        before -= set(view.control_fanin[i])
        for k in sorted(before):
            nodes[i].input.append(f"^{view.nodes[k].name}")
        if before:
            ordered.add(i)
        previous = casts
        waits = set()
        for k in siblings:
            waits.update(_first_readers(view, k))
        waits -= set(casts) | {i}
        for cast in casts:  # (not its descendants: a cycle; nor its ancestors: no need)
            waits_for = waits - _graph_order.reachable(forward, cast) - \
                _graph_order.reachable(backward, cast)
            cast_waits.extend((i, cast, k) for k in sorted(waits_for))
    if cast_waits:
        # Each weight gradient's Casts to float32 also wait for the readers of the products
        # beside it (a ReluGrad of the input's gradient): the activation those readers free
        # is not held while the weight gradient is held in both dtypes.
        plain = graph_pb2.GraphDef()
        plain.CopyFrom(out)
        for _, cast, k in cast_waits:
            nodes[cast].input.append(f"^{view.nodes[k].name}")
        if _graph_order.topological_positions(GraphView(out)) is None:  # (a cycle: not added)
            out = plain
        else:
            ordered.update(i for i, _, _ in cast_waits)
    return (out, len(ordered)) if ordered else (graph_def, 0)


def _first_readers(view, i):
    """The data readers of node i's output 0 past pass-through nodes (Identity ...), leaving
    out products, loop and cond plumbing."""
    found, todo, seen = [], [i], {i}
    while todo:
        k = todo.pop()
        for reader, _ in view.fanout_of(k).get(0, ()):
            if reader in seen:
                continue
            seen.add(reader)
            op = view.nodes[reader].op
            if op in _graph_order.PASS_THROUGH and len(seen) < 64:
                todo.append(reader)
            elif op not in PRODUCTS and op not in _graph_order.NOT_MOVED:
                found.append(reader)
    return found


def _read_as_float32(view, i, half):
    """(pass-through nodes, Casts) where node i's only output is read, through Identity
    nodes of its own (`_PASS_THROUGH`, one output each), only by Casts from `half` to float32
    (at least one); else None."""
    through, readers, todo = [], [], [i]
    while todo:
        k = todo.pop()
        fanout = view.fanout_of(k)
        if set(fanout) != {0}:  # (control readers only wait for it)
            return None
        for reader, _ in fanout[0]:
            node = view.nodes[reader]
            if _casts.is_cast(node, half, types_pb2.DT_FLOAT):
                readers.append(reader)
            elif node.op in ("Identity", "Snapshot") and len(view.fanin[reader]) == 1 and \
                    node.attr["T"].type == half and len(through) < 16:
                through.append(reader)
                todo.append(reader)
            else:
                return None
    return (through, readers) if readers else None


def float32_products(graph_def):
    """graph_def with its half matrix products read only as float32 computed in float32: the
    product's inputs are the float32 tensors the candidate cast from (or new Casts to
    float32), the Casts of its result become Identities (their names kept). Returns
    (GraphDef, products changed)."""
    view = GraphView(graph_def)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    taken = {node.name for node in nodes}
    changed, added, maybe_unread = 0, [], set()
    for i, node in enumerate(view.nodes):
        if node.op not in PRODUCTS or node.attr["T"].type not in _ta.HALF_TYPES:
            continue
        half = node.attr["T"].type
        found = _read_as_float32(view, i, half)
        if found is None:
            continue
        through, readers = found
        product = nodes[i]
        product.attr["T"].type = types_pb2.DT_FLOAT
        for port, (src, _) in enumerate(view.fanin[i]):
            producer = view.nodes[src]
            if _casts.is_cast(producer, types_pb2.DT_FLOAT, half):
                product.input[port] = producer.input[0]
                maybe_unread.add(producer.name)
            else:
                cast = _casts.new_cast(taken, product.input[port], half, types_pb2.DT_FLOAT,
                                       product.device)
                product.input[port] = cast.name
                added.append(cast)
        for k in through:
            nodes[k].attr["T"].type = types_pb2.DT_FLOAT
        for reader in readers:
            _graph_order.as_identity(nodes[reader])
        changed += 1
    if not changed:
        return graph_def, 0
    read = collections.Counter(parse_input(name)[0] for node in list(nodes) + added
                               for name in node.input)
    _graph_order.finish(out, {name for name in maybe_unread if not read[name]}, added)
    return out, changed


def _chain_start(view, i, level):
    """The op that starts node i's chain of ARITHMETIC ops: from i, its deepest data input
    that may be waited on (late_casts.may_wait_on), while the node reached is ARITHMETIC; i
    itself where it has no such input. (Called on graphs without TF1 control flow only: no
    Enter.)"""
    while view.nodes[i].op in ARITHMETIC:
        inputs = [src for src, _ in view.fanin[i] if _late_casts.may_wait_on(view, src)]
        if not inputs:
            break
        i = max(inputs, key=lambda src: level[src])
    return i


def anchored_waits(graph_def):
    """graph_def with each control input from an ARITHMETIC op doubled by one from the op
    that starts its chain (see the module's docstring): what waits for the op still waits
    where Grappler folds the op into a constant. Not in a graph with TF1 control flow
    (_SWITCHES). Returns (GraphDef, control inputs added)."""
    if any(node.op in _graph_order.SWITCHES for node in graph_def.node):
        return graph_def, 0
    view = GraphView(graph_def)
    if not any(view.nodes[src].op in ARITHMETIC
               for controls in view.control_fanin for src in controls):
        return graph_def, 0
    level = _graph_order.levels(view)
    if level is None:
        return graph_def, 0
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    added = 0
    for i, controls in enumerate(view.control_fanin):
        waited = set(controls) | {src for src, _ in view.fanin[i]}
        for src in controls:
            if view.nodes[src].op not in ARITHMETIC:
                continue
            start = _chain_start(view, src, level)
            if start not in waited:
                out.node[i].input.append(f"^{view.nodes[start].name}")
                waited.add(start)
                added += 1
    return (out, added) if added else (graph_def, 0)
