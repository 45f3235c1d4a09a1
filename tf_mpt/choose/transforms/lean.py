"""lean(): a candidate's lean version, its changes applied in order (see __init__.py)."""

from tf_mpt.choose.transforms import late_casts as _late_casts
from tf_mpt.choose.transforms import loops as _loops
from tf_mpt.choose.transforms import ordering as _ordering
from tf_mpt.choose.transforms import reduce as _reduce
from tf_mpt.choose.transforms import saving as _saving
from tf_mpt.rewrite.boundaries import tensor_lists as _tensor_lists
from tf_mpt.rewrite.graph_view import GraphView
from tf_mpt.rewrite.paint import shapes as _shapes


# lean(..., new_copies=False)'s name of its "saved in half" (a verdict's lean_changes: how a
# cached verdict's lean pick is made again)
FROM_COPIES = "saved in half from half copies"


def lean(graph_def, products_in_float32=False, lists=None, shapes=None, ordered=True,
         only_ordered=False, new_copies=True, half=None, policy=None):
    """The changes in order: ordered products (with `ordered`: for a candidate holding more
    than float32 because its weight gradients are held in both dtypes), float32 products
    (with `products_in_float32`: the leaner version, for where the first still holds too
    much), saved in half (`lists`, `shapes`: see saved_in_half), reduced first, late casts,
    weights' lists in float32, late casts in loops, accumulated in order. With
    `only_ordered`: ordered products alone (the cheapest version: late casts cost a Cast per
    use, 10% of the MLP's step, where its weights' half copies cost no bytes at its peak).
    Without `new_copies`: saved in half only from the half copies the graph has (counted as
    FROM_COPIES, not "saved in half"). `half`: the copies' type in a graph with no half Casts
    (float32's own; saved_in_half). `policy`: the Policy whose late_levels and
    min_saved_elements saved in half and reduced first read (None: the default). Returns
    (GraphDef, {change: count}), a change not tried absent."""
    changes = {}
    if only_ordered:
        graph_def, changes["ordered products"] = _ordering.ordered_products(graph_def)
        return graph_def, changes
    if shapes is None:  # (inferred once, from the candidate's graph)
        shapes = _shapes.graph_def_shapes(graph_def, GraphView(graph_def))
    if ordered:
        graph_def, changes["ordered products"] = _ordering.ordered_products(graph_def)
    if products_in_float32:
        graph_def, changes["float32 products"] = _ordering.float32_products(graph_def)
    graph_def, changes["saved in half" if new_copies else FROM_COPIES] = _saving.saved_in_half(
        graph_def, lists, shapes, new_copies, half, policy)
    graph_def, changes["reduced first"] = _reduce.reduced_first(graph_def, shapes, policy)
    graph_def, changes["late casts"] = _late_casts.late_casts(graph_def)
    graph_def, changes["anchored waits"] = _ordering.anchored_waits(graph_def)
    graph_def, changes["weights' lists in float32"] = \
        _tensor_lists.float32_lists_of_variable_reads(graph_def)
    graph_def, changes["late casts in loops"] = _loops.late_casts_in_loops(graph_def)
    graph_def, changes["accumulated in order"] = _loops.accumulated_in_order(graph_def)
    return graph_def, changes
