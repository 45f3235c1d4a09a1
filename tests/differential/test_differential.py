"""Differential tests: programs run in float32 and under TF_MPT_ENABLE=1 must agree.

- The harness itself can fail: programs that misbehave only when TF_MPT_ENABLE=1 is set
  (raise, hang, print NaN, print a value beyond tolerance or a different number of values)
  are judged worse, and a program whose float32 run fails is judged invalid.
- Fast profile (default run): from 200 derandomized hypothesis draws, the 5 TF1 and 3 TF2
  programs that cover the most pairs of components, each run in float16 or bfloat16
  (alternating) against its float32 run. About 40 s on 2 cores.
- Two wide TF1 programs (programs.WIDE_SPECS) in bfloat16: the cost model, reading the
  suite's table, converts their 512-wide products.
- Every pair of a graph program compares real half compute with float32: its mixed run
  executed half ops (support/half_ops.py counts them in the partition graphs TensorFlow ran) and its
  float32 run none; an eager program's executed none (eager ops run float32). The drawn
  programs' mixed runs decide by the rules, the wide ones' by the suite's injected cost
  table (programs.ProgramSpec.target): the decisions, and the counts, are the same on every
  CPU.
- Thorough profile (`-m slow`): the 24 TF1 + 16 TF2 programs of 400 + 400 draws that cover
  the most pairs of components (known differences included, counted as known), each in
  bfloat16, float16 (static loss scale) and float16 with tf_mpt's default dynamic loss
  scaling (there only crash / hang / non-finite count). About 13 min.

Every failure message holds the failing programs' sources (and the environment of the mixed
run), so each can be rerun by hand.
"""

import json
import os
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

# pytest puts tests/ on sys.path (tests/conftest.py, rootdir-relative "prepend" import mode),
# the way the other tests import `helpers`; tests/differential is the package `differential`.
from differential import harness, programs
from support import half_ops, helpers

# Drawing is deterministic (derandomize): every run draws the same candidates. No shrinking
# (the programs are run after drawing, outside hypothesis) and no example database.
DRAW_SETTINGS = dict(deadline=None, database=None, phases=[Phase.generate],
                     suppress_health_check=list(HealthCheck))
FAST_SETTINGS = settings(max_examples=harness.PROFILES["fast"]["candidates"],
                         derandomize=True, **DRAW_SETTINGS)
SELF_TEST_TIMEOUT_S = 20
HANG_TIMEOUT_S = 5


def _failure_message(verdicts, what):
    bad = harness.unexpected(verdicts)
    summary = harness.counts(verdicts)
    return (f"{what}: {len(bad)} of {summary['pairs']} pairs worse under TF_MPT_ENABLE=1 "
            f"({summary}). Each program below runs as `python -c SOURCE` with PYTHONPATH=<repo "
            f"root> and the environment shown; without TF_MPT_* it is the float32 reference.\n\n"
            + "\n\n".join(v.report() for v in bad))


def _run_profile(specs, profile):
    config = harness.PROFILES[profile]
    began = time.monotonic()
    verdicts = harness.run_profile(specs, config["variants"], config["alternate"],
                                   log=print)
    print(f"{profile}: {len(specs)} programs, {harness.counts(verdicts)} in "
          f"{time.monotonic() - began:.0f} s")
    assert not harness.unexpected(verdicts), _failure_message(verdicts, f"{profile} profile")
    unexpected = [v for v in verdicts if not v.half_as_expected]
    assert not unexpected, ("pairs of graph programs whose mixed run executed no half op "
                            "(they compared float32 with float32 and tested nothing), or of "
                            "eager programs that executed some:\n\n"
                            + "\n\n".join(v.report() for v in unexpected))
    # most pairs compare half with float32: the quick profile draws at most one eager
    # program, the thorough one 12 of 40 (eager programs run float32, checked above)
    assert sum(v.real_half for v in verdicts) >= len(verdicts) // 2
    return verdicts


# ---------------------------------------------------------------------------------------------
# the harness can fail

def _program(body):
    """A tiny program without TensorFlow: `body` computes `values` (a list of floats);
    `enabled` says whether TF_MPT_ENABLE=1 is set."""
    return ("import json, math, os, time\n"
            "enabled = os.environ.get('TF_MPT_ENABLE') == '1'\n"
            f"{body}\n"
            "print(json.dumps({'values': values}))\n")


