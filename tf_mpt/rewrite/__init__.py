"""rewrite_graph_def / rewrite_graph: the orchestrator.

Phases, in the order the code runs them (`_rewrite_graph_def` and, per graph,
`painting.rewrite_one`); the checks of the caller's input are in inputs.py, the graphs to
paint in jobs.py, the target and the measuring step in measuring.py, phase 5's loop trials
in loop_trials.py, TF_MPT_DUMP_DIR in dumps.py:

    1. index       a GraphView of the graph; every node's ports mapped to (node, type-attr)
                   vertices (an op whose half form is a newer op version, V1 FusedBatchNorm,
                   is analysed as that version); fetched, opted-out (_tf_mpt_keep_fp32),
                   unknown and function-call nodes keep float32; with the cost model on,
                   a frozen graph's inference batch norms folded into their convolutions
                   first (fold_batch_norms.py); the library functions' bodies indexed
       measure     with the cost model on, apart from every decision: the matrix products
                   and convolutions of the graph and its functions (cost.workloads), timed on
                   this CPU for the target `here` where its cache lacks them; every later
                   decision only reads the target's table
    2. paint       the passes of `painting.PASSES`, in this order (each docstring gives its
                   Kind, paint or un-paint, and what it Needs before it; paint/):
        link_tensor_list_writers_to_readers             a TensorList's writers feed its readers
        add_allowlist_ops                               allow ops go half
        propagate_deny_forward_through_clear_and_infer  deny flows to clear/infer ops before deny
        force_colour_match_on_tensor_lists              a TensorList is one colour
        add_clear_and_infer_to_allow_if_between_allow   clear/infer between allow ops go half
        add_infer_to_allow_if_following_allow           infer ops fed by allow ops go half
        propagate_allow_through_clear                   clear ops touching allow ops go half
        repeat_infer_and_clear_until_stable             the two above until nothing changes
        match_tensor_lists_and_repeat_until_stable      list colours, then again until stable
        cast_the_selected_part_not_the_whole            un-paint: a gather casts rows, not table
        place_clear_casts_by_minimum_cut                clear ops recoloured for fewest Cast bytes
        choose_precision_by_measured_cost               the cost model: least measured time
        unpaint_split_tensor_lists                      un-paint: a list the cost model split
        store_tensor_arrays_in_half                     TensorArrays, Stacks half as a whole
        force_colour_match_on_loop_back_edges           un-paint: one colour around a back edge
        let_existing_casts_read_and_emit_half           the graph's Casts read/emit half
        store_constants_in_half                         Consts read only by half ops go half
    3. casts       apply.apply_paint: the painted dtypes set (ops renamed to their half form,
                   Consts stored in half); the editor (editor.py) inserts one Cast per
                   (tensor, dtype), shared by every reader
    4. functions   every library function the graph calls, rewritten by phases 1-3 with its
                   signature fixed (function_bodies.py)
    5. boundaries  a loop variable a body returns half but reads in float32 (a gradient
                   loop's incoming gradient) declared half, the body rewritten again, where
                   that leaves fewer Casts (_declare_loop_variables_half); then values kept
                   half across loop, call and TensorList boundaries (boundaries/)
    6. report      one report for the graph and its functions, Casts counted after phase 5
    7. verdict     (rewrite_with_library: timing=True, or a traced tf.function's step_timer)
                   where the decisions are for this CPU: the candidate colourings timed in
                   sandboxes and the fastest kept, or a verdict cached here or held by the
                   target's table (tf_mpt.choose)

Example:
    >>> result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype="bfloat16")
    >>> result.report.summary()
    'Converted 18/40 nodes to bfloat16 using 6 cast(s)'
"""

import dataclasses
import functools
import gc
import logging

from tensorflow.core.framework import graph_pb2

from tf_mpt import _dtypes
from tf_mpt import _opt_out
from tf_mpt import report as _report
from tf_mpt._process import autograph as _autograph
from tf_mpt.rewrite import boundaries as _boundaries
from tf_mpt.rewrite import dumps as _dumps
from tf_mpt.rewrite import fold_batch_norms as _fold
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.rewrite import inputs as _inputs
from tf_mpt.rewrite import jobs as _jobs
from tf_mpt.rewrite import loop_trials as _loop_trials
from tf_mpt.rewrite import measuring as _measuring
from tf_mpt.rewrite import painting as _painting
from tf_mpt.rewrite import reporting as _reporting
from tf_mpt.rewrite.paint import cost as _cost
from tf_mpt.rewrite.paint import shapes as _shapes

