"""step_timing: which rewritten functions are timed against float32, and the sandbox that
times them (copies of the variables, made-up inputs, nothing of the script's touched). The
kernel times the cost model reads are the injected Zen 4 table (conftest)."""

import dataclasses
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import tf_mpt
from tf_mpt import config as _config
from tf_mpt import report as _report
from tf_mpt import targets as _targets
from tf_mpt.choose import ledger as _ledger
from tf_mpt.choose import policy as _policy
from tf_mpt.choose import when as _when
from tf_mpt.choose.timers import measuring as _measuring
from tf_mpt.choose.timers import compiled as _compiled
from tf_mpt.choose.timers import rounds as _rounds
from tf_mpt.choose.timers import safety as _safety
from tf_mpt.choose.timers import steps as _step_sandbox
from tf_mpt.rewrite import tf_functions as _functions
from support import fake_timing

WIDTH = 512  # [64 x 512] x [512 x 512]: bfloat16 wins by the table, Casts included


def _report_with(saving_ms, changed_ms, target="here", converted=10, elementwise_ms=0.0):
    return _report.RewriteReport(dtype="bfloat16", total_nodes=100, converted_nodes=converted,
                                 casts_added=4, target=target,
                                 predicted_saving=saving_ms / 1e3,
                                 predicted_changed=changed_ms / 1e3,
                                 predicted_elementwise=elementwise_ms / 1e3)


_HERE = _targets.Target(_targets.HERE)
_STANDING_IN = _targets.Target("table", "/tables/op_costs_zen4.json", stands_in=True)
_ELSEWHERE = _targets.Target("table", "/tables/sapphire_rapids.json")
_RULES = _targets.Target(_targets.RULES)
_BATCH_64 = _policy.Policy(batch=64)  # (what a step timer is called with: its made-up batch)


@pytest.mark.parametrize("mode, target, report, timed", [
    ("auto", _HERE, _report_with(2.5, 14.4), True),        # MobileNetV2's fit: 17%
    ("auto", _HERE, _report_with(5.0, 14.4), False),       # 35%: the model is trusted
    ("auto", _STANDING_IN, _report_with(2.5, 14.4, target="op_costs_zen4.json"), True),
    ("always", _HERE, _report_with(5.0, 14.4), True),
    ("off", _HERE, _report_with(2.5, 14.4), False),
    ("always", _RULES, _report_with(2.5, 14.4, target="rules"), False),  # nothing measured
    ("always", _ELSEWHERE, _report_with(2.5, 14.4), False),  # a table of another machine
    ("always", _HERE, _report_with(0.0, 0.0, converted=0), False),  # nothing converted
])
def test_which_functions_are_timed(mode, target, report, timed):
    assert _when.worth_timing(report, target, mode) is timed


@pytest.mark.parametrize("mode, target, timed", [
    ("auto", _HERE, True), ("off", _HERE, False), ("auto", _RULES, False)])
def test_auto_times_every_step_xla_compiles_where_decisions_are_for_this_cpu(mode, target,
                                                                           timed):
    """A saving the cost model trusts (35%: not timed without XLA) is timed all the same in a
    step XLA compiles: the model adds up TensorFlow's kernels, and XLA on a CPU computes half
    contractions in float32 between converts (the Transformer's fit under XLA ran 0.89x
    float32 on the prediction alone: benchmarks/keras_models.py --jit)."""
    report = _report_with(5.0, 14.4, target="rules" if target is _RULES else "here")
    config = _config.Config.from_env({"TF_MPT_STEP_TIMING": mode})
    assert _when.step_reason(config, target, report) is None
    why = _when.step_reason(config, target, report, compiled=True)
    assert (why is not None) is timed
    if timed:
        assert why.startswith("XLA compiles it (jit_compile): the cost model adds up")


@pytest.mark.parametrize("report, timed", [
    # Sapphire Rapids, a table with bfloat16 Mul / AddV2 / Sub probed faster at 1 M elements:
    (_report_with(5.51, 8.72, elementwise_ms=8.36), True),    # MobileNetV2's predict step
    (_report_with(83.75, 122.51, elementwise_ms=19.22), True),  # the Transformer's fit: 23%
    (_report_with(97.99, 118.07, elementwise_ms=14.54), False),  # ResNet50's predict: 15%
    (_report_with(5.0, 14.4, elementwise_ms=0.98), False),    # 35% saved, 19.6% element-wise
    (_report_with(5.0, 14.4, elementwise_ms=1.01), True),     # just over policy.elementwise_share
])
def test_auto_times_a_function_whose_saving_rests_on_element_wise_kernels(report, timed):
    """A large predicted saving (not thin: over policy.thin of what it adds up) is timed
    all the same where half kernels other than matrix products and convolutions make over
    policy.elementwise_share of it: their times come from kernels probed alone, not at the node's
    shapes (the first three rows: the Keras steps' reports of that run, in ms); 'off' times
    none of them, nor a target not measured here."""
    assert report.predicted_saving >= _policy.DEFAULT.thin * report.predicted_changed
    assert _when.worth_timing(report, _HERE, "auto") is timed
    assert _when.worth_timing(report, _HERE, "off") is False
    assert _when.worth_timing(dataclasses.replace(report, target="rules"), _RULES,
                                "auto") is False


def test_the_reason_a_function_is_timed_is_said():
    """step_reason gives the rule that fired, with the prediction's figures; None where
    nothing is timed."""
    config = _config.Config.from_env({"TF_MPT_TIMING_BUDGET": "5"})
    assert _when.step_reason(config, _HERE, _report_with(2.5, 14.4)) == (
        "its predicted saving, 2.5 ms per run, is under 30% of the 14.4 ms of kernel and "
        "Cast times it adds up")
    assert _when.step_reason(config, _HERE, _report_with(5.51, 8.72, elementwise_ms=8.36)) \
        == ("8.36 ms of its predicted saving of 5.51 ms per run (over 20%) is half kernels "
            "other than matrix products and convolutions, each probed alone, not at the "
            "graph's shapes")
    assert _when.step_reason(config, _HERE, _training_report(22)) == (
        "it computes gradients and the cost model kept 22 of the 100 nodes it weighed "
        "float32: what it holds for the backward pass is measured, not predicted")
    least = _config.Config.from_env({"TF_MPT_TIMING_BUDGET": "5", "TF_MPT_MEMORY": "least"})
    assert _when.step_reason(least, _HERE, _report_with(5.0, 14.4)).startswith(
        "TF_MPT_MEMORY=least")
    always = _config.Config.from_env({"TF_MPT_TIMING_BUDGET": "5",
                                      "TF_MPT_STEP_TIMING": "always"})
    assert _when.step_reason(always, _HERE, _report_with(5.0, 14.4)) == \
        "TF_MPT_STEP_TIMING=always"
    assert _when.step_reason(config, _HERE, _report_with(5.0, 14.4)) is None
    assert _when.step_reason(config, _HERE, _training_report(5)) is None
    no_budget = _config.Config.from_env({"TF_MPT_TIMING_BUDGET": "0"})
    assert _when.step_reason(no_budget, _HERE, _report_with(2.5, 14.4)) is None


