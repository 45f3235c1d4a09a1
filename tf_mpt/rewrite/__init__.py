"""rewrite_graph_def / rewrite_graph: the orchestrator.

Phases, in the order the code runs them (`_rewrite_graph_def` and, per graph, `_rewrite_one`):

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
    2. paint       the passes of `_PASSES`, in this order (each docstring gives its Kind,
                   paint or un-paint, and what it Needs before it; paint/):
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

Example:
    >>> result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype="bfloat16")
    >>> result.report.summary()
    'Converted 18/40 nodes to bfloat16 using 6 cast(s)'
"""

import dataclasses
import functools
import gc
import itertools
import logging
import os

from tensorflow.core.framework import graph_pb2

from tf_mpt.rewrite.paint import tensor_arrays as _arrays
from tf_mpt.rewrite import apply as _apply
from tf_mpt.rewrite import boundaries as _boundaries
from tf_mpt.rewrite.boundaries import bodies as _bodies
from tf_mpt.rewrite.boundaries import loops as _loops
from tf_mpt.rewrite.paint import cost as _cost
from tf_mpt.rewrite.paint import op_costs as _op_costs
from tf_mpt.rewrite.paint import shapes as _shapes
from tf_mpt.rewrite.paint import cuts as _cuts
from tf_mpt.rewrite import function_bodies as _function_library
from tf_mpt.rewrite import fold_batch_norms as _fold
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.rewrite import reporting as _reporting
from tf_mpt.rewrite.paint import tensor_lists as _list_paint
from tf_mpt.rewrite.paint import rules as _paint
from tf_mpt.rewrite import type_attrs as ta
from tf_mpt import _autograph
from tf_mpt import _state
from tf_mpt import _dtypes
from tf_mpt import _opt_out
from tf_mpt import config as _config
from tf_mpt import lists as _lists
from tf_mpt import report as _report
from tf_mpt import targets as _targets

_log = logging.getLogger(__name__)
_autograph.leave_tf_mpt_unconverted()  # a user's tf.function calls into tf_mpt as written

GraphDefError = _graph_view.GraphDefError

_PASSES = (
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

_dump_counter = itertools.count()


class RewriteError(RuntimeError):
    """An internal error in a rewrite pass (raised only with strict=True)."""


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


def _check_graph_def(graph_def):
    if isinstance(graph_def, graph_pb2.GraphDef):
        return
    hint = ""
    if hasattr(graph_def, "as_graph_def"):
        hint = " For a tf.Graph call tf_mpt.rewrite_graph(graph) or pass graph.as_graph_def()."
    raise TypeError(
        "graph_def must be a GraphDef protocol buffer (tf.compat.v1.GraphDef). "
        f"Received: graph_def={_short_repr(graph_def)} (of type {type(graph_def).__name__}).{hint}")


def _short_repr(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_lists(lists):
    if not isinstance(lists, _lists.OpLists):
        raise TypeError(
            "lists must be a tf_mpt.OpLists (e.g. tf_mpt.default_lists('float16').edited(...))"
            f" or None. Received: lists={_short_repr(lists)} (of type {type(lists).__name__})")


def _fetch_node_names(fetches, view):
    """Node names whose outputs keep their dtype."""
    if fetches is None:
        return {node.name for i, node in enumerate(view.nodes) if not view.has_data_fanout(i)}
    if isinstance(fetches, (str, bytes)) or hasattr(fetches, "name"):
        fetches = [fetches]
    names = set()
    for fetch in fetches:
        text = fetch.decode() if isinstance(fetch, bytes) else getattr(fetch, "name", fetch)
        if not isinstance(text, str):
            raise TypeError(
                "fetches must be node or tensor names (e.g. 'loss' or 'loss:0'), tensors or "
                f"operations. Received an entry {_short_repr(fetch)} of type {type(fetch).__name__}")
        name, _ = _graph_view.parse_input(text)
        if name not in view.index:
            raise ValueError(
                f"fetches names {text!r}, but the graph has no node {name!r}. Pass names of "
                "nodes in the graph (e.g. 'loss' or 'loss:0').")
        names.add(name)
    return names


def _node_skip_reasons(view, types, fetched):
    reasons = []
    for node, nt in zip(view.nodes, types):
        if not nt.known:
            reason = f"unknown op {node.op} (not registered): kept float32"
        elif nt.is_function:
            reason = f"call of library function {node.op}: kept float32"
        elif node.name in fetched:
            reason = _paint.FETCHED
        elif ta.KEEP_FP32_ATTR in node.attr and node.attr[ta.KEEP_FP32_ATTR].b:
            reason = f"opted out with attr {ta.KEEP_FP32_ATTR}"
        else:
            reason = None
        reasons.append(reason)
    return reasons


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
                                strict=strict, config=config, target=target)


def rewrite_with_library(graph_def, *, dtype, fetches, lists, strict, function_roots=(),
                         shapes=None, config=None, target=None, control_outputs=()):
    """rewrite_graph_def that also rewrites the library functions named in `function_roots`
    (and what they call) when the graph itself does not call them: a SavedModel's object
    graph calls its functions from outside its GraphDef. `shapes`: a callable returning
    {node name: output shapes} of the graph, called only when the cost model is on (default:
    the nodes' `_output_shapes` attrs). `control_outputs`: names among `fetches` that only
    have to run (a tf.function's control outputs, e.g. the While of an RNN): the boundary
    passes may change their dtypes, as they do a function body's."""
    # The rewrite allocates many small objects while TensorFlow keeps ~300k tracked ones:
    # pausing the cyclic collector halves the time on large graphs (nothing here is cyclic).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _rewrite_graph_def(graph_def, dtype, fetches, lists, strict, function_roots,
                                  shapes, with_target(config, target), control_outputs)
    finally:
        if gc_was_enabled:
            gc.enable()