_log = logging.getLogger(__name__)
_autograph.leave_tf_mpt_unconverted()  # a user's tf.function calls into tf_mpt as written

GraphDefError = _graph_view.GraphDefError
RewriteError = _painting.RewriteError
with_target = _inputs.with_target
target_for = _measuring.target_for


@dataclasses.dataclass(frozen=True)
class RewriteResult:
    """What a rewrite returns.

    Attributes:
        graph_def: a new GraphDef (the input is never modified).
        report: the RewriteReport.
        modified: True if graph_def differs from the input.
    """
    graph_def: graph_pb2.GraphDef
    report: _report.RewriteReport
    modified: bool


def rewrite_graph_def(graph_def, *, dtype="float16", fetches=None, lists=None, strict=False,
                      config=None, target=None):
    """Rewrites a GraphDef to mixed precision.

    Args:
        graph_def: a GraphDef; never modified.
        dtype: 'float16' or 'bfloat16' (or tf.float16 / tf.bfloat16).
        fetches: node or tensor names whose outputs must keep their dtype. None: every node
            with no data consumers is treated as fetched.
        lists: an OpLists; None uses the defaults for `dtype` with TF_MPT_*LIST_* edits.
        strict: raise RewriteError on an internal error instead of returning the input.
        config: a tf_mpt.Config (list edits, target, dump directory); None reads the
            TF_MPT_* environment variables, as before.
        target: the machine the decisions are for: 'rules' (the op lists), 'here' (this CPU,
            measured), the path of a cost table (`tf-mpt measure --out FILE`) or 'auto';
            None: the config's (TF_MPT_TARGET). See tf_mpt.targets.

    Returns:
        RewriteResult(graph_def, report, modified).

    Raises:
        TypeError, ValueError (GraphDefError): malformed input, in both modes.
        RewriteError: an internal error, with strict=True.
    """
    return rewrite_with_library(graph_def, dtype=dtype, fetches=fetches, lists=lists,
                                strict=strict, config=config, target=target, timing=True)


def rewrite_with_library(graph_def, *, dtype, fetches, lists, strict, function_roots=(),
                         shapes=None, config=None, target=None, control_outputs=(),
                         timing=False, step_timer=None, label=None):
    """rewrite_graph_def that also rewrites the library functions named in `function_roots`
    (and what they call) when the graph itself does not call them: a SavedModel's object
    graph calls its functions from outside its GraphDef. `shapes`: a callable returning
    {node name: output shapes} of the graph, called only when the cost model is on (default:
    the nodes' `_output_shapes` attrs). `control_outputs`: names among `fetches` that only
    have to run (a tf.function's control outputs, e.g. the While of an RNN): the boundary
    passes may change their dtypes, as they do a function body's. `timing`: where the
    target is `here` and TF_MPT_TIMING_BUDGET is not 0, time the candidate colourings on this
    CPU and keep the fastest (tf_mpt.choose).
    `step_timer`: a traced tf.function's (decision.decide's timer, on copies of its
    variables), used where when.step_reason gives a reason (an INFO line says it);
    `label` names the function in the INFO lines."""
    # (the choosing step is imported here, not with this package: it imports this package's
    # passes, and a script may import either first)
    from tf_mpt.choose import decision as _decision  # pylint: disable=import-outside-toplevel
    from tf_mpt.choose import when as _when  # pylint: disable=import-outside-toplevel
    # The rewrite allocates many small objects while TensorFlow keeps ~300k tracked ones:
    # pausing the cyclic collector halves the time on large graphs (nothing here is cyclic).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        config = _inputs.with_target(config, target)
        result = _rewrite_graph_def(graph_def, dtype, fetches, lists, strict, function_roots,
                                    shapes, config, control_outputs)
        # 7. verdict: where the decisions are for this CPU, the candidates timed here
        resolved = _measuring.resolved_target(config, dtype) \
            if timing or step_timer is not None else None
        if step_timer is not None and result.report.error is None:
            why = _when.step_reason(config, resolved, result.report,
                                        compiled=getattr(step_timer, "calls_compiled",
                                                         False))
            if why is not None:
                _log.info("tf_mpt decides %s by timing its candidates: %s",
                          label or "a tf.function", why)
            timed = why is not None
        else:
            timed = result.report.error is None and timing and \
                _when.applies(config, resolved, result.report.dtype)
        if timed:
            base = lists if lists is not None else config.lists_for(result.report.dtype)

            def candidate(target_name, candidate_lists, graph):
                # (target None: the prediction's; graph None: the one given)
                return _rewrite_graph_def(
                    graph_def if graph is None else graph, dtype, fetches,
                    candidate_lists or base, strict, function_roots, shapes,
                    _inputs.with_target(config, target_name), control_outputs)
            result = _decision.decide(graph_def, result, candidate, config, fetches, base,
                                      resolved, timer=step_timer, label=label, shapes=shapes)
        return result
    finally:
        if gc_was_enabled:
            gc.enable()


