"""The README's main job, examples/rewrite_conv_net.py: trains float32 and tf_mpt side by side
from the same seeds and prints the accuracy each way as mean and spread over the seeds, the
difference with an uncertainty that counts float32's own run-to-run spread, and the measured
speed-up; on a CPU without native bfloat16 (injected here through TF_MPT_CPU_FLAGS) it says so
and trains float32 only. Structure and accuracy, not speed.

The example decides for this machine by default (`auto`: measured here on a CPU with native
bfloat16); the tests fix the target to the rules (TF_MPT_TARGET=rules), so that what they
check does not depend on this CPU's clock: the rewrite converts, the mixed Session executes
half ops (counted in its partition graphs), and both ways reach the same held-out accuracy
within the stated uncertainty. The tests run `--quick` (a smaller net on 16x16 images: ~40 s
of bfloat16 training where TensorFlow's bfloat16 kernels are Eigen's, as on a Skylake-SP);
the README's figures are the full run's."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from support.helpers import child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# both ways learn the 10 class patterns well past chance (0.1): --quick's 120 steps reach
# ~0.98 in float32 (Zen 4: 0.983-0.989 over the three seeds)
MIN_ACCURACY = 0.9
# The claim: |mean(tf_mpt) - mean(float32)| held-out accuracy, in points, is within this
# many standard errors of the difference of means (over the seeds each way: the runs'
# spread, float32's own included) plus ACCURACY_POINTS (with three seeds a way the spread is
# itself an estimate, and can come out near zero where every run reaches ~0.98: a point
# keeps that from failing a run bfloat16's rounding moves by a few images). Zen 4, --quick:
# -0.44 points, standard error 0.21 (oneDNN's kernels); -0.03, 0.61 (Eigen's).
ACCURACY_STANDARD_ERRORS, ACCURACY_POINTS = 3.0, 1.0


def holds(points, error):
    """Whether a difference of `points` with standard error `error` is parity as claimed."""
    return abs(points) <= ACCURACY_STANDARD_ERRORS * error + ACCURACY_POINTS


def _run(*args, **env):
    full = child_env()
    full.update(TF_MPT_TARGET="rules")
    full.update(env, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "examples/rewrite_conv_net.py", "--quick", *args],
                          env=full, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_main_job_trains_both_ways_and_prints_the_measured_speed_up():
    out = _run("--dtype", "bfloat16")
    assert re.search(r"^Converted [1-9]\d*/\d+ nodes to bfloat16 using \d+ cast\(s\)", out,
                     re.M), out
    rows = {label: (float(accuracy), float(sd), int(half)) for label, accuracy, sd, half in
            re.findall(r"^(float32|tf_mpt bfloat16) +[\d.]+ +[\d.]+ +([\d.]+) +([\d.]+) +(\d+) "
                       r"+[\d.]+$", out, re.M)}
    assert set(rows) == {"float32", "tf_mpt bfloat16"}, out
    assert all(accuracy >= MIN_ACCURACY for accuracy, _, _ in rows.values()), out
    assert rows["float32"][2] == 0 and rows["tf_mpt bfloat16"][2] > 0, out  # half ops ran
    per_seed = {label: [float(a) for a in accuracies.split()] for label, accuracies in
                re.findall(r"^(float32|tf_mpt bfloat16) accuracy per seed: ([\d. ]+)$", out,
                           re.M)}
    assert [len(a) for a in per_seed.values()] == [3, 3], out
    (points, error, seeds), = re.findall(
        r"^accuracy of tf_mpt bfloat16 minus float32: ([+-][\d.]+) points, standard error "
        r"([\d.]+) \(difference of means over (\d+) seeds each way, counting float32's own "
        r"run-to-run spread\)$", out, re.M)
    # the printed figures are the per-seed accuracies' (mean, sd, difference, its error)
    for label, (accuracy, sd, _) in rows.items():
        assert accuracy == pytest.approx(np.mean(per_seed[label]), abs=1e-3), out
        assert sd == pytest.approx(np.std(per_seed[label], ddof=1), abs=1e-3), out
    mixed, single = 100 * np.array(per_seed["tf_mpt bfloat16"]), 100 * np.array(
        per_seed["float32"])
    assert float(points) == pytest.approx(mixed.mean() - single.mean(), abs=0.02), out
    assert float(error) == pytest.approx(np.sqrt(
        mixed.var(ddof=1) / 3 + single.var(ddof=1) / 3), abs=0.02), out
    assert int(seeds) == 3
    assert holds(float(points), float(error)), out
    assert re.search(r"^speed-up of tf_mpt bfloat16 over float32: \d+\.\d\dx, measured above",
                     out, re.M), out


@pytest.mark.heavy
def test_the_claim_fails_for_a_mixed_run_that_is_really_worse():
    """The check above can fail: a mixed graph whose weight gradients are 16x too small (a
    loss scale divided out that was never multiplied in) learns far less in --quick's 120
    steps, and its difference from float32 is beyond the claim. (The issue's own examples, the
    logits' softmax in half and float16 without a loss scale, leave this task's accuracy
    within a point: its gradients neither overflow nor underflow.)"""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import rewrite_conv_net as job  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    import tf_mpt  # pylint: disable=import-outside-toplevel
    size, seeds = job.QUICK, 3
    fetches = ["loss", "accuracy", "correct", "train", "init"]
    single = job.build_graph(size)
    worse = tf_mpt.rewrite_graph(job.build_graph(size, gradient_scale=1 / 16),
                                 dtype="bfloat16", fetches=fetches, target="rules")
    runs = job.run_seeds([single, worse], size, size.steps, seeds)
    for run in runs:
        run.session.close()
    points, error = job.difference_of_means(runs[1].accuracies, runs[0].accuracies)
    assert min(runs[0].accuracies) >= MIN_ACCURACY, runs[0].accuracies
    assert not holds(points, error), (points, error, runs[0].accuracies, runs[1].accuracies)


def test_main_job_on_a_cpu_without_native_bfloat16_says_so_and_stays_float32():
    out = _run("--seeds", "2", TF_MPT_CPU_FLAGS="avx2")
    assert "native bfloat16: no" in out and "keeps this script in float32" in out
    assert "Converted" not in out and "speed-up" not in out
    assert re.search(r"^float32, 120 steps of batch 32 \(16x16x3\) from 2 seeds: first loss "
                     r"[\d.]+, last loss [\d.]+, accuracy [\d.]+ sd [\d.]+ on 2048 held-out "
                     r"images", out, re.M), out


# under -m heavy: an explicit bfloat16 honoured on a CPU without it stays in the default run
# (test_convert_targets.py's Zen 3 `auto` conversion: every convolution and product bfloat16),
# and the main job on such a CPU too (the test above)
@pytest.mark.heavy
def test_main_job_asked_for_bfloat16_on_a_cpu_without_it_writes_the_bfloat16_graph():
    """An explicit --dtype is honoured on every CPU: the target is then the op lists (this
    CPU's emulated kernels say nothing about the machine that will run the model), never a
    float32/bfloat16 hybrid slower than both."""
    out = _run("--dtype", "bfloat16", "--steps", "3", "--seeds", "2",
               TF_MPT_CPU_FLAGS="avx2 avx512f avx512_vnni",
               TF_MPT_TARGET="auto")  # what auto resolves to there
    assert re.search(r"^Converted \d+/\d+ nodes to bfloat16 using \d+ cast\(s\) for target "
                     r"rules; \d+ compute variable updates \(an optimizer's step, moving "
                     r"averages\): kept float32$", out, re.M), out
    rows = {op: (int(allow), int(deny), int(fp32)) for op, allow, deny, fp32 in
            re.findall(r"^(\w+) +(\d+) +(\d+) +(\d+)$", out, re.M)}
    # the three convolutions, their gradients and the dense layer: all bfloat16
    assert rows["Conv2D"] == (3, 0, 0) and rows["MatMul"][1:] == (0, 0), out
    assert rows["Conv2DBackpropFilter"] == (3, 0, 0), out
    assert re.search(r"^speed-up of tf_mpt bfloat16 over float32: \d+\.\d\dx, measured above "
                     r"\(no native kernels for it on this CPU: expected slower\)$", out, re.M), out
