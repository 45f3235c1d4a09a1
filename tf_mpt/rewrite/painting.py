"""Phases 1-3 for one graph (the main graph, or one library function's body): index its
(node, type-attr) vertices, run the paint passes of PASSES in order, set the painted dtypes
and insert the Casts; on an internal error the graph is left as it was."""

import functools
import logging

from tf_mpt import report as _report
from tf_mpt.rewrite import apply as _apply
from tf_mpt.rewrite import function_bodies as _function_library
from tf_mpt.rewrite import inputs as _inputs
from tf_mpt.rewrite import reporting as _reporting
from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.paint import cuts as _cuts
from tf_mpt.rewrite.paint import rules as _paint
from tf_mpt.rewrite.paint import shapes as _shapes
from tf_mpt.rewrite.paint import tensor_arrays as _arrays
from tf_mpt.rewrite.paint import tensor_lists as _list_paint

_log = logging.getLogger("tf_mpt.rewrite")

PASSES = (
    ("link_tensor_list_writers_to_readers", _list_paint.link_tensor_list_writers_to_readers),
    ("add_allowlist_ops", _paint.add_allowlist_ops),
    ("propagate_deny_forward_through_clear_and_infer",
     _paint.propagate_deny_forward_through_clear_and_infer),
    ("force_colour_match_on_tensor_lists", _list_paint.force_colour_match_on_tensor_lists),
    ("add_clear_and_infer_to_allow_if_between_allow",
     _paint.add_clear_and_infer_to_allow_if_between_allow),
    ("add_infer_to_allow_if_following_allow", _paint.add_infer_to_allow_if_following_allow),
    ("propagate_allow_through_clear", _paint.propagate_allow_through_clear),
    ("repeat_infer_and_clear_until_stable", _paint.repeat_infer_and_clear_until_stable),
    ("match_tensor_lists_and_repeat_until_stable",
     _list_paint.match_tensor_lists_and_repeat_until_stable),
    ("cast_the_selected_part_not_the_whole", _paint.cast_the_selected_part_not_the_whole),
    ("place_clear_casts_by_minimum_cut", _cuts.place_clear_casts_by_minimum_cut),
    ("choose_precision_by_measured_cost", _cuts.choose_precision_by_measured_cost),
    ("unpaint_split_tensor_lists", _list_paint.unpaint_split_tensor_lists),
    ("store_tensor_arrays_in_half", _arrays.store_tensor_arrays_in_half),
    ("force_colour_match_on_loop_back_edges", _paint.force_colour_match_on_loop_back_edges),
    ("let_existing_casts_read_and_emit_half", _paint.let_existing_casts_read_and_emit_half),
    ("store_constants_in_half", _paint.store_constants_in_half),
)


class RewriteError(RuntimeError):
    """An internal error in a rewrite pass (raised only with strict=True)."""


def rewrite_one(job, half, lists, signatures, strict, target):
    """Paints one graph (no library), a jobs.Job, for `target` (bound: target_for). Returns
    (graph_def, report, modified, error or None).

    With the cost model on (target.costs), job.shapes gives the table it weighs (an unknown
    batch already assumed); else only a pass that needs shapes calls it.
    """
    graph_def, view = job.graph_def, job.view
    # 1. index: (node, type-attr) vertices
    types = [ta.node_types(node, signatures) for node in view.nodes]
    skip = _inputs.node_skip_reasons(view, types, job.fetched, target.slow_ops, half.name,
                                     lists.allow, target.inaccurate_ops)
    paint = _paint.Paint(view, types, half, lists, skip,
                         ta.default_device_type())
    paint.shape_source = job.shapes or functools.partial(_shapes.output_shapes_from_attrs,
                                                         view)
    if target.costs is not None:
        paint.cost = (target, paint.static_shapes(), job.noise_floor)
    step = "build"
    try:
        # 2. paint
        for step, run_pass in PASSES:
            run_pass(paint)
        # 3. casts
        step = "insert_casts"
        new_graph_def, cast_names = _apply.apply_paint(graph_def, view, types, paint)
        step = "build_report"
        report = _reporting.build_report(paint, cast_names, _paint.explain_unpainted)
    except Exception as error:  # pylint: disable=broad-except
        if strict:
            raise RewriteError(f"tf_mpt rewrite failed in pass {step}: "
                               f"{type(error).__name__}: {error}") from error
        _log.warning("tf_mpt rewrite failed in pass %s (%s: %s); the graph is left unchanged "
                     "in float32.", step, type(error).__name__, error)
        message = f"pass {step}: {type(error).__name__}: {error}"
        report = _report.RewriteReport(dtype=half.name, total_nodes=len(view.nodes),
                                       converted_nodes=0, casts_added=0, error=message)
        return graph_def, report, False, message
    modified = any(paint.converted) or bool(cast_names)
    return new_graph_def, report, modified, None


def rewrite_function_body(fdef, job, half, lists, signatures, strict, target):
    """Rewrites one library function (its jobs.Job), its signature unchanged.

    Returns (new FunctionDef or None if unchanged, report or None if not rewritable).
    """
    name = fdef.signature.name
    new_body, report, modified, error = rewrite_one(job, half, lists, signatures, strict,
                                                     target)
    if error is not None or not modified:
        return None, report
    try:
        return _function_library.graph_def_to_function(new_body, fdef, signatures), report
    except Exception as error:  # pylint: disable=broad-except
        if strict:
            raise RewriteError(f"tf_mpt could not rebuild function {name}: {error}") from error
        _log.warning("tf_mpt could not rebuild function %s (%s: %s); it is left unchanged in "
                     "float32.", name, type(error).__name__, error)
        return None, None
