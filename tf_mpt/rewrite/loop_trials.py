"""Phase 5's first step: loop variables a rewritten While body returns half but reads in
float32 (a gradient loop's incoming gradient) declared half, the body rewritten again, kept
where the graph then runs fewer Casts."""

import logging

from tensorflow.core.framework import graph_pb2

from tf_mpt.rewrite import boundaries as _boundaries
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import painting as _painting
from tf_mpt.rewrite.boundaries import bodies as _bodies
from tf_mpt.rewrite.boundaries import loops as _loops
from tf_mpt.rewrite.paint import cost as _cost

_log = logging.getLogger("tf_mpt.rewrite")


# How many times a loop body is rewritten again with more of its loop variables declared half
# (each round may make another one a body returns in half).
DECLARE_ROUNDS = 3


def _casts_after_boundaries(graph_def, half, fetched):
    """(tf_mpt's Casts in While bodies, in all) of a copy of `graph_def` after phase 5: what
    a choice of phase 5's first step is judged by (the boundary passes remove many Casts of
    a loop body, e.g. at a gradient's TensorLists)."""
    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)
    _boundaries.keep_values_half_across_boundaries(copy, half.enum, fetched)
    bodies = _cost.loop_bodies(copy)
    in_loops = sum(_casts.our_casts(f.node_def) for f in copy.library.function
                   if f.signature.name in bodies)
    everywhere = sum(_casts.our_casts(f.node_def) for f in copy.library.function)
    return in_loops, everywhere + _casts.our_casts(copy.node)


def _with_declared(graph_def, index, new_fdef, while_name, indices, signatures, half,
                   fetched):
    """A copy of `graph_def` whose library function `index` is `new_fdef` (a body rewritten
    with `indices` declared half) and whose While `while_name` carries them in half."""
    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)
    copy.library.function[index].CopyFrom(new_fdef)
    node = next(n for n in copy.node if n.name == while_name)
    cond = next(f for f in copy.library.function
                if f.signature.name == node.attr["cond"].func.name)
    _loops.switch_declared(copy, node, indices, cond, signatures, half.enum, fetched)
    return copy


def declare_loop_variables_half(graph_def, new_graph_def, functions, reports, function_job,
                                 settings, fetched):
    """Phase 5's first step: a float32 loop variable of a main-graph While that its rewritten
    body returns through a Cast to float32 but reads in float32 (a gradient loop's incoming
    gradient) has its body rewritten again from the original with it declared half, so its
    readers are painted from a half source. Kept where the graph then runs fewer of tf_mpt's
    Casts in loop bodies after the boundary passes (then fewer in all); the While then
    carries it in half (loops.switch_declared).

    graph_def / new_graph_def: the input and the rewritten graph (edited in place);
    functions: library index -> jobs.Job or None; reports: function name -> report (updated);
    function_job: FunctionDef -> jobs.Job; settings: (half, lists, signatures, strict, target).
    Returns the number of loop variables declared half.
    """
    half, lists, signatures, strict, target = settings
    position = {f.signature.name: k for k, f in enumerate(graph_def.library.function)}
    declared, score = 0, None
    library = _bodies.Library(new_graph_def)  # built again when a trial is kept
    for name in [n.name for n in _bodies.switchable_nodes(new_graph_def, _loops.WHILE_OPS,
                                                            fetched)]:
        node = next(n for n in new_graph_def.node if n.name == name)
        body_name, cond_name = node.attr["body"].func.name, node.attr["cond"].func.name
        index = position.get(body_name)
        if index is None or functions.get(index) is None or \
                cond_name not in library.functions or \
                library.references.get(body_name) != 1 or \
                library.references.get(cond_name) != 1:
            continue
        cond = library.functions[cond_name]
        indices = _loops.returned_half_read_float32(library.functions[body_name], signatures,
                                                    half.enum, cond)
        chosen = None
        for _ in range(DECLARE_ROUNDS):
            if not indices:
                break
            original = _loops.declared_half(graph_def.library.function[index], indices,
                                            half.enum)
            job = function_job(original)
            if job is None:
                break
            try:  # a trial: a failure leaves the body as phase 4 rewrote it, quietly
                new_fdef, report = _painting.rewrite_function_body(original, job, half, lists,
                                                          signatures, True, target)
            except _painting.RewriteError as error:
                if strict:
                    raise
                _log.debug("loop variables %s of %s are not declared half: %s", indices,
                           body_name, error)
                break
            if new_fdef is None:
                break
            trial = _with_declared(new_graph_def, index, new_fdef, name, indices, signatures,
                                   half, fetched)
            if score is None:
                score = _casts_after_boundaries(new_graph_def, half, fetched)
            trial_score = _casts_after_boundaries(trial, half, fetched)
            if trial_score < score:
                chosen, score = (trial, report, len(indices)), trial_score
            more = _loops.returned_half_read_float32(new_fdef, signatures, half.enum, cond)
            if not more:
                break
            indices = sorted(set(indices) | set(more))
        if chosen is not None:
            trial, reports[body_name], count = chosen
            new_graph_def.CopyFrom(trial)
            library = _bodies.Library(new_graph_def)
            declared += count
    return declared
