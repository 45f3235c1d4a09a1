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

import tf_mpt
from tf_mpt import config as _config
from tf_mpt import report as _report
from tf_mpt import targets as _targets
from tf_mpt.rewrite import step_timing as _timing
from tf_mpt.rewrite import tf_functions as _functions

WIDTH = 512  # [64 x 512] x [512 x 512]: bfloat16 wins by the table, Casts included


def _report_with(saving_ms, changed_ms, target="here", converted=10):
    return _report.RewriteReport(dtype="bfloat16", total_nodes=100, converted_nodes=converted,
                                 casts_added=4, target=target,
                                 predicted_saving=saving_ms / 1e3,
                                 predicted_changed=changed_ms / 1e3)


_HERE = _targets.Target(_targets.HERE)
_STANDING_IN = _targets.Target("table", "/tables/op_costs_zen4.json", stands_in=True)
_ELSEWHERE = _targets.Target("table", "/tables/sapphire_rapids.json")
_RULES = _targets.Target(_targets.RULES)


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
    assert _timing.worth_timing(report, target, mode) is timed


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


def _mixed_graph_def(cf):
    """The rewritten graph of `cf` as tf_mpt.function keeps it to be timed, decided the way a
    user's run decides (the environment: the suite's injected table), never by this CPU."""
    config = dataclasses.replace(_config.Config.from_env(os.environ), step_timing="always")
    done = _functions._rewrite_concrete(  # pylint: disable=protected-access
        cf, "bfloat16", config, None, None, timed=True)
    assert done.function is not cf and done.graph_def is not None
    return done.graph_def


def test_both_versions_are_timed_on_copies_and_the_scripts_variables_stay_as_they_were():
    step, w, acc = _step()
    cf = step.get_concrete_function()
    before = acc.numpy().copy()
    timing = _timing.time_both(cf, _mixed_graph_def(cf), batch=64)
    assert len(timing.mixed) == len(timing.float32) == _timing.ROUNDS
    assert all(t > 0 for t in timing.mixed + timing.float32)
    assert timing.ratio == np.median(np.divide(timing.mixed, timing.float32))
    np.testing.assert_array_equal(acc.numpy(), before)  # the copies were updated, not acc
    np.testing.assert_array_equal(w.numpy(), np.eye(WIDTH, dtype=np.float32) * 0.5)


def test_a_failing_run_on_made_up_inputs_is_not_timed():
    """Both versions run: an assertion the made-up noise breaks stops the timing."""
    step, _, _ = _step(extra=lambda h: tf.debugging.assert_greater(h, 1e9, message="big"))
    cf = step.get_concrete_function()
    with pytest.raises(_timing.NotTimed, match=r"a run on made-up inputs failed "
                                                r"\(InvalidArgumentError: .*big"):
        _timing.time_both(cf, _mixed_graph_def(cf), batch=64)


@pytest.mark.parametrize("extra, op", [
    (lambda h: tf.print(tf.shape(h)), "PrintV2"),
    (lambda h: tf.py_function(lambda t: t, [h], tf.float32), "EagerPyFunc"),
])
def test_a_function_acting_outside_its_variables_is_not_timed(extra, op):
    step, _, _ = _step(extra=extra)
    cf = step.get_concrete_function()
    with pytest.raises(_timing.NotTimed, match=rf"op\(s\) with effects outside its "
                                                rf"variables: .*{op}"):
        _timing.time_both(cf, _mixed_graph_def(cf), batch=64)


def test_an_argument_whose_size_is_unknown_beyond_the_batch_is_not_timed():
    step, _, _ = _step(signature=[tf.TensorSpec([64, None], tf.float32)])
    cf = step.get_concrete_function()
    with pytest.raises(_timing.NotTimed, match=r"argument x:0 has shape \(64, None\): a size "
                                                r"other than the batch is unknown"):
        _timing.time_both(cf, cf.graph.as_graph_def(), batch=64)


@pytest.mark.parametrize("float32_faster", [True, False])
def test_tf_mpt_function_runs_the_version_timed_faster(monkeypatch, caplog, float32_faster):
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "always")
    seen = []

    def timed(cf, graph_def, batch):
        seen.append(batch)
        slow, fast = (0.2, 0.2, 0.2), (0.1, 0.1, 0.1)
        return _timing.Timing(*((slow, fast) if float32_faster else (fast, slow)))
    monkeypatch.setattr(_timing, "time_both", timed)
    step, _, acc = _step()
    mixed = tf_mpt.function(step.python_function, dtype="bfloat16",
                            input_signature=step.input_signature)
    x = tf.ones((64, WIDTH))
    with caplog.at_level(logging.INFO, logger="tf_mpt"):
        out = mixed(x)
    assert seen == [64]  # the batch of the call
    assert out.dtype == tf.float32
    graph = mixed.get_concrete_function(tf.TensorSpec([None, WIDTH], tf.float32)).graph
    matmuls = {op.get_attr("T") for op in graph.get_operations() if op.type == "MatMul"}
    messages = [r.getMessage() for r in caplog.records if "timed tf.function" in r.getMessage()]
    assert len(messages) == 1
    assert re.search(r"\(the cost model predicted a saving of \d+% of the kernel and Cast "
                     r"time it adds up\)$", messages[0]), messages[0]
    if float32_faster:
        assert matmuls == {tf.float32}
        assert "(median of 3 paired runs: 2.000x the time); it runs in float32, as traced" \
            in messages[0]
    else:
        assert matmuls == {tf.bfloat16}
        assert "0.500x the time); it runs in mixed precision" in messages[0]
    np.testing.assert_array_equal(acc.numpy(), np.full((64, WIDTH), 0.25, np.float32))


def test_a_step_too_slow_for_the_budget_stops_after_one_round():
    step, _, acc = _step()
    cf = step.get_concrete_function()
    with pytest.raises(_timing.NotTimed, match=r"one round of both takes \d+\.\d s: 3 rounds "
                                                r"do not fit in 0 s"):
        _timing.time_both(cf, _mixed_graph_def(cf), batch=64, budget_seconds=0.0)
    assert not acc.numpy().any()


def test_variables_too_big_to_copy_are_not_timed(monkeypatch):
    """w [512x512] float32 alone is 1 MiB: above a 1 MiB bound with the input and acc."""
    monkeypatch.setattr(_timing, "MAX_COPY_BYTES", 1 << 20)
    step, _, _ = _step()
    cf = step.get_concrete_function()
    with pytest.raises(_timing.NotTimed, match=r"copies of its variables would take over "
                                                r"1 MiB"):
        _timing.time_both(cf, _mixed_graph_def(cf), batch=64)