@pytest.mark.parametrize("memory, step_timing, timed", [
    ("float32", "auto", False), ("least", "auto", True), ("least", "off", False),
    ("any", "auto", False)])
def test_memory_first_times_every_step(memory, step_timing, timed):
    """TF_MPT_MEMORY=least: what a step holds is not predicted, so auto acts as always (a
    step whose predicted saving is large is timed); off stays off."""
    from tf_mpt.choose import when as _when  # pylint: disable=import-outside-toplevel
    config = _config.Config.from_env({"TF_MPT_MEMORY": memory,
                                      "TF_MPT_STEP_TIMING": step_timing,
                                      "TF_MPT_TIMING_BUDGET": "5"})
    assert _when.step_applies(config, _HERE, _report_with(5.0, 14.4)) is timed


def _training_report(kept, converted=30, gradients=True):
    """A step's report, the cost model's prediction over 100 weighed nodes: `kept` kept
    float32 by the cost model, `converted` half, the rest float32 by the lists; its nodes
    under gradient_tape/ where `gradients`."""
    scope = "gradient_tape/" if gradients else ""
    decisions = {}
    for k in range(100):
        name = f"{scope if k % 2 else ''}dense_{k}/MatMul"
        if k < kept:
            d = _report.NodeDecision(name, "Mul", "fp32", "cost model: bfloat16 is slower here",
                                     {}, False)
        elif k < kept + converted:
            d = _report.NodeDecision(name, "MatMul", "allow", "allow list", {}, True)
        else:
            d = _report.NodeDecision(name, "Shape", "fp32", "not a float op", {}, False)
        decisions[name] = d
    return _report.RewriteReport(dtype="bfloat16", total_nodes=100, converted_nodes=converted,
                                 casts_added=4, target="here", decisions=decisions,
                                 predicted_saving=5.0e-3, predicted_changed=14.4e-3,
                                 weighed_nodes=(100, 100))


@pytest.mark.parametrize("memory, kept, gradients, timed", [
    ("float32", 22, True, True),    # a Keras Transformer's fit step: 353 of 1610 kept
    ("float32", 5, True, False),    # under policy.kept_share: the prediction is trusted
    ("float32", 22, False, False),  # an inference step: nothing held for a backward pass
    ("any", 22, True, False),       # the peak is not bounded
])
def test_auto_times_a_training_step_whose_cost_model_kept_nodes_float32(memory, kept,
                                                                        gradients, timed):
    """TF_MPT_STEP_TIMING=auto with the default TF_MPT_MEMORY=float32: a step whose predicted
    saving is large (35%, not timed for speed) is timed where it computes gradients and the
    cost model kept at least policy.kept_share of its weighed nodes float32 (forward
    values may be held in float32 for the backward pass: what it holds is measured)."""
    from tf_mpt.choose import policy as _policy  # pylint: disable=import-outside-toplevel
    from tf_mpt.choose import when as _when  # pylint: disable=import-outside-toplevel
    report = _training_report(kept, gradients=gradients)
    assert _when.worth_timing(report, _HERE, "auto") is False  # (not for speed)
    assert 0.05 < _policy.DEFAULT.kept_share <= 0.22  # (the rows above sit on either side)
    config = _config.Config.from_env({"TF_MPT_MEMORY": memory, "TF_MPT_TIMING_BUDGET": "5"})
    assert _when.step_applies(config, _HERE, report) is timed
    off = _config.Config.from_env({"TF_MPT_MEMORY": memory, "TF_MPT_STEP_TIMING": "off",
                                   "TF_MPT_TIMING_BUDGET": "5"})
    assert _when.step_applies(off, _HERE, report) is False
    assert _when.step_applies(config, _RULES, dataclasses.replace(report, target="rules")) \
        is False  # (nothing measured for this CPU)


@pytest.mark.parametrize("memory, lists, loop_variables, gradients, timed", [
    ("float32", 4, 3, True, True),    # a Keras LSTM's fit step (its report's counts)
    ("float32", 0, 1, True, True),    # a loop variable alone
    ("float32", 0, 0, True, False),   # no half buffer: the prediction is trusted
    ("float32", 4, 3, False, False),  # an inference loop: nothing held for a backward pass
    ("any", 4, 3, True, False),       # the peak is not bounded
])
def test_auto_times_a_training_step_whose_loops_keep_half_buffers(memory, lists,
                                                                  loop_variables, gradients,
                                                                  timed):
    """TF_MPT_STEP_TIMING=auto with the default TF_MPT_MEMORY=float32: a step the cost model
    trusts (35% predicted saving, under policy.kept_share kept float32) is timed where it computes
    gradients through a loop whose buffers (TensorLists, loop variables) it keeps half: the
    backward pass reads what each iteration accumulates, which may be held in both dtypes
    (what it holds is measured); the reason says so."""
    report = dataclasses.replace(_training_report(5, gradients=gradients),
                                 tensor_lists_kept_half=lists,
                                 loop_variables_kept_half=loop_variables)
    assert _when.worth_timing(report, _HERE, "auto") is False  # (not for speed)
    assert not _when.holds_float32_for_gradients(report)
    config = _config.Config.from_env({"TF_MPT_MEMORY": memory, "TF_MPT_TIMING_BUDGET": "5"})
    assert _when.step_applies(config, _HERE, report) is timed
    if timed:
        assert _when.step_reason(config, _HERE, report) == (
            f"it computes gradients through a loop with {lists + loop_variables} buffer(s) "
            "(TensorLists, loop variables) kept half: what its iterations hold for the "
            "backward pass is measured, not predicted")
    off = _config.Config.from_env({"TF_MPT_MEMORY": memory, "TF_MPT_STEP_TIMING": "off",
                                   "TF_MPT_TIMING_BUDGET": "5"})
    assert _when.step_applies(off, _HERE, report) is False