def _check_config(config):
    """The Config to use: `config`, or one parsed from the environment when None."""
    if config is None:
        return _config.Config.from_env(os.environ)
    if not isinstance(config, _config.Config):
        raise TypeError(
            "config must be a tf_mpt.Config (e.g. tf_mpt.Config.from_env({...})) or None. "
            f"Received: config={_short_repr(config)} (of type {type(config).__name__})")
    return config


def with_target(config, target):
    """`config` (None: the environment's) with `target` when one is given; ValueError for a
    bad target, TypeError for a bad config."""
    config = _check_config(config)
    if target is None:
        return config
    return dataclasses.replace(config, target=_targets.parse(target))


def target_for(config, dtype):
    """The tf_mpt.targets.Target a rewrite to `dtype` with `config` decides for (a GPU seen by
    TensorFlow counts: `auto` then follows the op lists), bound to what its decisions read
    (op_costs.bind: its table, machine, fusions, threads): made once per rewrite and passed
    down. Raises ValueError for a bad table file."""
    name = _dtypes.parse(dtype).name
    target = _targets.resolve(config, name, gpu_visible=ta.default_device_type() == "GPU")
    _targets.say_why_once(target, name)
    return _op_costs.bind(target, config, name)


@dataclasses.dataclass
class _Job:
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


def _measure_workloads(target, jobs, config, dtype):
    """The measuring step, apart from every decision: the op types and the matrix products
    and convolutions with static shapes of every graph (cost.cost_keys, cost.workloads),
    for the target `here` timed on this CPU where its cache lacks them (one child process
    for the process, op_costs.ProbeServer), recorded for `tf-mpt measure --model`. Returns
    the target bound to the table the decisions then only read (its costs None where
    measuring failed: the op lists decide, as said in one warning)."""
    try:
        ops, specs = set(), set()
        for job in jobs:
            ops |= _cost.cost_keys(job.view)
            specs |= _cost.workloads(job.view, job.shapes())
        if target.measures:
            target = dataclasses.replace(
                target, costs=_op_costs.costs_for(config, dtype, ops))
            if target.costs is None:
                return target
        target.costs.measure_nodes(specs)
    except Exception as error:  # pylint: disable=broad-except
        _state.warn_once(("measure_workloads", type(error).__name__),
                         "tf_mpt could not collect or time the matrix product / convolution "
                         "shapes of a graph (%s: %s); its cost model uses its per-op lines for "
                         "them", type(error).__name__, error)
    return target


