"""The graphs a rewrite paints: the main graph and each library function's body it reaches,
as Jobs (a GraphDef, its index, what keeps its dtypes, its shapes, its noise floor)."""

import dataclasses
import functools
import logging

from tf_mpt.rewrite import function_bodies as _function_library
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.rewrite.paint import cost as _cost
from tf_mpt.rewrite.paint import shapes as _shapes

_log = logging.getLogger("tf_mpt.rewrite")


@dataclasses.dataclass
class Job:
    """One graph to paint: the main graph, or a library function's body as a GraphDef.

    Attributes:
        graph_def / view / fetched: the graph, its index, the names whose outputs keep their
            dtypes.
        shapes: a callable giving {node name: output shapes} (called once, its table kept),
            or None for the `_output_shapes` attrs.
        noise_floor: seconds the cost model's changes must save in all (cost.noise_floor).
    """
    graph_def: object
    view: object
    fetched: set
    shapes: object
    noise_floor: float


def reachable_functions(graph_def, roots=()):
    """Names of library functions the graph (or `roots`) calls, directly or through others."""
    library = {f.signature.name: f for f in graph_def.library.function}
    gradients = {g.function_name: g.gradient_func for g in graph_def.library.gradient}
    seen, stack = set(), []

    def visit(nodes):
        for node in nodes:
            names = [node.op] + [func.name for func in _function_library.called_functions(node)]
            for name in names:
                if name in library and name not in seen:
                    seen.add(name)
                    stack.append(name)

    visit(graph_def.node)
    for name in roots:
        if name in library and name not in seen:
            seen.add(name)
            stack.append(name)
    while stack:
        name = stack.pop()
        if gradients.get(name) in library and gradients[name] not in seen:
            seen.add(gradients[name])
            stack.append(gradients[name])
        visit(library[name].node_def)
    return seen


def function_job(fdef, signatures, costed, callers, assumed_batch):
    """The Job of one library function's body, or None if it cannot be rewritten (it is
    then left as it is).

    costed: the cost model is on (the body's shapes are then inferred, once).
    callers: (the graph's FunctionDefLibrary, [shape or None per argument] from its callers
        or None, True if it is a While body): what the cost model infers the body's shapes
        from, and whether its savings repeat every iteration (no noise floor).
    assumed_batch: the size the cost model gives an unknown leading dimension (0: none).
    """
    try:
        body, fetches = _function_library.function_to_graph_def(fdef, signatures)
        view = _graph_view.GraphView(body)
    except (_function_library.UnsupportedFunction, _graph_view.GraphDefError) as error:
        _log.debug("function %s is left as it is: %s", fdef.signature.name, error)
        return None
    library, argument_shapes, loop_body = callers
    shapes = None
    if costed:
        shapes = functools.cache(_shapes.with_assumed_batch(functools.partial(
            _shapes.function_body_shapes, body, fdef, library, argument_shapes),
            assumed_batch))
    return Job(body, view, set(fetches), shapes, _cost.noise_floor(loop_body))