@pytest.mark.parametrize("memory, price, gradients, timed", [
    ("float32", "0.1", True, True),    # a price for memory: what a step holds is measured
    ("float32", "", True, False),      # no price: the prediction is trusted (5 of 100 kept)
    ("float32", "0.1", False, False),  # an inference step: nothing held for a backward pass
    ("least", "0.1", False, True),     # least times every step already
])
def test_auto_times_every_training_step_where_memory_has_a_price(memory, price, gradients,
                                                                 timed):
    """TF_MPT_MEMORY_PRICE: a training step the cost model trusts (35% predicted saving,
    under policy.kept_share kept float32, no loop) is timed, and the reason names the price; an
    inference step is not."""
    report = _training_report(5, gradients=gradients)
    assert _when.worth_timing(report, _HERE, "auto") is False  # (not for speed)
    config = _config.Config.from_env({"TF_MPT_MEMORY": memory, "TF_MPT_TIMING_BUDGET": "5",
                                      "TF_MPT_MEMORY_PRICE": price})
    assert _when.step_applies(config, _HERE, report) is timed
    if timed and memory == "float32":
        assert _when.step_reason(config, _HERE, report) == (
            "it computes gradients and TF_MPT_MEMORY_PRICE=0.1: what it holds for the "
            "backward pass is measured, not predicted")
    # (float32's own lean version is tried for memory where a backward pass reads values)
    assert _when.prices_float32(_policy.Policy.from_config(config), report) is \
        (bool(price) and gradients)


@pytest.mark.parametrize("environment, dtype, for_this_cpu", [
    ({"TF_MPT_TARGET": "here"}, "bfloat16", True),
    ({"TF_MPT_OP_COSTS": "TABLE"}, "bfloat16", True),  # auto: the table stands in for it
    ({"TF_MPT_TARGET": "TABLE"}, "bfloat16", False),   # a table named as the target
    ({"TF_MPT_TARGET": "rules"}, "bfloat16", False),
    ({"TF_MPT_OP_COSTS": "TABLE"}, "float16", False),  # auto for float16: the rules
])
def test_the_resolved_target_says_whether_decisions_are_for_this_cpu(environment, dtype,
                                                                     for_this_cpu):
    table = os.environ["TF_MPT_OP_COSTS"]
    config = _config.Config.from_env({k: table if v == "TABLE" else v
                                      for k, v in environment.items()})
    assert _targets.resolve(config, dtype).for_this_cpu is for_this_cpu


def test_the_environment_variable_is_parsed_and_refused_when_bad():
    assert _config.Config.from_env({}).step_timing == "auto"
    assert _config.Config.from_env({"TF_MPT_STEP_TIMING": "Always"}).step_timing == "always"
    with pytest.raises(ValueError, match=r"TF_MPT_STEP_TIMING.*'sometimes'"):
        _config.Config.from_env({"TF_MPT_STEP_TIMING": "sometimes"})


def _step(extra=None, signature=None):
    """A training-step-like tf.function: x @ w accumulated into a variable; returns its sum."""
    w = tf.Variable(np.eye(WIDTH, dtype=np.float32) * 0.5, name="w")
    acc = tf.Variable(tf.zeros((64, WIDTH)), name="acc")

    @tf.function(input_signature=signature or [tf.TensorSpec([None, WIDTH], tf.float32)])
    def step(x):
        h = tf.nn.relu(tf.matmul(tf.matmul(x, w), w))
        acc.assign_add(h)
        if extra is not None:
            extra(h)
        return tf.reduce_sum(acc)
    return step, w, acc


def _versions(cf):
    """{'float32': cf's graph, 'mixed': its rewrite}, the rewrite decided the way a user's run
    decides (the environment: the suite's injected table), never by this CPU."""
    from tf_mpt import rewrite as _rewrite  # pylint: disable=import-outside-toplevel
    graph_def = cf.graph.as_graph_def()
    fetches = [t.op.name for t in cf.outputs] + [t.op.name for t in cf.inputs]
    controls = [op.name for op in cf.graph.control_outputs if op.name not in fetches]
    done = _rewrite.rewrite_with_library(
        graph_def, dtype="bfloat16", fetches=fetches + controls, lists=None, strict=False,
        config=_config.Config.from_env(os.environ), control_outputs=controls)
    assert done.modified
    return {"float32": graph_def,
            "mixed": _functions._rename_library(done.graph_def, "_t1")}  # pylint: disable=protected-access


def _clock_of_runs(monkeypatch):
    """graph_timing's rounds read a clock that each reading advances by 1 ms: the rounds of a
    test about the sandbox's machinery fit its budget on every CPU (never this one's clock)."""
    clock = fake_timing.Clock()

    def tick():
        clock.now += 1e-3
        return clock.now
    monkeypatch.setattr(_rounds, "_clock", tick)


@pytest.mark.measures_this_cpu
def test_each_version_is_timed_on_copies_and_the_scripts_variables_stay_as_they_were():
    step, w, acc = _step()
    cf = step.get_concrete_function()
    before = acc.numpy().copy()
    peaks = {}
    times = _step_sandbox.time_versions(cf, _versions(cf), 64, _rounds.rounds, budget_seconds=20,
                                  peaks=peaks)
    assert set(times) == {"float32", "mixed"}
    # each version's step peak (issue "memory"): over the 64 x WIDTH float32 activations
    # it makes; the resident bytes: the copies of x, w and acc
    assert set(peaks) == {"float32", "mixed", _ledger.RESIDENT}
    assert peaks["float32"] >= 64 * WIDTH * 4 and peaks["mixed"] > 0, peaks
    assert peaks[_ledger.RESIDENT] == (64 * WIDTH + w.shape.num_elements() +
                                            acc.shape.num_elements()) * 4
    assert len(times["float32"]) == len(times["mixed"]) >= _policy.DEFAULT.min_rounds
    assert all(t > 0 for t in times["float32"] + times["mixed"])
    np.testing.assert_array_equal(acc.numpy(), before)  # the copies were updated, not acc
    np.testing.assert_array_equal(w.numpy(), np.eye(WIDTH, dtype=np.float32) * 0.5)