def _rewrite_graph_def(graph_def, dtype, fetches, lists, strict, function_roots, shapes,
                       config, control_outputs=()):
    half = _dtypes.parse(dtype)
    _inputs.check_graph_def(graph_def)
    if lists is None:
        lists = config.lists_for(half.name)
    _inputs.check_lists(lists)
    signatures = {f.signature.name: f.signature for f in graph_def.library.function}
    target = _measuring.target_for(config, half.name)
    target = _measuring.check_dispatch(target, config, half.name, graph_def, lists)
    costed = target.costs is not None
    # 1. index (the main graph; phases 2 and 3 follow in painting.rewrite_one)
    view = _graph_view.GraphView(graph_def)
    fetched = _inputs.fetch_node_names(fetches, view)
    original, folded = graph_def, 0
    if costed:  # bfloat16 fuses conv + batch norm only once folded
        graph_def, folded = _fold.fold_batch_norms(graph_def, fetched, view)
        if folded:
            view = _graph_view.GraphView(graph_def)
    if costed and shapes is None:  # attrs, or TensorFlow's inference of the GraphDef alone
        shapes = functools.partial(_shapes.graph_def_shapes, graph_def, view)
    argument_shapes, loop_bodies = {}, set()  # what the cost model weighs bodies by
    if costed and graph_def.library.function:
        table = shapes()
        shapes = functools.partial(lambda t: t, table)
        argument_shapes = _shapes.call_argument_shapes(graph_def, table)
        loop_bodies = _cost.loop_bodies(graph_def)
    # a graph fed batches of any size is costed at TF_MPT_COST_BATCH, bodies and all
    assumed_batch = config.cost_batch if costed and \
        _shapes.batch_left_open(view, fetched) else 0
    if costed:  # one table for the measuring step and the decisions
        shapes = functools.cache(_shapes.with_assumed_batch(shapes, assumed_batch))
    main = _jobs.Job(graph_def, view, fetched, shapes, _cost.noise_floor(False))
    reachable = _jobs.reachable_functions(graph_def, function_roots)
    def function_job(fdef):
        return _jobs.function_job(fdef, signatures, costed,
                                  (graph_def.library, argument_shapes.get(fdef.signature.name),
                                   fdef.signature.name in loop_bodies), assumed_batch)

    functions = {}  # library index -> jobs.Job, or None where the body cannot be rewritten
    for index, fdef in enumerate(graph_def.library.function):
        if fdef.signature.name in reachable:  # else e.g. a While body TF replaced by its
            functions[index] = function_job(fdef)  # '_rewritten' copy: never runs
    if costed:
        target = _measuring.measure_workloads(
            target, [main] + [job for job in functions.values() if job], config, half.name)
    new_graph_def, report, modified, error = _painting.rewrite_one(
        main, half, lists, signatures, strict, target)
    if error is not None:
        unchanged = graph_pb2.GraphDef()
        unchanged.CopyFrom(original)
        return RewriteResult(unchanged, dataclasses.replace(report, target=target.label), False)
    # 4. functions
    function_reports = {}
    for index, job in functions.items():
        if job is None:
            continue
        fdef = graph_def.library.function[index]
        new_fdef, function_report = _painting.rewrite_function_body(
            fdef, job, half, lists, signatures, strict, target)
        if function_report is not None:
            function_reports[fdef.signature.name] = function_report
        if new_fdef is not None:
            new_graph_def.library.function[index].CopyFrom(new_fdef)
            modified = True
    # 5. boundaries (only functions have any)
    kept = None
    if function_reports:
        declared = _loop_trials.declare_loop_variables_half(
            graph_def, new_graph_def, functions, function_reports, function_job,
            (half, lists, signatures, strict, target), fetched - set(control_outputs))
        kept = _boundaries.keep_values_half_across_boundaries(
            new_graph_def, half.enum, fetched - set(control_outputs))
        kept.loop_variables += declared
        # also when painting changed nothing (a rewritten graph, now with fewer fetches)
        modified = modified or bool(kept)
    # 6. report
    if function_reports:
        report = _reporting.merge_function_reports(report, function_reports)
        if kept:
            report = _reporting.recount_casts(report, graph_def, new_graph_def, kept)
    if folded:
        report = dataclasses.replace(report, batch_norms_folded=folded)
        modified = True
    report = dataclasses.replace(report, target=target.label)
    if target.slow_ops or target.inaccurate_ops:
        present = {d.op for d in report.decisions.values()}
        report = dataclasses.replace(report, dispatch_kept={
            op: ratio for op, (ratio, _) in target.slow_ops.items() if op in present},
            numerics_kept={op: ratio for op, (ratio, _) in target.inaccurate_ops.items()
                           if op in present})
    if _log.isEnabledFor(logging.DEBUG):
        for decision in report.decisions.values():
            _log.debug("%s", decision)
    _log.info("%s", report.summary())
    if config.dump_dir:
        _dumps.dump(config.dump_dir, original, new_graph_def, lists, report)
    return RewriteResult(new_graph_def, report, modified)


