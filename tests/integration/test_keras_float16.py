"""Keras 3 `fit` in float16: tf_mpt's automatic path (TF_MPT_ENABLE=1 TF_MPT_DTYPE=float16,
Keras's step functions rewritten) against the script setting Keras's own `mixed_float16`
policy, and against float32, on a Transformer encoder (Adam), a convnet with batch norm
(SGD with momentum) and an LSTM classifier (RMSprop); subprocesses of
tests/support/keras_float16_worker.py.

Structure (the graphs TensorFlow ran for one training step): every matrix product runs in
float16 both ways and none in float32's run; each optimizer trains with a dynamic loss scale
(Keras's LossScaleOptimizer under the policy, tf_mpt's under the automatic path); the script
sees float32 where it did (the policy hands it float16 predictions); the Casts per step.
Numbers: tf_mpt's loss after every epoch within the TF2 pattern tests' final-loss tolerance
of float32's.

float16's speed target is a GPU, which these machines do not have: nothing here is timed.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from support.tolerances import FINAL_LOSS_RTOL
from support.helpers import child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORKER = os.path.join(ROOT, "tests", "support", "keras_float16_worker.py")
# a minute of Keras fits in three ways: run by CI (-m heavy), out of the default run
pytestmark = pytest.mark.heavy
CASES = ("transformer_adam", "convnet_sgd", "lstm_rmsprop")
WAYS = ("float32", "policy", "tf_mpt")


def _run(way):
    env = child_env(keep=("TF_MPT_CPU_FLAGS", "TF_MPT_CACHE_DIR"))
    env.update(PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
               TF_CPP_MIN_LOG_LEVEL="2")
    args = [sys.executable, WORKER, *CASES]
    if way == "policy":
        args[2:2] = ["--policy", "mixed_float16"]
    elif way == "tf_mpt":
        env.update(TF_MPT_ENABLE="1", TF_MPT_DTYPE="float16")
    proc = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{way}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs():
    return {way: _run(way) for way in WAYS}


@pytest.mark.parametrize("case", CASES)
def test_every_matrix_product_runs_in_float16_both_ways(runs, case):
    assert runs["float32"][case]["matrix"] > 0
    assert runs["float32"][case]["half_matrix"] == 0
    for way in ("policy", "tf_mpt"):
        got = runs[way][case]
        assert got["matrix"] == runs["float32"][case]["matrix"], (way, got)
        assert got["half_matrix"] == got["matrix"], (way, got)


@pytest.mark.parametrize("case", CASES)
def test_each_optimizer_trains_with_a_dynamic_loss_scale(runs, case):
    assert runs["float32"][case]["scale_kind"] is None
    for way, kind in (("policy", "keras"), ("tf_mpt", "tf_mpt")):
        got = runs[way][case]
        assert got["scale_kind"] == kind, (way, got)
        # dynamic: starts at 2**15 and only halves in 32 steps (it grows after 2000)
        exponent = math.log2(got["scale"])
        assert exponent == int(exponent) and 0 <= exponent <= 15, (way, got["scale"])
        # seen to move (keras_float16_worker._scale_moves): an overflowing step halves it and
        # is skipped; the step that completes the growth period doubles it and is applied
        moves = got["scale_moves"]
        assert moves["start"] == got["scale"], (way, moves)
        assert moves["after_overflow"] == moves["start"] / 2, (way, moves)
        assert moves["overflow_step_skipped"], (way, moves)
        assert moves["after_growth"] == moves["start"], (way, moves)
        assert moves["growth_step_applied"], (way, moves)


@pytest.mark.parametrize("case", CASES)
def test_the_script_sees_float32_only_under_tf_mpt(runs, case):
    float32 = runs["float32"][case]["dtypes"]
    assert float32 == {"predict": "float32", "evaluate": "float", "weights": ["float32"]}
    assert runs["tf_mpt"][case]["dtypes"] == float32
    assert runs["policy"][case]["dtypes"]["predict"] == "float16"  # the policy's outputs


@pytest.mark.parametrize("case", CASES)
def test_losses_match_float32_within_the_pattern_tolerance(runs, case):
    float32 = runs["float32"][case]["losses"]
    assert float32[-1] < 0.9 * float32[0], float32  # the models learn: a comparison that can fail
    losses = runs["tf_mpt"][case]["losses"]
    assert len(losses) == len(float32)
    for epoch, (got, want) in enumerate(zip(losses, float32)):
        assert got == pytest.approx(want, rel=FINAL_LOSS_RTOL["float16"]), epoch
    # (The policy is not held to it: its Transformer ends 3.2% above float32 here, two
    # steps skipped on overflow, its loss scale down to 8192; tf_mpt's is still 32768.)


# Where the rewrite still runs more Casts per step than the policy (Keras 3.x, TF 2.21):
# the Transformer keeps its Softmax and its bias gradients' Sums float32 (73 vs 70). The
# LSTM runs as many (19, 6 of them in its loops). The issue: 38, item 2.
_MORE_CASTS = pytest.mark.xfail(strict=True, reason="tf_mpt casts more than the policy here")


@pytest.mark.parametrize("case", [pytest.param("transformer_adam", marks=_MORE_CASTS),
                                  "convnet_sgd", "lstm_rmsprop"])
def test_no_more_casts_per_step_than_the_policy(runs, case):
    policy, tf_mpt = runs["policy"][case], runs["tf_mpt"][case]
    assert tf_mpt["casts"] > runs["float32"][case]["casts"]  # the conversion's own Casts ran
    assert tf_mpt["loop_casts"] <= policy["loop_casts"], (tf_mpt, policy)
    assert tf_mpt["casts"] <= policy["casts"], (tf_mpt, policy)