@pytest.mark.measures_this_cpu
def test_a_step_timers_sandbox_serves_every_stage_importing_each_candidate_once(monkeypatch,
                                                                              caplog):
    """decision.decide's stages (the first rounds, a lean version's, a refinement's profile)
    time one function in one sandbox: its copies made once and a candidate timed again not
    imported again (ResNet50's fit step spent ~10 s setting up each); close() ends it. The
    script's variables stay as they were."""
    _clock_of_runs(monkeypatch)
    step, w, acc = _step()
    cf = step.get_concrete_function()
    before = acc.numpy().copy()
    versions = _versions(cf)
    other = graph_pb2.GraphDef()
    other.CopyFrom(versions["mixed"])  # (another candidate: equal, but not the same object)
    made, imported = [], []
    sandbox, import_ = _step_sandbox._sandbox, _step_sandbox._import  # pylint: disable=protected-access
    monkeypatch.setattr(_step_sandbox, "_sandbox", lambda *a: made.append(a) or sandbox(*a))
    monkeypatch.setattr(_step_sandbox, "_import", lambda *a: imported.append(a[2]) or import_(*a))
    timer = _functions._step_timer(cf, False, cf.graph.as_graph_def())  # pylint: disable=W0212
    with caplog.at_level(logging.DEBUG, logger="tf_mpt"):
        first = timer.time(versions, 0.5, _BATCH_64)
        second = timer.time({"mixed": versions["mixed"], "lean": other}, 0.5, _BATCH_64)
        profiles = timer.profile(versions, _BATCH_64)
    timer.close()
    # (at DEBUG, each set-up's time: the copies once, each import, each warm-up run)
    said = [r.getMessage() for r in caplog.records]
    assert sum(" set up in " in m for m in said) == 1, said
    assert sum(" imported in " in m for m in said) == 3, said
    assert sum("'s warm-up run took " in m for m in said) == 4, said
    assert set(first) == set(profiles) == {"float32", "mixed"} and \
        set(second) == {"mixed", "lean"}
    assert len(made) == 1 and len(imported) == 3, (len(made), len(imported))
    assert imported[0] is versions["float32"]  # (float32's functions keep their names)
    # the profile's node names are the candidate's own (its name scope in the sandbox taken off)
    names = {n.name for n in versions["mixed"].node}
    assert any(n.op == "MatMul" and n.name in profiles["mixed"]
               for n in versions["mixed"].node), sorted(profiles["mixed"])[:5]
    assert set(profiles["mixed"]) <= names, sorted(set(profiles["mixed"]) - names)[:5]
    np.testing.assert_array_equal(acc.numpy(), before)
    timer.time(versions, 0.5, _BATCH_64)  # (after close(): a sandbox made again)
    timer.close()
    assert len(made) == 2


@pytest.mark.measures_this_cpu
def test_a_sandbox_whose_copies_fail_to_set_up_starts_again_at_its_next_use(monkeypatch):
    """The copies' initializer fails (a planted failing op): NotTimed, and the kept-open
    sandbox is left empty, so the next stage makes it again instead of running candidates on
    copies never set up."""
    _clock_of_runs(monkeypatch)
    step, _, _ = _step()
    cf = step.get_concrete_function()
    versions = _versions(cf)
    made = _step_sandbox._sandbox  # pylint: disable=protected-access

    def failing(*args):
        graph, input_map, (init, feeds), copied = made(*args)
        with graph.as_default():
            planted = tf.raw_ops.Assert(
                condition=tf.compat.v1.placeholder_with_default(False, []),
                data=[tf.constant("planted")])
        return graph, input_map, (planted, feeds), copied  # (the copies never set)
    monkeypatch.setattr(_step_sandbox, "_sandbox", failing)
    sandbox = _step_sandbox.Sandbox(cf)
    with pytest.raises(_safety.NotTimed, match="its copies could not be set up"):
        _step_sandbox.time_versions(cf, versions, 64, _rounds.rounds, 0.5, sandbox=sandbox)
    monkeypatch.setattr(_step_sandbox, "_sandbox", made)
    times = _step_sandbox.time_versions(cf, versions, 64, _rounds.rounds, 0.5, sandbox=sandbox)
    sandbox.close()
    assert set(times) == {"float32", "mixed"}


@pytest.mark.measures_this_cpu
def test_each_versions_traced_run_carries_its_allocations_by_dtype():
    """timers.steps.traced_runs (benchmarks/memory_profile.py's Keras rows): one traced run per
    version after its warm-up runs; the float32 version's allocation records include its
    float32 products' 64 x WIDTH outputs, the mixed one's its bfloat16 ones; the script's
    variables are untouched."""
    step, _, acc = _step()
    cf = step.get_concrete_function()
    before = acc.numpy().copy()
    traced, resident = _step_sandbox.traced_runs(cf, _versions(cf), 64, warmup=1)
    assert set(traced) == {"float32", "mixed"} and resident > 0

    def product_outputs(metadata):
        return sorted(
            (out.tensor_description.dtype, out.tensor_description.allocation_description.
             requested_bytes) for device in metadata.step_stats.dev_stats
            for stats in device.node_stats
            if stats.timeline_label.partition(" = ")[2].startswith(("MatMul", "_MklMatMul"))
            for out in stats.output)
    f32, bf16 = tf.float32.as_datatype_enum, tf.bfloat16.as_datatype_enum
    assert product_outputs(traced["float32"]) == [(f32, 64 * WIDTH * 4)] * 2
    assert (bf16, 64 * WIDTH * 2) in product_outputs(traced["mixed"]), \
        product_outputs(traced["mixed"])
    assert all(_measuring.step_peak_bytes(m) >= 64 * WIDTH * 2 for m in traced.values())
    np.testing.assert_array_equal(acc.numpy(), before)


@pytest.mark.measures_this_cpu
def test_each_version_is_profiled_per_node_under_its_own_node_names():
    """The refinement's profile: every version's matrix products are found under their
    names in the function's graph (the sandbox's candidate_<k>/ prefix taken off)."""
    step, _, acc = _step()
    cf = step.get_concrete_function()
    before = acc.numpy().copy()
    profiles = _step_sandbox.profile_versions(cf, _versions(cf), 64, runs=2)
    products = sorted(op.name for op in cf.graph.get_operations() if op.type == "MatMul")
    assert len(products) == 2
    for name in ("float32", "mixed"):
        found = {n: t for n, t in profiles[name].items() if n in products}
        assert sorted(found) == products and all(t > 0 for t in found.values()), profiles
    np.testing.assert_array_equal(acc.numpy(), before)


