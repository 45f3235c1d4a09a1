"""Differential tests: programs run in float32 and under TF_MPT_ENABLE=1 must agree.

- The harness itself can fail: programs that misbehave only when TF_MPT_ENABLE=1 is set
  (raise, hang, print NaN, print a value beyond tolerance or a different number of values)
  are judged worse, and a program whose float32 run fails is judged invalid.
- Fast profile (default run): from 200 derandomized hypothesis draws, the 5 TF1 and 3 TF2
  programs that cover the most pairs of components, each run in float16 or bfloat16
  (alternating) against its float32 run. About 40 s on 2 cores.
- Known differences: one program per programs.KNOWN_DIFFERENCES entry; it must still differ
  (reported as XFAIL with the bug's description; when tf_mpt is fixed it fails, asking for
  the entry to be removed).
- Thorough profile (`-m slow`): the 24 TF1 + 16 TF2 programs of 400 + 400 draws that cover
  the most pairs of components (known differences included, counted as known), each in
  bfloat16, float16 (static loss scale) and float16 with tf_mpt's default dynamic loss
  scaling (there only crash / hang / non-finite count). About 13 min.

Every failure message holds the failing programs' sources (and the environment of the mixed
run), so each can be rerun by hand.
"""

import json
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

# pytest puts tests/ on sys.path (tests/conftest.py, rootdir-relative "prepend" import mode),
# the way the other tests import `helpers`; tests/differential is the package `differential`.
from differential import harness, programs

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
    not_enabled = [v for v in verdicts if not v.mixed_enabled]
    assert not not_enabled, ("mixed runs in which tf_mpt never logged "
                             f"'{harness.ENABLED_LINE}' (they tested nothing):\n\n"
                             + "\n\n".join(v.report() for v in not_enabled))
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


def test_tolerances_are_stated_per_dtype():
    assert harness.TOLERANCES == {"bfloat16": dict(rtol=0.05, atol=0.02),
                                  "float16": dict(rtol=0.02, atol=0.01)}


def test_environments(monkeypatch):
    """float32 runs see no TF_MPT_* variable even when the caller sets some; float16's
    numeric comparison runs with a static loss scale, the dynamic variant with none."""
    monkeypatch.setenv("TF_MPT_ENABLE", "1")
    monkeypatch.setenv("TF_MPT_DTYPE", "float16")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    env = harness.base_env()
    assert not [k for k in env if k.startswith("TF_MPT_")]
    assert "TF_USE_LEGACY_KERAS" not in env and env["PYTHONPATH"] == harness.ROOT
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert harness.base_env(legacy_keras=True)["TF_USE_LEGACY_KERAS"] == "1"
    assert harness.mixed_env_vars("float16")["TF_MPT_LOSS_SCALE"] == \
        harness.FLOAT16_NUMERIC_LOSS_SCALE
    assert "TF_MPT_LOSS_SCALE" not in harness.mixed_env_vars("float16", "dynamic")
    assert "TF_MPT_LOSS_SCALE" not in harness.mixed_env_vars("bfloat16")
    source = _program("values = [float(len([k for k in os.environ if k.startswith('TF_MPT_')]))]")
    verdict = harness.run_pair(source, "float16", SELF_TEST_TIMEOUT_S, compare_values=False)
    assert verdict.reference.result["values"] == [0.0]
    assert verdict.mixed.result["values"][0] >= 3  # ENABLE, DTYPE, LOSS_SCALE


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


# ---------------------------------------------------------------------------------------------
# profiles

def test_fast_profile():
    specs = harness.profile_specs("fast", settings_=FAST_SETTINGS)
    assert len(specs) == harness.PROFILES["fast"]["tf1"] + harness.PROFILES["fast"]["tf2"]
    _run_profile(specs, "fast")


def _known_representatives():
    candidates = (harness.draw_specs(programs.tf1_specs(), 200, FAST_SETTINGS)
                  + harness.draw_specs(programs.tf2_specs(), 200, FAST_SETTINGS))
    found = []
    for index, entry in enumerate(programs.KNOWN_DIFFERENCES):
        dtype = entry["dtypes"][index % len(entry["dtypes"])]
        # the smallest program that shows it: fewest tags, then fewest steps
        matching = [s for s in candidates if programs.known_difference(s, dtype) is entry]
        matching.sort(key=lambda s: (len(s.tags()), len(s.blocks), s.steps))
        found.append((index, dtype, matching[0] if matching else None))
    return found


@pytest.mark.parametrize("index", range(len(programs.KNOWN_DIFFERENCES)))
def test_known_difference_still_differs(index):
    _, dtype, spec = _known_representatives()[index]
    entry = programs.KNOWN_DIFFERENCES[index]
    assert spec is not None, f"no drawn program matches KNOWN_DIFFERENCES[{index}]: {entry}"
    if spec.needs_legacy_keras and not harness.HAS_TF_KERAS:
        pytest.skip('needs tf_keras: python -m pip install --no-deps "tf_keras==2.21.*"')
    (verdict,) = harness.run_spec(spec, (dtype,))
    assert verdict.kind != harness.INVALID, verdict.report()
    if verdict.worse:
        pytest.xfail(f"known tf_mpt difference ({verdict.kind}, {dtype}): {entry['reason']}")
    pytest.fail(f"KNOWN_DIFFERENCES[{index}] no longer differs ({dtype}: {verdict.detail}); "
                f"if tf_mpt fixed it, remove the entry. Program:\n{verdict.report()}")


@pytest.mark.slow
def test_thorough_profile():
    thorough = settings(max_examples=harness.PROFILES["thorough"]["candidates"],
                        derandomize=True, **DRAW_SETTINGS)
    specs = harness.profile_specs("thorough", settings_=thorough)
    verdicts = _run_profile(specs, "thorough")
    print(json.dumps(harness.counts(verdicts)))
