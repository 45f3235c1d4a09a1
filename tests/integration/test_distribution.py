"""LossScaleOptimizer under tf.distribute: one decision and one scale for every replica.

Each run injects NaN into the loss of one replica (or one worker) at step 1 only. Every
replica must skip that step together (weights and global_step unchanged everywhere, scale
halved everywhere), no process may hang, and the copies must stay identical.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

from support.helpers import alternating, heavy_except

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(HERE, "..", "support")
TIMEOUT_S = 240
NAN_STEP = 1
# 2 replicas: x = ones * (replica + 1), loss = sum(x @ w): summed gradient 2 + 4 = 6 per weight.
# Momentum(0.1, 0.9): w0 = 1 - 0.6 = 0.4; skipped; w = 0.4 - 0.1 * (6 + 0.9 * 6) = -0.74;
# w = -0.74 - 0.1 * (6 + 0.9 * 11.4) = -2.366.
EXPECTED_W = [0.4, 0.4, -0.74, -2.366]
EXPECTED_STEP = [1, 1, 2, 3]
EXPECTED_SCALE = [16.0, 8.0, 16.0, 32.0]  # initial 8, increment_period 1


def _run(args, env=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _json_lines(proc):
    """The JSON lines a worker printed (fails the test if it hangs or fails)."""
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"worker hung for {TIMEOUT_S} s")
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _records(proc, reduce_dtype=None):
    """The per-step records; with `reduce_dtype`, checks every cross-replica reduction the
    step's graph runs is in that dtype."""
    records = _json_lines(proc)
    ops = records.pop()["reduce_ops"]
    if reduce_dtype is not None:
        assert ops and {dtype for _, dtype in ops} == {reduce_dtype}, ops
    return records


def _check(records, copies):
    assert [r["step"] for r in records] == list(range(4))
    for record, w, step, scale in zip(records, EXPECTED_W, EXPECTED_STEP, EXPECTED_SCALE):
        assert len(record["w"]) == copies
        for copy in record["w"]:
            assert copy == pytest.approx([w] * 3, abs=1e-5), record
            assert copy == record["w"][0]
        assert record["scale"] == [scale] * len(record["scale"])
        assert record["global_step"] == step


ALLREDUCE_DTYPES = ["float32", "float16", "bfloat16"]


# float16 all-reduce in a tf.function by default (a TF1 graph's replicas: the multi-worker
# test below); every pair under -m heavy
@pytest.mark.parametrize("allreduce, mode", heavy_except(
    alternating(ALLREDUCE_DTYPES, ["graph", "function"]), ("float16-function",)))
def test_mirrored_strategy_replicas_skip_together(mode, allreduce):
    """Also with the gradients all-reduced in a half type (the expected weights are exact
    in float16 and bfloat16 too: small integers times the scale)."""
    proc = _run([os.path.join(SUPPORT, "mirrored_worker.py"), mode, str(NAN_STEP), allreduce])
    _check(_records(proc, reduce_dtype=allreduce), copies=2)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# under -m heavy (three processes, two workers and their cluster): replicas that skip a step
# together under a MirroredStrategy stay in the default run
@pytest.mark.heavy
@pytest.mark.parametrize("allreduce", ALLREDUCE_DTYPES)
def test_multi_worker_mirrored_strategy_workers_skip_together(allreduce):
    workers = [f"127.0.0.1:{_free_port()}" for _ in range(2)]
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(_run([os.path.join(SUPPORT, "mwms_worker.py"), str(NAN_STEP), allreduce],
                          env={"TF_CONFIG": json.dumps(tf_config)}))
    results = [_records(p, reduce_dtype=allreduce) for p in procs]
    for records in results:
        assert [r["global_step"] for r in records] == EXPECTED_STEP
        assert [r["scale"] for r in records] == EXPECTED_SCALE
        for record, w in zip(records, EXPECTED_W):
            assert record["w"] == pytest.approx([w] * 3, abs=1e-5)
    assert results[0] == results[1]


# tf2_mirrored_worker.py: the TF2 automatic path (float16) under MirroredStrategy. Its inputs
# are mirrored_worker.py's times X_SCALE, so the weights move X_SCALE times as far; the loss
# scale starts at 2^15, is halved by the NaN step and does not grow (increment period 2000).
X_SCALE = 2.0 ** -6
TF2_EXPECTED_SCALE = [2.0 ** 15, 2.0 ** 14, 2.0 ** 14, 2.0 ** 14]


def _check_tf2(records):
    assert [r["step"] for r in records] == list(range(4))
    for record, w, step, scale in zip(records, EXPECTED_W, EXPECTED_STEP, TF2_EXPECTED_SCALE):
        for copy in record["w"]:
            assert copy == pytest.approx([1 + X_SCALE * (w - 1)] * 3, abs=1e-6), record
            assert copy == record["w"][0]
        assert record["scale"] == [scale] * len(record["w"])
        assert record["iterations"] == step


@pytest.mark.parametrize("allreduce, mode", heavy_except(
    alternating(ALLREDUCE_DTYPES, ["function", "eager"]), ("bfloat16-function",)))
def test_tf2_custom_loop_replicas_skip_together_with_automatic_scaling(mode, allreduce):
    proc = _run([os.path.join(SUPPORT, "tf2_mirrored_worker.py"), mode, str(NAN_STEP), allreduce])
    records = _records(proc, reduce_dtype=allreduce if mode == "function" else None)
    _check_tf2(records)
    assert all(len(r["w"]) == 2 for r in records)


# under -m heavy: workers skipping together stay in the default run (a TF1 graph's, above)
@pytest.mark.parametrize("allreduce", [pytest.param("float32", marks=pytest.mark.heavy),
                                       pytest.param("float16", marks=pytest.mark.heavy)])
def test_tf2_custom_loop_workers_skip_together_with_automatic_scaling(allreduce):
    workers = [f"127.0.0.1:{_free_port()}" for _ in range(2)]
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(_run([os.path.join(SUPPORT, "tf2_mirrored_worker.py"), "mwms", str(NAN_STEP),
                           allreduce], env={"TF_CONFIG": json.dumps(tf_config)}))
    results = [_records(p, reduce_dtype=allreduce) for p in procs]
    for records in results:
        _check_tf2(records)
    assert results[0] == results[1]



# A half-precision all-reduce may cost the digits task at most this much test accuracy
# against the float32 run (digits.py: one epoch's accuracy alone swings by 2 points; the
# worker averages the last 3 epochs).
DIGITS_ACCURACY_TOL = 0.015


@pytest.mark.heavy
def test_digits_with_half_all_reduce_reaches_float32_accuracy():
    proc = _run([os.path.join(SUPPORT, "digits_mirrored_worker.py"), *ALLREDUCE_DTYPES])
    runs = {r["run"]: r for r in _json_lines(proc)}
    baseline = runs.pop("off")  # float32, tf_mpt off
    assert baseline["accuracy"] > 0.9
    assert sorted(runs) == sorted(ALLREDUCE_DTYPES)
    for name, run in runs.items():  # float16 compute, all-reduce in `name`
        assert run["reduce_ops"] == [["CollectiveReduceV2", name]]
        assert run["accuracy"] >= baseline["accuracy"] - DIGITS_ACCURACY_TOL, (name, run)