@pytest.mark.measures_this_cpu
def test_a_failing_run_on_made_up_inputs_is_not_timed():
    """Both versions run: an assertion the made-up noise breaks stops the timing."""
    step, _, _ = _step(extra=lambda h: tf.debugging.assert_greater(h, 1e9, message="big"))
    cf = step.get_concrete_function()
    with pytest.raises(_safety.NotTimed, match=r"a run on made-up inputs failed "
                                                r"\(InvalidArgumentError: .*big"):
        _step_sandbox.time_versions(cf, _versions(cf), 64, _rounds.rounds)


@pytest.mark.parametrize("extra, op", [
    (lambda h: tf.print(tf.shape(h)), "PrintV2"),
    (lambda h: tf.py_function(lambda t: t, [h], tf.float32), "EagerPyFunc"),
])
def test_a_function_acting_outside_its_variables_is_not_timed(extra, op):
    step, _, _ = _step(extra=extra)
    cf = step.get_concrete_function()
    with pytest.raises(_safety.NotTimed, match=rf"op\(s\) with effects outside its "
                                                rf"variables: .*{op}"):
        _step_sandbox.time_versions(cf, _versions(cf), 64, _rounds.rounds)


@pytest.mark.measures_this_cpu
def test_an_argument_whose_size_is_unknown_beyond_the_batch_is_not_timed():
    step, _, _ = _step(signature=[tf.TensorSpec([64, None], tf.float32)])
    cf = step.get_concrete_function()
    with pytest.raises(_safety.NotTimed, match=r"argument x:0 has shape \(64, None\): a size "
                                                r"other than the batch is unknown"):
        _step_sandbox.time_versions(cf, {"float32": cf.graph.as_graph_def()}, 64, _rounds.rounds)


@pytest.mark.parametrize("fastest", ["float32", "cost model", "contractions only"])
def test_tf_mpt_function_times_the_candidates_and_runs_the_fastest(monkeypatch, caplog,
                                                                    fastest):
    """The step's candidates are the graph's: float32, the cost model's (here: equal to the
    rules'), contractions only; the injected timer decides, never this CPU's clock."""
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "always")
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "20")
    # (no per-node profile: nothing to refine; test_a_step_runs_its_refinement refines)
    calls = fake_timing.install_step_timer(monkeypatch, lambda graphs: {
        name: (0.1,) * 3 if name == fastest else (0.2,) * 3 for name in graphs})
    seen = calls.times
    step, _, acc = _step()
    mixed = tf_mpt.function(step.python_function, dtype="bfloat16",
                            input_signature=step.input_signature)
    x = tf.ones((64, WIDTH))
    with caplog.at_level(logging.INFO, logger="tf_mpt"):
        out = mixed(x)
    # the batch of the call; the first rounds' share of the budget; every candidate whose
    # graph differs
    assert seen == [(64, _policy.DEFAULT.first_share * 20.0,
                     ["float32", "cost model", "contractions only"], False)]
    assert out.dtype == tf.float32
    graph = mixed.get_concrete_function(tf.TensorSpec([None, WIDTH], tf.float32)).graph
    products = [op for op in graph.get_operations() if op.type == "MatMul"]
    relus = [op for op in graph.get_operations() if op.type == "Relu"]
    messages = [r.getMessage() for r in caplog.records if "timed tf.function" in r.getMessage()]
    assert len(messages) == 1
    ms = {name: 100 if name == fastest else 200 for name in seen[0][2]}
    assert re.search(rf"^tf_mpt timed tf.function \S*step\S* on copies of its variables: graph "
                     rf"timing \(median of 3 rounds\): float32 {ms['float32']} ms, cost model "
                     rf"{ms['cost model']} ms, contractions only {ms['contractions only']} ms, "
                     rf"rules = cost model; picked ", messages[0]), messages[0]
    if fastest == "float32":
        assert {op.get_attr("T") for op in products + relus} == {tf.float32}
        assert messages[0].endswith("picked float32 over the prediction (cost model)")
    elif fastest == "cost model":
        assert {op.get_attr("T") for op in products + relus} == {tf.bfloat16}
        assert messages[0].endswith("picked cost model, 2.00x float32")
    else:  # matrix products half, the Relu between them float32
        assert {op.get_attr("T") for op in products} == {tf.bfloat16}
        assert {op.get_attr("T") for op in relus} == {tf.float32}
        assert messages[0].endswith("picked contractions only, 2.00x float32 over the "
                                    "prediction (cost model)")
    np.testing.assert_array_equal(acc.numpy(), np.full((64, WIDTH), 0.25, np.float32))


def test_a_steps_verdict_is_cached_for_the_same_step_traced_again(monkeypatch, tmp_path,
                                                                   caplog):
    """The same step traced again (another tf_mpt.function of it: its trace's functions named
    with other counters, as in another process) reads the verdict the first one's timing
    cached (TF_MPT_CACHE_DIR) and runs the same colouring without timing anything; with
    TF_MPT_MEMORY=any (another bound) it is timed again."""
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "always")
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "20")
    monkeypatch.setenv("TF_MPT_CACHE_DIR", str(tmp_path))
    seen = fake_timing.install_step_timer(monkeypatch, lambda graphs: {
        name: (0.1,) * 3 if name == "contractions only" else (0.2,) * 3
        for name in graphs}).times
    step, _, _ = _step()
    spec = tf.TensorSpec([None, WIDTH], tf.float32)

    def relu_types():
        mixed = tf_mpt.function(step.python_function, dtype="bfloat16",
                                input_signature=step.input_signature)
        with caplog.at_level(logging.INFO, logger="tf_mpt"):
            mixed(tf.ones((64, WIDTH)))
        graph = mixed.get_concrete_function(spec).graph
        return {op.get_attr("T") for op in graph.get_operations() if op.type == "Relu"}
    assert relu_types() == {tf.float32} and len(seen) == 1  # (contractions only)
    first = [r.getMessage() for r in caplog.records if "timed tf.function" in r.getMessage()]
    caplog.clear()
    assert relu_types() == {tf.float32} and len(seen) == 1, seen  # nothing timed again
    messages = [r.getMessage() for r in caplog.records if "timed tf.function" in r.getMessage()]
    assert len(messages) == 1 and "graph timing (cached here, " in messages[0] and \
        messages[0].endswith("picked contractions only, 2.00x float32 over the prediction "
                             "(cost model)"), messages
    # the same line as when it was timed, candidates in the same order
    assert len(first) == 1 and messages[0].replace("(cached here, ", "(") == first[0], \
        (first, messages)
    monkeypatch.setenv("TF_MPT_MEMORY", "any")
    assert relu_types() == {tf.float32} and len(seen) == 2, seen


