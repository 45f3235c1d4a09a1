"""Values that stay half across boundaries, in the main graph and inside every function.

Runs the three boundary passes (While loop variables `_loops`, call/If/Case arguments and
results `_calls`, TensorLists carried by While loops `_tensor_lists`) on the main graph, then
on the body of each library function that holds a While or a call: a function body is a
graph of its own (its arguments and return values keep their dtypes), so a loop inside a
function called from the main graph (a SavedModel's signature wrapper calling the model, a
tf.function calling another) is treated like one in the main graph.
"""

import dataclasses

from tf_mpt.rewrite.boundaries import bodies as _bodies
from tf_mpt.rewrite.boundaries import calls as _calls
from tf_mpt.rewrite import function_bodies as _function_library
from tf_mpt.rewrite.boundaries import loops as _loops
from tf_mpt.rewrite.boundaries import tensor_lists as _tensor_lists

_BOUNDARY_OPS = frozenset(_calls.CALL_OPS) | {"While", "StatelessWhile"}


@dataclasses.dataclass
class Counts:
    loop_variables: int = 0
    call_values: int = 0
    tensor_lists: int = 0

    def add(self, other):
        self.loop_variables += other.loop_variables
        self.call_values += other.call_values
        self.tensor_lists += other.tensor_lists

    def __bool__(self):
        return bool(self.loop_variables or self.call_values or self.tensor_lists)


def _run(graph_def, half, fetched, library):
    return Counts(_loops.keep_loop_variables_half(graph_def, half, fetched, library),
                  _calls.keep_call_values_half(graph_def, half, fetched, library),
                  _tensor_lists.keep_tensor_lists_half(graph_def, half, library))


def keep_values_half_across_boundaries(graph_def, half, fetched):
    """Runs the boundary passes on `graph_def` (in place) and on its functions' bodies, again
    until they switch nothing more: a switch inside a function (a loop variable kept half,
    with a Cast to half of the argument that feeds it) can make one at its callers worth it,
    which a single pass from the main graph down would leave to the next rewrite.

    Returns the Counts of values switched to half.
    """
    counts = Counts()
    while True:
        found = _sweep(graph_def, half, fetched)
        if not found:
            return counts
        counts.add(found)


def _sweep(graph_def, half, fetched):
    """The boundary passes once on the main graph, then once on each function body (as a
    GraphDef of its own, sharing one Library: linear in the size of the graph)."""
    library = _bodies.Library(graph_def)
    counts = _run(graph_def, half, fetched, library)
    for fdef in [f for f in graph_def.library.function
                 if any(n.op in _BOUNDARY_OPS for n in f.node_def)]:
        try:
            body, fetches = _function_library.function_to_graph_def(fdef, library.signatures)
        except _function_library.UnsupportedFunction:
            continue
        # Control outputs only have to run: their dtypes may change.
        found = _run(body, half, set(fetches) - set(fdef.control_ret.values()), library)
        if found:
            counts.add(found)
            fdef.CopyFrom(_function_library.graph_def_to_function(body, fdef, library.signatures))
    return counts
