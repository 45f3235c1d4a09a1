"""The target a rewrite decides for, bound to its table, and the measuring step: everything the
cost model will read is measured here, before any decision (decisions only read a table)."""

import dataclasses

from tf_mpt import _cpu
from tf_mpt import _dtypes
from tf_mpt import targets as _targets
from tf_mpt._process import state as _state
from tf_mpt.costs import dispatch as _dispatch
from tf_mpt.costs import op_costs as _op_costs
from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.paint import cost as _cost


def target_for(config, dtype):
    """The tf_mpt.targets.Target a rewrite to `dtype` with `config` decides for (a GPU seen by
    TensorFlow counts: `auto` then follows the op lists), bound to what its decisions read
    (op_costs.bind: its table, machine, fusions, threads): made once per rewrite and passed
    down. Raises ValueError for a bad table file."""
    name = _dtypes.parse(dtype).name
    target = _targets.resolve(config, name, gpu_visible=ta.default_device_type() == "GPU")
    _targets.say_why_once(target, name)
    return _op_costs.bind(target, config, name)


def runs_here(target):
    """Whether the graph a rewrite makes will run on this machine: decided for it (`here`),
    or rewritten by the automatic path in this process; with no GPU visible (a GPU runs the
    graph there)."""
    if ta.default_device_type() == "GPU":
        return False
    return target.kind == _targets.HERE or _state.STATE.settings is not None


def check_dispatch(target, config, dtype, graph_def, lists):
    """The target with `slow_ops` and `inaccurate_ops` set where the graph runs here
    (runs_here): the op types of the graph and its functions that could go half and whose
    half kernel, as TensorFlow runs it here, is over costs.dispatch.SLOW times slower than
    float32 (the dispatch check), or errs over costs.dispatch.INACCURATE times the rounding
    of float32's result (the numerics check); one WARNING each, once per process, the second
    naming the remedy where one exists. Where the graph is for another machine, or the check
    is off (TF_MPT_DISPATCH_CHECK=0): the target as it is."""
    if not config.dispatch_check or not runs_here(target):
        return target
    candidates = lists.allow | lists.infer | lists.clear
    ops = {node.op for node in _function_bodies.all_nodes(graph_def)} & candidates
    found = _dispatch.ratios(config, dtype, ops)
    slow = _dispatch.slow_ops(found, ops)
    inaccurate = _dispatch.inaccurate_ops(found, ops)
    for op, (ratio, pattern) in sorted(slow.items()):
        _state.warn_once(("slow half kernel", dtype, op),
                         "tf_mpt keeps %s float32: TensorFlow's %s kernel for it on this CPU "
                         "(%s, as the remapper fuses it) ran %.0fx slower than float32",
                         op, dtype, pattern, ratio)
    remedy = _dispatch.remedy(dtype, _dispatch.onednn_on(), _cpu.cpu_flags(config)) \
        if inaccurate else ""
    for op, (ratio, pattern) in sorted(inaccurate.items()):
        _state.warn_once(("inaccurate half kernel", dtype, op),
                         "tf_mpt keeps %s float32: TensorFlow's %s kernel for it on this CPU "
                         "(%s, as the remapper fuses it) erred %.0fx the rounding of float32's "
                         "result to %s%s", op, dtype, pattern, ratio, dtype,
                         f"; {remedy}" if remedy else "")
    if not slow and not inaccurate:
        return target
    return dataclasses.replace(target, slow_ops=slow, inaccurate_ops=inaccurate)


def resolved_target(config, dtype):
    """The tf_mpt.targets.Target a rewrite to `dtype` with `config` decides for, resolved
    only (nothing bound, nothing said)."""
    return _targets.resolve(config, _dtypes.parse(dtype).name,
                            gpu_visible=ta.default_device_type() == "GPU")


def measure_workloads(target, jobs, config, dtype):
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
