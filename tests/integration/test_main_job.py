"""The README's main job, examples/rewrite_conv_net.py: trains float32 and tf_mpt side by side
and prints the measured speed-up; on a CPU without native bfloat16 (injected here through
TF_MPT_CPU_FLAGS) it says so and trains float32 only. Structure and accuracy, not speed.

The example decides for this machine by default (`auto`: measured here on a CPU with native
bfloat16); the tests fix the target to the rules (TF_MPT_TARGET=rules), so that what they
check does not depend on this CPU's clock: the rewrite converts, the mixed Session executes
half ops (counted in its partition graphs), and both models reach the same held-out
accuracy within a stated margin."""

import os
import re
import subprocess
import sys
from support.helpers import child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STEPS = "40"
# both ways learn the 10 class patterns well past chance (0.1) in 40 steps
MIN_ACCURACY = 0.5
# |tf_mpt - float32| held-out accuracy, in points: within this many standard errors of the
# paired difference, plus ACCURACY_POINTS (bfloat16's rounding moves a few borderline
# images; Zen 4: -0.71 points, standard error 0.67, in 40 steps)
ACCURACY_STANDARD_ERRORS, ACCURACY_POINTS = 3.0, 1.0


def _run(*args, steps=STEPS, **env):
    full = child_env()
    full.update(TF_MPT_TARGET="rules")
    full.update(env, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "examples/rewrite_conv_net.py", "--steps", steps,
                           *args], env=full, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_main_job_trains_both_ways_and_prints_the_measured_speed_up():
    out = _run("--dtype", "bfloat16")
    assert re.search(r"^Converted [1-9]\d*/\d+ nodes to bfloat16 using \d+ cast\(s\)", out,
                     re.M), out
    rows = {label: (float(accuracy), int(half)) for label, accuracy, half in re.findall(
        r"^(float32|tf_mpt bfloat16) +[\d.]+ +[\d.]+ +([\d.]+) +(\d+) +[\d.]+$", out, re.M)}
    assert set(rows) == {"float32", "tf_mpt bfloat16"}, out
    assert all(accuracy >= MIN_ACCURACY for accuracy, _ in rows.values()), out
    assert rows["float32"][1] == 0 and rows["tf_mpt bfloat16"][1] > 0, out  # half ops ran
    (points, error, images), = re.findall(
        r"^accuracy of tf_mpt bfloat16 minus float32: ([+-][\d.]+) points, standard error "
        r"([\d.]+) \(paired, (\d+) held-out images\)$", out, re.M)
    assert int(images) >= 4000
    assert abs(float(points)) <= ACCURACY_STANDARD_ERRORS * float(error) + ACCURACY_POINTS, out
    assert re.search(r"^speed-up of tf_mpt bfloat16 over float32: \d+\.\d\dx, measured above",
                     out, re.M), out


def test_main_job_on_a_cpu_without_native_bfloat16_says_so_and_stays_float32():
    out = _run(TF_MPT_CPU_FLAGS="avx2")
    assert "native bfloat16: no" in out and "keeps this script in float32" in out
    assert "Converted" not in out and "speed-up" not in out
    assert re.search(r"^float32: first loss [\d.]+, last loss [\d.]+, accuracy [\d.]+ on 4096 "
                     r"held-out images", out, re.M), out


def test_main_job_asked_for_bfloat16_on_a_cpu_without_it_writes_the_bfloat16_graph():
    """An explicit --dtype is honoured on every CPU: the target is then the op lists (this
    CPU's emulated kernels say nothing about the machine that will run the model), never a
    float32/bfloat16 hybrid slower than both."""
    out = _run("--dtype", "bfloat16", steps="3", TF_MPT_CPU_FLAGS="avx2 avx512f avx512_vnni",
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