@pytest.mark.parametrize("fastest", ["float32", "contractions only"])
def test_an_xla_step_is_timed_as_xla_runs_it_and_its_verdict_says_so(monkeypatch, tmp_path,
                                                                     caplog, fastest):
    """A jit_compile=True step (issue "XLA", item 3): its candidates are timed compiled
    (timers.compiled.time_compiled, injected here), never the way TensorFlow's executor runs
    them; the fastest runs, float32 the floor; the verdict says it was compiled, and is
    cached apart from the same step's without XLA (timed again there, the executor's way)."""
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "always")
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "20")
    monkeypatch.setenv("TF_MPT_CACHE_DIR", str(tmp_path))
    compiled, executed = [], []

    def times(graphs):
        return {name: (0.1,) * 3 if name == fastest else (0.2,) * 3 for name in graphs}

    def time_compiled(cf, graphs, batch, rounds, budget, sandbox, policy=None):
        assert isinstance(sandbox, _compiled.CompiledSandbox)
        compiled.append((batch, budget, list(graphs)))
        return times(graphs)

    def time_versions(cf, graphs, batch, rounds, budget, peaks=None, sandbox=None,
              policy=None):
        executed.append(list(graphs))
        return times(graphs)
    monkeypatch.setattr(_compiled, "time_compiled", time_compiled)
    monkeypatch.setattr(_step_sandbox, "time_versions", time_versions)
    profiled = []  # (XLA fuses the nodes a profile times: a compiled step is not refined)
    monkeypatch.setattr(_step_sandbox, "profile_versions",
                        lambda cf, graphs, batch, runs, sandbox=None, policy=None:
                        profiled.append(list(graphs)) or {n: {} for n in graphs})
    step, _, _ = _step()
    spec = tf.TensorSpec([None, WIDTH], tf.float32)

    def run(jit_compile):
        mixed = tf_mpt.function(step.python_function, dtype="bfloat16", jit_compile=jit_compile,
                                input_signature=step.input_signature)
        with caplog.at_level(logging.INFO, logger="tf_mpt"):
            mixed(tf.ones((64, WIDTH)))
        graph = mixed.get_concrete_function(spec).graph
        return {op.get_attr("T") for op in graph.get_operations() if op.type == "MatMul"}
    products = run(True)
    assert profiled == []
    assert compiled == [(64, _policy.DEFAULT.first_share * 20.0,
                         ["float32", "cost model", "contractions only"])] and executed == []
    assert products == ({tf.float32} if fastest == "float32" else {tf.bfloat16})
    (message,) = [r.getMessage() for r in caplog.records if "timed tf.function" in
                  r.getMessage()]
    assert "graph timing (median of 3 rounds, compiled by XLA as the step runs): " \
        "float32 " in message, message
    assert message.endswith("picked float32 over the prediction (cost model)" if fastest ==
                            "float32" else "picked contractions only, 2.00x float32 over the "
                            "prediction (cost model)"), message
    caplog.clear()
    assert run(True) == products and len(compiled) == 1  # cached: nothing timed again
    (message,) = [r.getMessage() for r in caplog.records if "timed tf.function" in
                  r.getMessage()]
    assert "(cached here, median of 3 rounds, compiled by XLA as the step runs)" in message
    run(False)  # without XLA: another verdict, timed as the executor runs the step
    assert len(compiled) == 1 and executed == [["float32", "cost model", "contractions only"]]
    assert len(profiled) == (0 if fastest == "float32" else 1)  # (the second run's, alone)


def test_a_step_calling_a_compiled_function_is_timed_whatever_the_prediction(monkeypatch,
                                                                            caplog):
    """Keras's predict loop is a tf.function calling its jit_compile step: the caller is
    rewritten with the callee's body, so the caller's verdict is XLA's too; it is timed in
    the Session sandbox (which compiles that call, as the step's run does), under auto,
    however large the cost model's predicted saving."""
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "auto")
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "20")
    timed = fake_timing.install_step_timer(
        monkeypatch, lambda graphs: {name: (0.1,) * 3 for name in graphs}).times
    monkeypatch.setattr(_when, "step_reason", _with_a_trusted_saving(_when.step_reason))
    step, _, _ = _step()
    inner = tf.function(step.python_function, jit_compile=True)
    for jit_inside, expected in ((True, 1), (False, 1)):  # (the count so far)
        called = inner if jit_inside else tf.function(step.python_function)
        mixed = tf_mpt.function(lambda x, called=called: called(x) * 2.0, dtype="bfloat16",
                                input_signature=step.input_signature)
        with caplog.at_level(logging.INFO, logger="tf_mpt"):
            mixed(tf.ones((64, WIDTH)))
        assert len(timed) == expected, (jit_inside, timed)
    assert not any(compiled for _, _, _, compiled in timed)  # (in the Session sandbox)
    assert any("XLA compiles it (jit_compile)" in r.getMessage() for r in caplog.records)


def _with_a_trusted_saving(step_reason):
    """when.step_reason as for a report whose predicted saving the cost model trusts
    (auto would not time it without XLA), whatever the suite's table predicts here."""
    def reason(config, target, report, compiled=False):
        trusted = dataclasses.replace(report, predicted_saving=1.0, predicted_changed=1.0,
                                      predicted_elementwise=0.0)
        return step_reason(config, target, trusted, compiled)
    return reason