SELF_TESTS = {
    # name: (program body, dtype, expected kind)
    "identical": ("values = [1.0, -2.5, 0.0]", "bfloat16", harness.OK),
    "within_tolerance": ("values = [1.04 if enabled else 1.0, 0.015 if enabled else 0.0]",
                         "bfloat16", harness.OK),
    "raises_only_when_enabled": (
        "values = [1.0]\nif enabled:\n    raise RuntimeError('only under tf_mpt')",
        "float16", harness.ERROR),
    "exits_nonzero_only_when_enabled": (
        "values = [1.0]\nif enabled:\n    os._exit(3)", "float16", harness.ERROR),
    "no_result_only_when_enabled": (
        "values = [1.0]\nif enabled:\n    print('no json'); raise SystemExit(0)",
        "bfloat16", harness.ERROR),
    "hangs_only_when_enabled": (
        "values = [1.0]\nif enabled:\n    time.sleep(60)", "bfloat16", harness.TIMEOUT),
    "nan_only_when_enabled": ("values = [float('nan') if enabled else 1.0, 2.0]",
                              "bfloat16", harness.NONFINITE),
    "inf_only_when_enabled": ("values = [2.0, float('inf') if enabled else 1e30]",
                              "float16", harness.NONFINITE),
    "beyond_float16_tolerance": ("values = [1.05 if enabled else 1.0]", "float16",
                                 harness.MISMATCH),
    "beyond_bfloat16_tolerance": ("values = [0.3 if enabled else 0.0]", "bfloat16",
                                  harness.MISMATCH),
    "value_count_differs": ("values = [1.0, 2.0] if enabled else [1.0]", "bfloat16",
                            harness.MISMATCH),
    "nan_in_both_is_not_worse": ("values = [float('nan'), 1.0]", "float16", harness.OK),
    "float32_run_fails": ("values = [1.0]\nif not enabled:\n    raise ValueError('bad program')",
                          "bfloat16", harness.INVALID),
}


@pytest.mark.parametrize("name", sorted(SELF_TESTS))
def test_harness_judges_a_worse_mixed_run(name):
    body, dtype, expected = SELF_TESTS[name]
    source = _program(body)
    timeout = HANG_TIMEOUT_S if expected == harness.TIMEOUT else SELF_TEST_TIMEOUT_S
    verdict = harness.run_pair(source, dtype, timeout)
    assert verdict.kind == expected, verdict.report()
    assert verdict.worse == (expected in harness.WORSE_KINDS)
    report = verdict.report()
    assert source.strip().splitlines()[-1] in report  # the source is there to reproduce it
    if "RuntimeError" in body:
        assert "only under tf_mpt" in verdict.detail + report  # stderr tail is shown
    if expected == harness.TIMEOUT:
        assert verdict.mixed.timed_out and verdict.mixed.seconds < SELF_TEST_TIMEOUT_S


def test_environments(monkeypatch):
    """float32 runs see no TF_MPT_* variable even when the caller sets some; mixed runs keep
    the caller's cost table and step timing (the suite's: the same decisions on every CPU);
    float16's numeric comparison runs with a static loss scale, the dynamic variant with
    none."""
    assert harness.mixed_env_vars("bfloat16")["TF_MPT_OP_COSTS"] == os.environ["TF_MPT_OP_COSTS"]
    assert harness.mixed_env_vars("bfloat16")["TF_MPT_STEP_TIMING"] == "off"
    monkeypatch.setenv("TF_MPT_ENABLE", "1")
    monkeypatch.setenv("TF_MPT_DTYPE", "float16")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    env = harness.base_env()
    # no switch of tf_mpt's: only the dispatch check off and a cache of the run's own, as
    # for every child script (support/helpers.child_env), never the user's
    assert sorted(k for k in env if k.startswith("TF_MPT_")) == [
        "TF_MPT_CACHE_DIR", "TF_MPT_DISPATCH_CHECK"]
    assert env["TF_MPT_DISPATCH_CHECK"] == "0"
    assert env["TF_MPT_CACHE_DIR"] == os.environ[helpers.RUN_CACHE]
    assert "TF_USE_LEGACY_KERAS" not in env and env["PYTHONPATH"] == harness.ROOT
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert harness.base_env(legacy_keras=True)["TF_USE_LEGACY_KERAS"] == "1"
    assert harness.mixed_env_vars("float16")["TF_MPT_LOSS_SCALE"] == \
        harness.FLOAT16_NUMERIC_LOSS_SCALE
    assert "TF_MPT_LOSS_SCALE" not in harness.mixed_env_vars("float16", "dynamic")
    assert "TF_MPT_LOSS_SCALE" not in harness.mixed_env_vars("bfloat16")
    source = _program("values = [float(len([k for k in os.environ if k.startswith('TF_MPT_')]))]")
    verdict = harness.run_pair(source, "float16", SELF_TEST_TIMEOUT_S, compare_values=False)
    assert verdict.reference.result["values"] == [2.0]  # DISPATCH_CHECK, CACHE_DIR
    assert verdict.mixed.result["values"][0] >= 5  # and ENABLE, DTYPE, LOSS_SCALE


def test_programs_render_and_compile():
    """Every component renders to valid Python (no TensorFlow needed)."""
    candidates = (harness.draw_specs(programs.tf1_specs(), 50, FAST_SETTINGS)
                  + harness.draw_specs(programs.tf2_specs(), 50, FAST_SETTINGS))
    seen = set()
    for spec in candidates:
        source = spec.source()
        compile(source, spec.describe(), "exec")
        assert "tf_mpt" not in source
        seen |= spec.tags()
    for block in programs.TF1_BLOCKS:
        assert f"block:{block}" in seen
    for kind in programs.TF2_KINDS:
        assert f"tf2:{kind}" in seen


