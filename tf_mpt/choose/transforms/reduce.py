"""Reduced first: a reduction of a large value to a small one (a loss) runs before the other
readers of its chain's start."""

from tensorflow.core.framework import graph_pb2

from tf_mpt.choose import policy as _policy
from tf_mpt.choose.transforms import graph_order as _graph_order
from tf_mpt.choose.transforms import saving as _saving
from tf_mpt.rewrite.graph_view import GraphView
from tf_mpt.rewrite.paint import shapes as _shapes


# reduced first: reductions (to a value of fewer than policy.min_saved_elements elements)
# and the one-input element-wise ops (and Casts) of the chain a reduction's transient is made by.
REDUCTIONS = frozenset(("Mean", "Sum", "Max", "Min", "Prod", "EuclideanNorm"))
REDUCED_CHAIN = frozenset((
    "Cast", "Square", "Abs", "Neg", "Exp", "Log", "Log1p", "Sqrt", "Rsqrt", "Reciprocal",
    "Sigmoid", "Tanh", "Softplus", "Relu", "Identity"))


def reduced_first(graph_def, shapes=None, policy=None):
    """graph_def with each reduction of a large value to a small one (a loss: the Mean of a
    Square's Cast to float32) run before the other readers of the value its chain starts
    from: the chain (element-wise ops and Casts read only by the next, REDUCED_CHAIN) is a
    transient, and the backward pass's first ops (the Square's gradient reading the same
    difference) do not allocate beside it. `shapes` as saved_in_half's. None are added in a
    graph with TF1 control flow (_SWITCHES). Large and small are by `policy`'s
    min_saved_elements (None: the default Policy's). Returns (GraphDef, reductions moved
    first)."""
    policy = policy or _policy.DEFAULT
    if any(node.op in _graph_order.SWITCHES for node in graph_def.node):
        return graph_def, 0
    view = GraphView(graph_def)
    if shapes is None:
        shapes = _shapes.graph_def_shapes(graph_def, view)
    forward, backward = None, None
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    moved = 0
    for r, node in enumerate(view.nodes):
        if node.op not in REDUCTIONS or not view.fanin[r] or \
                not 0 < _saving.elements(shapes, view, r, 0) < policy.min_saved_elements:
            continue
        chain, (k, port) = [], view.fanin[r][0]
        while view.nodes[k].op in REDUCED_CHAIN and port == 0 and view.fanin[k] and \
                not view.has_control_fanout[k] and \
                [reader for reader, _ in view.fanout_of(k).get(0, ())] == \
                [chain[-1] if chain else r] and len(view.fanout_of(k)) == 1:
            chain.append(k)
            k, port = view.fanin[k][0]
        if not chain or _saving.elements(shapes, view, k, port) < policy.min_saved_elements:
            continue
        others = {reader for reader, _ in view.fanout_of(k).get(port, ())
                  if reader not in chain and view.nodes[reader].op not in _graph_order.NOT_MOVED}
        if not others:
            continue
        if forward is None:
            _, forward = _graph_order.forward_edges(view)
            backward = _graph_order.input_edges(view)
        # (not an ancestor of the reduction: a cycle; nor a descendant: it waits already)
        others -= _graph_order.reachable(backward, r) | _graph_order.reachable(forward, r)
        for reader in sorted(others):
            nodes[reader].input.append(f"^{node.name}")
        moved += bool(others)
    return (out, moved) if moved else (graph_def, 0)