@pytest.mark.measures_this_cpu
def test_each_candidate_is_compiled_by_xla_once_and_timed_on_copies(monkeypatch):
    """time_compiled for real (the verdict's clock injected): each candidate a
    jit_compile=True function on copies of the step's variables, compiled at its first call
    (its HLO holds the half products of the mixed candidate), the script's variables left as
    they were; a second call compiles nothing again."""
    _clock_of_runs(monkeypatch)
    from tf_mpt.rewrite import tf_functions as _tf_functions
    step, w, acc = _step()
    cf = step.get_concrete_function()
    before = acc.numpy().copy()
    sandbox = _compiled.CompiledSandbox(cf, _tf_functions._compiled_candidate)  # pylint: disable=W0212
    versions = _versions(cf)
    times = _compiled.time_compiled(cf, versions, 64, _rounds.rounds, 20.0, sandbox)
    assert set(times) == {"float32", "mixed"}
    assert len(times["float32"]) == len(times["mixed"]) >= _policy.DEFAULT.min_rounds
    runners, compiling = sandbox.runners(versions, 64)
    assert compiling == 0.0  # (the same GraphDefs: compiled once)
    hlo = {name: run.function.experimental_get_compiler_ir()(stage="hlo") for name, run in
           runners.items()}
    assert re.search(r"bf16\[64,\d+\]\S* dot\(", hlo["mixed"]), hlo["mixed"][-2000:]
    assert "bf16" not in hlo["float32"]
    np.testing.assert_array_equal(acc.numpy(), before)  # the copies were updated, not acc
    np.testing.assert_array_equal(w.numpy(), np.eye(WIDTH, dtype=np.float32) * 0.5)
    sandbox.close()


class _FakeCompiledSandbox:
    """A CompiledSandbox whose candidates compile in `compiling` seconds (or fail with
    `error`) and run doing nothing: time_compiled's own rules, no kernel run."""

    def __init__(self, compiling=0.0, error=None):
        self.compiling, self.error = compiling, error

    def runners(self, graph_defs, batch, policy=None):
        if self.error is not None:
            raise self.error
        return {name: lambda: None for name in graph_defs}, self.compiling


def test_compiling_that_takes_the_rounds_budget_is_too_slow_and_a_failed_compile_is_not_timed(
        monkeypatch):
    step, _, _ = _step()
    cf = step.get_concrete_function()
    graphs = {"float32": cf.graph.as_graph_def()}
    rounds = []
    monkeypatch.setattr(_rounds, "rounds", lambda runners, budget: rounds.append(budget))
    with pytest.raises(_safety.TooSlow, match=r"XLA took 3\.0 s to compile the 1 candidates, "
                       r"the 2 s the rounds may spend of the budget \(TF_MPT_TIMING_BUDGET\)"):
        _compiled.time_compiled(cf, graphs, 64, _rounds.rounds, 2.0,
                              _FakeCompiledSandbox(compiling=3.0))
    _compiled.time_compiled(cf, graphs, 64, _rounds.rounds, 2.0,
                          _FakeCompiledSandbox(compiling=0.5))
    assert rounds == [1.5]  # the compile's seconds came off the rounds' share
    with pytest.raises(_safety.NotTimed, match=r"a candidate did not compile or run on made-up "
                       r"inputs under XLA \(InvalidArgumentError\)"):
        _compiled.time_compiled(cf, graphs, 64, _rounds.rounds, 2.0, _FakeCompiledSandbox(
            error=tf.errors.InvalidArgumentError(None, None, "no kernel")))


@pytest.mark.parametrize("extra, op", [
    (lambda h: tf.print(h), "PrintV2")])
def test_a_compiled_function_acting_outside_its_variables_is_not_timed(extra, op):
    step, _, _ = _step(extra)
    cf = step.get_concrete_function()
    with pytest.raises(_safety.NotTimed, match=f"effects outside its variables: .*{op}"):
        _compiled.time_compiled(cf, {"float32": cf.graph.as_graph_def()}, 64,
                              _rounds.rounds, 2.0, _FakeCompiledSandbox())


@pytest.mark.measures_this_cpu
def test_a_compiled_step_timed_while_its_caller_traces_runs_its_candidates_eagerly(
        monkeypatch):
    """Keras calls its compiled step from another tf.function, so the step is rewritten and
    timed while that caller traces: each candidate's runs happen eagerly on the copies (they
    took real time), and none of them is left as a call in the caller's graph (it would run
    the candidates in every step of the user's program)."""
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "always")
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "20")
    _clock_of_runs(monkeypatch)
    runs = []
    time_compiled = _compiled.time_compiled

    def counted(cf, graphs, batch, rounds, budget, sandbox, policy=None):
        def counting(runners, budget):
            for name, run in list(runners.items()):
                runners[name] = lambda run=run, name=name: runs.append((name, run()))
            return rounds(runners, budget)
        return time_compiled(cf, graphs, batch, counting, budget, sandbox, policy)
    monkeypatch.setattr(_compiled, "time_compiled", counted)
    step, _, _ = _step()
    mixed = tf_mpt.function(step.python_function, dtype="bfloat16", jit_compile=True,
                            input_signature=step.input_signature)

    @tf.function
    def caller(x):
        return mixed(x) + 1.0
    x = tf.ones((64, WIDTH))
    caller(x)
    # values computed (eager tensors), not symbols of the caller's graph
    assert runs and all(hasattr(out[0], "numpy") for _, out in runs), runs[:3]
    graph = caller.get_concrete_function(x).graph
    calls = [op for op in graph.get_operations() if op.type in ("StatefulPartitionedCall",
                                                                "PartitionedCall")]
    assert len(calls) == 1, [op.name for op in calls]


def test_a_steps_cache_key_names_its_functions_by_their_calls_and_carries_its_shapes():
    """functions._canonical: two traces of one step (other function names, listed in
    another order) key alike, their functions f0, f1, ...; a step whose variable is wider
    (its argument's shape unknown) does not; nor do other functions traced in between (the
    process's counters, and the order a While's attrs come out of their map, then differ)."""
    def traced(width, others=0):
        for k in range(others):
            @tf.function
            def other(x, k=k):
                return tf.map_fn(lambda row: row * 2.0 + k, x)
            other.get_concrete_function(tf.TensorSpec([None, 3], tf.float32))
        v = tf.Variable(tf.ones((width, width)))

        @tf.function
        def step(x):
            return tf.reduce_sum(tf.map_fn(lambda row: tf.linalg.matvec(v, row), x))
        cf = step.get_concrete_function(tf.TensorSpec([None, None], tf.float32))
        cf.kept_variable = v  # (the trace does not own it)
        return cf
    first, again, wider = traced(8), traced(8, others=7), traced(16)
    names = {f.signature.name for f in first.graph.as_graph_def().library.function}
    assert names and names.isdisjoint(
        f.signature.name for f in again.graph.as_graph_def().library.function)
    key = _functions._canonical  # pylint: disable=protected-access
    assert key(first.graph.as_graph_def(), first) == key(again.graph.as_graph_def(), again)
    assert key(first.graph.as_graph_def(), first) != key(wider.graph.as_graph_def(), wider)
    keyed = key(first.graph.as_graph_def(), first)
    assert sorted(f.signature.name for f in keyed.library.function) == \
        [f"f{k}" for k in range(len(names))]