def _rewrite_graph_def(graph_def, dtype, fetches, lists, strict, function_roots, shapes,
                       config, control_outputs=()):
    half = _dtypes.parse(dtype)
    _check_graph_def(graph_def)
    if lists is None:
        lists = config.lists_for(half.name)
    _check_lists(lists)
    signatures = {f.signature.name: f.signature for f in graph_def.library.function}
    target = target_for(config, half.name)
    costed = target.costs is not None
    # 1. index (the main graph; phases 2 and 3 follow in _rewrite_one)
    view = _graph_view.GraphView(graph_def)
    fetched = _fetch_node_names(fetches, view)
    original, folded = graph_def, 0
    if costed:  # bfloat16 fuses conv + batch norm only once folded
        graph_def, folded = _fold.fold_batch_norms(graph_def, fetched, view)
        if folded:
            view = _graph_view.GraphView(graph_def)
    argument_shapes, loop_bodies = {}, set()  # what the cost model weighs bodies by
    if costed and graph_def.library.function:
        table = shapes() if shapes is not None else _shapes.output_shapes_from_attrs(view)
        shapes = functools.partial(dict, table)
        argument_shapes = _shapes.call_argument_shapes(graph_def, table)
        loop_bodies = _cost.loop_bodies(graph_def)
    # a graph fed batches of any size is costed at TF_MPT_COST_BATCH, bodies and all
    assumed_batch = config.cost_batch if costed and \
        _shapes.batch_left_open(view, fetched) else 0
    if costed:  # one table for the measuring step and the decisions
        shapes = functools.cache(_shapes.with_assumed_batch(
            shapes or functools.partial(_shapes.output_shapes_from_attrs, view),
            assumed_batch))
    main = _Job(graph_def, view, fetched, shapes, _cost.noise_floor(False))
    reachable = _reachable_functions(graph_def, function_roots)
    def function_job(fdef):
        return _function_job(fdef, signatures, costed,
                             (graph_def.library, argument_shapes.get(fdef.signature.name),
                              fdef.signature.name in loop_bodies), assumed_batch)

    functions = {}  # library index -> _Job, or None where the body cannot be rewritten
    for index, fdef in enumerate(graph_def.library.function):
        if fdef.signature.name in reachable:  # else e.g. a While body TF replaced by its
            functions[index] = function_job(fdef)  # '_rewritten' copy: never runs
    if costed:
        target = _measure_workloads(target, [main] + [job for job in functions.values() if job],
                                    config, half.name)
    new_graph_def, report, modified, error = _rewrite_one(
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
        new_fdef, function_report = _rewrite_function_body(
            fdef, job, half, lists, signatures, strict, target)
        if function_report is not None:
            function_reports[fdef.signature.name] = function_report
        if new_fdef is not None:
            new_graph_def.library.function[index].CopyFrom(new_fdef)
            modified = True
    # 5. boundaries (only functions have any)
    kept = None
    if function_reports:
        declared = _declare_loop_variables_half(
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
    if _log.isEnabledFor(logging.DEBUG):
        for decision in report.decisions.values():
            _log.debug("%s", decision)
    _log.info("%s", report.summary())
    if config.dump_dir:
        _dump(config.dump_dir, original, new_graph_def, lists, report)
    return RewriteResult(new_graph_def, report, modified)


# How many times a loop body is rewritten again with more of its loop variables declared half
# (each round may make another one a body returns in half).
_DECLARE_ROUNDS = 3


def _casts_after_boundaries(graph_def, half, fetched):
    """(tf_mpt's Casts in While bodies, in all) of a copy of `graph_def` after phase 5: what
    a choice of phase 5's first step is judged by (the boundary passes remove many Casts of
    a loop body, e.g. at a gradient's TensorLists)."""
    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)
    _boundaries.keep_values_half_across_boundaries(copy, half.enum, fetched)
    bodies = _cost.loop_bodies(copy)
    in_loops = sum(_loops.our_casts(f.node_def) for f in copy.library.function
                   if f.signature.name in bodies)
    everywhere = sum(_loops.our_casts(f.node_def) for f in copy.library.function)
    return in_loops, everywhere + _loops.our_casts(copy.node)


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


def _declare_loop_variables_half(graph_def, new_graph_def, functions, reports, function_job,
                                 settings, fetched):
    """Phase 5's first step: a float32 loop variable of a main-graph While that its rewritten
    body returns through a Cast to float32 but reads in float32 (a gradient loop's incoming
    gradient) has its body rewritten again from the original with it declared half, so its
    readers are painted from a half source. Kept where the graph then runs fewer of tf_mpt's
    Casts in loop bodies after the boundary passes (then fewer in all); the While then
    carries it in half (loops.switch_declared).

    graph_def / new_graph_def: the input and the rewritten graph (edited in place);
    functions: library index -> _Job or None; reports: function name -> report (updated);
    function_job: FunctionDef -> _Job; settings: (half, lists, signatures, strict, target).
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
        for _ in range(_DECLARE_ROUNDS):
            if not indices:
                break
            original = _loops.declared_half(graph_def.library.function[index], indices,
                                            half.enum)
            job = function_job(original)
            if job is None:
                break
            try:  # a trial: a failure leaves the body as phase 4 rewrote it, quietly
                new_fdef, report = _rewrite_function_body(original, job, half, lists,
                                                          signatures, True, target)
            except RewriteError as error:
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


def _reachable_functions(graph_def, roots=()):
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


def _rewrite_one(job, half, lists, signatures, strict, target):
    """Paints one graph (no library), a _Job, for `target` (bound: target_for). Returns
    (graph_def, report, modified, error or None).

    With the cost model on (target.costs), job.shapes gives the table it weighs (an unknown
    batch already assumed); else only a pass that needs shapes calls it.
    """
    graph_def, view = job.graph_def, job.view
    # 1. index: (node, type-attr) vertices
    types = [ta.node_types(node, signatures) for node in view.nodes]
    skip = _node_skip_reasons(view, types, job.fetched)
    paint = _paint.Paint(view, types, half, lists, skip,
                         ta.default_device_type())
    paint.shape_source = job.shapes or functools.partial(_shapes.output_shapes_from_attrs,
                                                         view)
    if target.costs is not None:
        paint.cost = (target, paint.static_shapes(), job.noise_floor)
    step = "build"
    try:
        # 2. paint
        for step, run_pass in _PASSES:
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


def _function_job(fdef, signatures, costed, callers, assumed_batch):
    """The _Job of one library function's body, or None if it cannot be rewritten (it is
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
    except (_function_library.UnsupportedFunction, GraphDefError) as error:
        _log.debug("function %s is left as it is: %s", fdef.signature.name, error)
        return None
    library, argument_shapes, loop_body = callers
    shapes = None
    if costed:
        shapes = functools.cache(_shapes.with_assumed_batch(functools.partial(
            _shapes.function_body_shapes, body, fdef, library, argument_shapes),
            assumed_batch))
    return _Job(body, view, set(fetches), shapes, _cost.noise_floor(loop_body))


def _rewrite_function_body(fdef, job, half, lists, signatures, strict, target):
    """Rewrites one library function (its _Job), its signature unchanged.

    Returns (new FunctionDef or None if unchanged, report or None if not rewritable).
    """
    name = fdef.signature.name
    new_body, report, modified, error = _rewrite_one(job, half, lists, signatures, strict,
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


def _dump(directory, before, after, lists, report):
    """Writes the graphs before/after, the effective lists and the report to `directory`."""
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    stem = os.path.join(directory, f"tf_mpt_{os.getpid()}_{next(_dump_counter):04d}")
    try:
        os.makedirs(directory, exist_ok=True)
        for tag, graph_def in (("before", before), ("after", after)):
            with open(f"{stem}_{tag}.pb", "wb") as f:
                f.write(graph_def.SerializeToString())
            with open(f"{stem}_{tag}.pbtxt", "w") as f:
                f.write(text_format.MessageToString(graph_def))
        with open(f"{stem}_lists.txt", "w") as f:
            f.write(str(lists) + "\n")
        with open(f"{stem}_report.json", "w") as f:
            f.write(report.to_json(indent=1))
        _log.info("tf_mpt dump written to %s_*", stem)
    except OSError as error:
        _log.warning("tf_mpt could not write the dump to %r (%s); set %s to a writable "
                     "directory.", directory, error, _config.TF_MPT_DUMP_DIR)


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
    config = with_target(config, target)  # a bad value raises before any work
    if not isinstance(graph, tf.Graph):
        raise TypeError(
            f"graph must be a tf.Graph. Received: graph={_short_repr(graph)} (of type "
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
                                  config=config)
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