def rewrite_graph(graph, *, dtype="float16", fetches=None, config=None, target=None):
    """Returns a new tf.Graph: `graph` rewritten to mixed precision.

    Every original node name still exists, so existing tensor names can be fed and fetched;
    collections (variables, train ops, ...) are carried over. On an internal error the new
    graph is a copy of the original (one warning is logged).

    Args:
        graph: a tf.Graph; not modified.
        dtype: 'float16' or 'bfloat16'.
        fetches: node or tensor names whose outputs keep their dtype (see rewrite_graph_def).
        config: a tf_mpt.Config, or None for the TF_MPT_* environment (see rewrite_graph_def).
        target: 'rules', 'here', a cost table's path or 'auto'; None: the config's (see
            rewrite_graph_def).
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    config = _inputs.with_target(config, target)  # a bad value raises before any work
    if not isinstance(graph, tf.Graph):
        raise TypeError(
            f"graph must be a tf.Graph. Received: graph={_inputs.short_repr(graph)} (of type "
            f"{type(graph).__name__}). For a GraphDef use tf_mpt.rewrite_graph_def.")
    try:
        with graph.as_default():  # export_meta_graph refuses to run eagerly
            meta_graph = tf.compat.v1.train.export_meta_graph(graph=graph)
    except Exception as error:  # pylint: disable=broad-except
        _log.debug("export_meta_graph failed (%s); collections are not carried over", error)
        meta_graph = None
    graph_def = meta_graph.graph_def if meta_graph is not None else graph.as_graph_def()
    result = rewrite_with_library(graph_def, dtype=dtype, fetches=fetches, lists=None,
                                  strict=False, shapes=lambda: _shapes.shapes_of_graph(graph),
                                  config=config, timing=True)
    new_graph = tf.Graph()
    with new_graph.as_default():
        if meta_graph is not None:
            meta_graph.graph_def.CopyFrom(result.graph_def)
            try:
                tf.compat.v1.train.import_meta_graph(meta_graph)
                return new_graph
            except Exception as error:  # pylint: disable=broad-except
                _log.debug("import_meta_graph failed (%s); importing the GraphDef only", error)
                new_graph = tf.Graph()
    with new_graph.as_default():
        tf.graph_util.import_graph_def(result.graph_def, name="")
    return new_graph


keep_fp32 = _opt_out.keep_fp32  # tf_mpt.rewrite.keep_fp32, as before it moved