def test_a_step_runs_its_refinement_where_its_profile_finds_a_slower_half_op(monkeypatch,
                                                                            caplog):
    """The cost model's colouring wins the first rounds; its per-node profile (injected)
    shows the half Relu slower than float32's: the refinement (Relu float32) is timed beside
    it, wins, and is what the function runs."""
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "always")
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "20")
    bf16 = tf.bfloat16.as_datatype_enum

    def timed(graphs):
        return {name: (0.05,) * 3 if name == "refined" else
                (0.1,) * 3 if name == "cost model" else (0.2,) * 3 for name in graphs}

    def profiled(graphs):
        return {name: {n.name: (3e-4 if n.attr["T"].type == bf16 else 1e-4)
                       if n.op == "Relu" else 1e-4
                       for n in graph.node if n.op in ("Relu", "MatMul")}
                for name, graph in graphs.items()}
    calls = fake_timing.install_step_timer(monkeypatch, timed, profiled)
    step, _, acc = _step()
    mixed = tf_mpt.function(step.python_function, dtype="bfloat16",
                            input_signature=step.input_signature)
    with caplog.at_level(logging.INFO, logger="tf_mpt"):
        out = mixed(tf.ones((64, WIDTH)))
    assert out.dtype == tf.float32
    graph = mixed.get_concrete_function(tf.TensorSpec([None, WIDTH], tf.float32)).graph
    ops = graph.get_operations()
    assert {op.get_attr("T") for op in ops if op.type == "MatMul"} == {tf.bfloat16}
    assert {op.get_attr("T") for op in ops if op.type == "Relu"} == {tf.float32}
    (message,) = [r.getMessage() for r in caplog.records if "timed tf.function" in r.getMessage()]
    assert "refined (Relu x1 float32) 50 ms beside cost model 100 ms; picked refined, 4.00x " \
        "float32 over the prediction (cost model)" in message, message
    # (the pick's profile beside float32's, then the refined version timed beside the pick)
    assert calls.profiles == [["float32", "cost model"]]
    assert [names for _, _, names, _ in calls.times] == [
        ["float32", "cost model", "contractions only"], ["cost model", "refined"]]
    np.testing.assert_array_equal(acc.numpy(), np.full((64, WIDTH), 0.25, np.float32))


@pytest.mark.measures_this_cpu
def test_a_step_too_slow_for_the_budget_stops_after_one_round():
    step, _, acc = _step()
    cf = step.get_concrete_function()
    with pytest.raises(_safety.NotTimed, match=r"one round of the 2 candidates takes \d+\.\d s: "
                                                r"3 rounds do not fit in the 0 s the rounds may "
                                                r"spend of the budget"):
        _step_sandbox.time_versions(cf, _versions(cf), 64, _rounds.rounds, budget_seconds=0.0)
    assert not acc.numpy().any()


@pytest.mark.measures_this_cpu
def test_a_step_too_slow_to_time_has_its_peaks_measured_on_its_copies():
    """A step whose rounds do not fit (TooSlow, a NotTimed) has each candidate's peak
    measured instead by its timer's peaks_only (decision's memory check): one first run and
    one traced run each, in the same sandbox, on the copies; the float32 step holds its two
    float32 products' 64 x WIDTH outputs at least. The script's variables stay as they were."""
    step, _, acc = _step()
    cf = step.get_concrete_function()
    versions = _versions(cf)
    timer = _functions._step_timer(cf, False, cf.graph.as_graph_def())  # pylint: disable=W0212
    try:
        with pytest.raises(_safety.TooSlow, match="do not fit"):
            timer.time(versions, 0.0, _BATCH_64)
        assert timer.peaks == {}
        runs = timer.peaks_only(versions, _BATCH_64)
    finally:
        timer.close()
    assert set(runs) == {"float32", "mixed"} and all(len(t) == 1 for t in runs.values())
    assert set(timer.peaks) == {"float32", "mixed", _ledger.RESIDENT}, timer.peaks
    assert timer.peaks["float32"] >= 64 * WIDTH * 4 and timer.peaks["mixed"] > 0, timer.peaks
    assert timer.peaks[_ledger.RESIDENT] >= (WIDTH * WIDTH + 64 * WIDTH) * 4, timer.peaks
    assert not acc.numpy().any()


@pytest.mark.measures_this_cpu
def test_variables_too_big_to_copy_are_not_timed():
    """w [512x512] float32 alone is 1 MiB: above a 1 MiB bound with the input and acc."""
    step, _, _ = _step()
    cf = step.get_concrete_function()
    bound = dataclasses.replace(_BATCH_64, max_copy_bytes=1 << 20)
    with pytest.raises(_safety.NotTimed, match=r"copies of its variables would take over "
                                                r"1 MiB"):
        _step_sandbox.time_versions(cf, _versions(cf), 64, _rounds.rounds, policy=bound)
    _step_sandbox.time_versions(cf, _versions(cf), 64, _rounds.rounds, budget_seconds=0.5)


def test_a_nodes_called_functions_come_in_the_order_of_their_attrs_names():
    """function_bodies.called_functions: the same in every process whatever order a node's
    attrs were set in (a protobuf map's own order is not: a While's body and cond), so a
    step's cache key numbers its functions alike."""
    from tf_mpt.rewrite import function_bodies  # pylint: disable=import-outside-toplevel
    names = [f"attr{k:02d}" for k in range(12)]
    for order in (names, names[::-1], names[1::2] + names[::2]):
        node = tf.compat.v1.NodeDef(name="n", op="While")
        for name in order:
            node.attr[name].func.name = f"body_of_{name}"
        node.attr["list"].list.func.add().name = "body_of_list"
        assert [f.name for f in function_bodies.called_functions(node)] == \
            [f"body_of_{name}" for name in names[:12]] + ["body_of_list"]