_HALF_PROGRAM = """
import json, os
import numpy as np
import tensorflow as tf
dtype = tf.as_dtype(os.environ["PROGRAM_DTYPE"])
x = tf.constant(np.eye(4, dtype=np.float32))
f = tf.function(lambda x: tf.cast(tf.matmul(tf.cast(x, dtype), tf.cast(x, dtype)), tf.float32))
graph = tf.Graph()
with graph.as_default():
    p = tf.compat.v1.placeholder(tf.float32, [4, 4])
    a = tf.cast(p, dtype)
    b = tf.cast(tf.nn.relu(tf.matmul(a, a)), tf.float32)
with tf.compat.v1.Session(graph=graph) as sess:
    y = sess.run(b, {p: np.eye(4, dtype=np.float32)})
y = y + f(x).numpy()
print(json.dumps({"values": [float(v) for v in y.ravel()]}))
"""


# under -m heavy (two more launches): the default run's fast profile judges real half compute
# through the same counting, which fails where it counts none
@pytest.mark.heavy
def test_the_observer_counts_the_half_ops_a_run_executed():
    """In a tf.function and a TF1 Session: a bfloat16 run counts its MatMuls (and the
    Session's Relu), a float32 run counts none, and only the pair of the two is real half
    compute (the harness runs no tf_mpt here: the counting alone is tested)."""
    runs = {dtype: harness.run_source(_HALF_PROGRAM, {"PROGRAM_DTYPE": dtype}, 60)
            for dtype in ("float32", "bfloat16")}
    assert not runs["float32"].failed and not runs["bfloat16"].failed, runs
    assert runs["float32"].half_ops == 0 and runs["float32"].observed["float_ops"] >= 3
    half_types = runs["bfloat16"].observed["half_types"]
    assert sum(n for op, n in half_types.items() if op.endswith("MatMul")) == 2, half_types
    assert sum(n for op, n in half_types.items() if "Relu" in op) == 1, half_types
    assert harness.judge(_HALF_PROGRAM, "bfloat16", runs["float32"], runs["bfloat16"]).real_half
    assert not harness.judge(_HALF_PROGRAM, "bfloat16", runs["float32"],
                             runs["float32"]).real_half


def test_the_observer_reads_onednns_renames_as_the_op_they_run():
    """oneDNN's layout pass renames the ops it takes, and which differs from CPU to CPU (a
    float16 Conv2D is _MklNativeConv2D only where the CPU has avx512_fp16): the counts name
    the op the program's graph has."""
    assert [half_ops.op_type(name) for name in (
        "Conv2D", "_MklNativeConv2D", "_MklConv2D", "_MklNativeConv2DBackpropFilter",
        "_MklFusedMatMul", "_MklNativeFusedConv2D", "_FusedMatMul", "Relu")] == [
        "Conv2D", "Conv2D", "Conv2D", "Conv2DBackpropFilter", "_FusedMatMul",
        "_FusedConv2D", "_FusedMatMul", "Relu"]


# ---------------------------------------------------------------------------------------------
# profiles

# The fast profile's programs (the most-covering first in each kind), in two parts: the first
# TF1 and the first TF2 program in the default run, the rest under -m heavy.
DEFAULT_PART = {"tf1": 1, "tf2": 1}


def _fast_part(heavy):
    specs = harness.profile_specs("fast", settings_=FAST_SETTINGS)
    counts = harness.PROFILES["fast"]
    assert len(specs) == counts["tf1"] + counts["tf2"]
    tf1, tf2 = [s for s in specs if s.kind == "tf1"], [s for s in specs if s.kind == "tf2"]
    split1, split2 = DEFAULT_PART["tf1"], DEFAULT_PART["tf2"]
    return tf1[split1:] + tf2[split2:] if heavy else tf1[:split1] + tf2[:split2]


def test_fast_profile():
    _run_profile(_fast_part(heavy=False), "fast")


@pytest.mark.heavy
def test_fast_profile_the_rest():
    _run_profile(_fast_part(heavy=True), "fast")


@pytest.mark.parametrize("index", [
    pytest.param(i, id=f"wide{i}", marks=() if i == 0 else pytest.mark.heavy)
    for i in range(len(programs.WIDE_SPECS))])
def test_a_wide_program_compares_the_cost_models_half_compute(index):
    """Its mixed run decides by the suite's table, whose cost model converts the wide
    products: the pair compares the half compute the cost model chose with float32."""
    (verdict,) = harness.run_spec(programs.WIDE_SPECS[index], ("bfloat16",))
    assert verdict.ok and verdict.real_half, verdict.report()
    assert "for target op_costs_zen4.json" in verdict.mixed.stderr, verdict.report()


@pytest.mark.slow
def test_thorough_profile():
    thorough = settings(max_examples=harness.PROFILES["thorough"]["candidates"],
                        derandomize=True, **DRAW_SETTINGS)
    specs = harness.profile_specs("thorough", settings_=thorough)
    verdicts = _run_profile(specs, "thorough")
    print(json.dumps(harness.counts(verdicts)))
