"""Zero code on real TF1 patterns (tf1_patterns.py), each an unmodified script in a subprocess
under TF_MPT_ENABLE=1 with a timeout: queue runners + MonitoredTrainingSession, an iterator
initialised before the graph grows, make_callable + partial_run, a lookup table, graph growth
with two Sessions and a reopened one, large weights (peak memory).

Checked against the same script in float32: it finishes (a timeout fails with the last
output), half MatMuls really ran (partition graphs), losses stay within tolerance, peak memory
stays below what a second float32 copy of the weights would add.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from support import half_ops
from support.helpers import alternating, child_env, heavy_except

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SCRIPT = os.path.join(HERE, "..", "support", "tf1_patterns.py")
TIMEOUT_S = 240
# per-step loss of the mixed run vs the float32 run: |mixed - fp32| <= RTOL * |fp32| + ATOL
LOSS_TOLERANCE = {"bfloat16": (0.06, 0.03), "float16": (0.01, 0.005)}
# queue runners shuffle in two threads: compare the mean of the last steps, not each step
QUEUE_LOSS_ATOL = 0.1
# large_weights: 2 x 4096 x 4096 float32 weights; mixed precision adds their half copies and
# half gradients (about 1 x the weights); a second float32 copy of the weights (a shadow
# Session holding its own state) would add 2 x
WEIGHT_BYTES_MB = 2 * 4096 * 4096 * 4 / 2**20
PEAK_MEMORY_EXTRA_MB = 1.25 * WEIGHT_BYTES_MB
DETERMINISTIC = ["initializable_iterator", "callables", "lookup_table", "graph_growth",
                 "large_weights"]


def run_pattern(pattern, workdir, env):
    full_env = child_env()
    full_env.update(env, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    os.makedirs(workdir, exist_ok=True)
    try:
        proc = subprocess.run([sys.executable, SCRIPT, pattern, str(workdir)], env=full_env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        def tail(stream):  # bytes or str, depending on where the timeout struck
            text = stream.decode(errors="replace") if isinstance(stream, bytes) else stream
            return (text or "")[-3000:]
        pytest.fail(f"{pattern} with {env} did not finish in {TIMEOUT_S} s (a hang?); last "
                    f"output:\n{tail(timeout.stdout)}\n{tail(timeout.stderr)}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


@pytest.fixture(scope="module")
def float32(tmp_path_factory):
    cache = {}

    def get(pattern):
        if pattern not in cache:
            cache[pattern] = run_pattern(pattern, tmp_path_factory.mktemp(pattern), {})
            assert cache[pattern]["half_ops"] == 0
        return cache[pattern]
    return get


def _mixed_env(dtype, **extra):
    # These patterns' models are small: on a CPU the cost model keeps most of them float32
    # in bfloat16 (tests/unit/test_cost_model.py tests that); here the Session patterns are
    # under test, so every op the lists convert runs half.
    return dict(TF_MPT_ENABLE="1", TF_MPT_DTYPE=dtype, TF_MPT_TARGET="rules", **extra)


def _assert_losses_close(mixed, reference, dtype):
    rtol, atol = LOSS_TOLERANCE[dtype]
    assert len(mixed) == len(reference)
    for step, (m, r) in enumerate(zip(mixed, reference)):
        assert abs(m - r) <= rtol * abs(r) + atol, (step, m, r)


# large weights in bfloat16 by default (a pattern run half in place, its peak memory); every
# pattern in both half types under -m heavy (make_callable + partial_run and graph growth too:
# a Session run another way, as the queue runners' and the fetch sets' tests in the default
# run do; the iterator and the lookup table too: a dataset's iterator under a
# MonitoredTrainingSession runs half in the default run in-process,
# tests/unit/test_autoenable_session.py)
@pytest.mark.parametrize("pattern, dtype", heavy_except(
    alternating(DETERMINISTIC, ["bfloat16", "float16"]), ("large_weights-bfloat16",)))
def test_pattern_runs_half_in_place_with_float32_losses(pattern, dtype, float32, tmp_path):
    if dtype == "float16" and pattern in ("lookup_table", "large_weights"):
        pytest.skip("float16 runs on three patterns (Eigen float16 is slow on CPU); the "
                    "bfloat16 run covers this one")
    mixed = run_pattern(pattern, tmp_path, _mixed_env(dtype))
    reference = float32(pattern)
    assert mixed["half_ops"] > 0, mixed["stderr"][-2000:]
    _assert_losses_close(mixed["losses"], reference["losses"], dtype)
    if pattern == "large_weights":
        extra = mixed["peak_rss_mb"] - reference["peak_rss_mb"]
        assert extra <= PEAK_MEMORY_EXTRA_MB, (extra, PEAK_MEMORY_EXTRA_MB)


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.heavy)])
def test_queue_runners_with_monitored_training_session_never_hang(dtype, float32, tmp_path):
    mixed = run_pattern("queue_runners", tmp_path, _mixed_env(dtype))
    reference = float32("queue_runners")
    assert mixed["half_ops"] > 0
    assert len(mixed["losses"]) == len(reference["losses"]) == 90
    tail = slice(-20, None)
    mean = sum(mixed["losses"][tail]) / 20
    assert mean <= sum(reference["losses"][tail]) / 20 + QUEUE_LOSS_ATOL


# queue runners by default; the iterator under -m heavy
@pytest.mark.parametrize("pattern,state,sessions", [("queue_runners", "FIFOQueueV2", 2),
                                                    pytest.param("initializable_iterator",
                                                                 "IteratorV2", 1,
                                                                 marks=pytest.mark.heavy)])
def test_copy_path_runs_sessions_with_state_in_float32_with_one_warning_each(
        pattern, state, sessions, float32, tmp_path):
    mixed = run_pattern(pattern, tmp_path,
                        _mixed_env("bfloat16", TF_MPT_SESSION_REWRITE="copy"))
    warnings = [line for line in mixed["stderr"].splitlines()
                if "this Session runs in float32" in line]
    assert len(warnings) == sessions, mixed["stderr"][-2000:]
    assert all(state in warning for warning in warnings)
    assert mixed["half_ops"] == 0
    if pattern in DETERMINISTIC:
        assert mixed["losses"] == float32(pattern)["losses"]


# (the warning and the copy path without a compiler in the default run:
# test_faults.py::test_the_native_optimizer_is_built_at_the_first_session_only)
@pytest.mark.heavy
def test_without_a_compiler_the_copy_path_takes_over_with_one_warning(tmp_path):
    env = _mixed_env("bfloat16", TF_MPT_CACHE_DIR=str(tmp_path / "empty-cache"),
                     CXX=str(tmp_path / "no-such-compiler"))
    mixed = run_pattern("callables", tmp_path, env)
    warnings = [line for line in mixed["stderr"].splitlines()
                if "Grappler optimizer is unavailable" in line]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0]
    assert "TF1 Sessions run a rewritten copy of their graph instead" in warnings[0]
    assert mixed["half_ops"] > 0  # the copy path still runs make_callable in half


@pytest.mark.heavy
def test_the_native_optimizer_is_built_once_and_cached(tmp_path):
    cache = tmp_path / "cache"
    code = ("import tensorflow as tf; from tf_mpt.automatic.native import library as _native; "
            "print(_native.load(%r)._name)" % str(cache))
    env = child_env()
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    paths = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr[-3000:]
        paths.append(proc.stdout.strip())
    built = sorted(os.listdir(cache))
    assert [name for name in built if name.endswith(".so")] == [os.path.basename(paths[0])]
    assert paths[0] == paths[1]
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    assert tf.__version__ in os.path.basename(paths[0])  # a new TensorFlow builds a new one

    # disk full or a crash before the data reached the disk: a truncated library is rebuilt
    # (loading it would kill the process with SIGBUS)
    with open(paths[0], "r+b") as handle:
        handle.truncate(4096)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == paths[0]
    assert "do not match the checksum" in proc.stderr and os.path.getsize(paths[0]) > 4096


_NAMES_A_SESSION = """
import numpy as np
import tensorflow as tf
v1 = tf.compat.v1
v1.disable_eager_execution()
x = v1.placeholder(tf.float32, [8, 16])
y = tf.reduce_sum(tf.matmul(x, v1.get_variable("w", [16, 16])))
with v1.Session() as session:
    session.run(v1.global_variables_initializer())
    print("Y", session.run(y, {x: np.ones((8, 16), np.float32)}))
"""


def _two_first_runs(tmp_path, **env):
    """(cache, TMPDIR, [stderr, stderr]) of the script naming a Session run twice, observed
    (support/half_ops), bfloat16 by the rules, on an empty cache of its own, with `env`."""
    script = tmp_path / "names_a_session.py"
    script.write_text(_NAMES_A_SESSION)
    cache, temporary = tmp_path / "cache", tmp_path / "tmp"
    temporary.mkdir()
    full = child_env()
    full.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_ENABLE="1",
                TF_MPT_DTYPE="bfloat16", TF_MPT_TARGET="rules", TF_MPT_CACHE_DIR=str(cache),
                TMPDIR=str(temporary), **env)
    logs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], env=half_ops.observed_env(full),
                              capture_output=True, text=True, timeout=TIMEOUT_S,
                              cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Y " in proc.stdout
        logs.append(proc.stderr)
    return cache, temporary, logs


@pytest.mark.heavy
def test_a_first_run_compiles_the_optimizer_beside_tensorflows_import(tmp_path):
    """A script that names a Session, an empty cache: the compile starts as the script starts
    importing TensorFlow, with the flags of the installed wheel (the build takes its output:
    the same command), and the Session's graph runs half; the second run builds nothing."""
    cache, temporary, logs = _two_first_runs(tmp_path)
    for log in logs:  # the Session's graph ran its product in bfloat16 (counted in what it
        executed = half_ops.parse(log)["half_types"]  # executed)
        assert sum(n for op, n in executed.items() if "MatMul" in op) >= 1, executed
    assert "built tf_mpt's Grappler optimizer (once per TensorFlow version) beside " \
        "TensorFlow's import" in logs[0], logs[0][-3000:]
    assert "Grappler optimizer" not in logs[1], logs[1][-3000:]
    assert len([name for name in os.listdir(cache) if name.endswith(".so")]) == 1
    assert os.listdir(temporary) == []  # the early compile's directory removed


@pytest.mark.heavy
def test_a_first_run_compiling_the_optimizer_checks_its_kernels_in_its_own_process(tmp_path):
    """The same first run with the dispatch check on and no table: while the compiler holds
    the second core, the Session checks its graph's bfloat16 op types in the script's own
    process (no child and its TensorFlow import: the check is announced before the Session
    waits for the compiler, and its ratios are in this CPU's cache, speed and numerics); the
    second run checks nothing. Whether the product then runs half is this CPU's verdict
    (emulated bfloat16 is >3x slower on some kinds), so it is not asserted here."""
    cache, temporary, logs = _two_first_runs(tmp_path, TF_MPT_DISPATCH_CHECK="1")
    # (the graph's checked op types, its initializer's AddV2 and Mul too, at once: the
    # Session checks them before its first run, never a rewrite in its child)
    assert re.search(r"tf_mpt is checking how TensorFlow runs bfloat16 [A-Za-z0-9, ]*"
                     r"MatMul[A-Za-z0-9, ]* on this CPU against float32, for speed and "
                     r"accuracy, in this process while its optimizer compiles", logs[0]), \
        logs[0][-3000:]
    built = "built tf_mpt's Grappler optimizer (once per TensorFlow version) beside"
    assert built in logs[0], logs[0][-3000:]
    assert logs[0].count("tf_mpt is checking how") == 1, logs[0][-3000:]
    (ratios,) = [name for name in os.listdir(cache) if name.startswith("dispatch-bfloat16")]
    with open(cache / ratios) as f:
        found = json.load(f)
    assert {"MatMul", "MatMul+BiasAdd"} <= set(found["dispatch"]), found
    assert found["dispatch"]["MatMul"] > 0 and "MatMul" in found["numerics"], found
    assert "checking how" not in logs[1] and built not in logs[1], logs[1][-3000:]
    assert os.listdir(temporary) == []


_EVALUATION_AFTER_TRAINING = """
import numpy as np, tensorflow as tf
v1 = tf.compat.v1
v1.disable_v2_behavior()
np.random.seed(0); v1.set_random_seed(0)
X = v1.placeholder(tf.float32, [None, 7, 5]); Y = v1.placeholder(tf.float32, [None, 1])
cell = v1.nn.rnn_cell.BasicLSTMCell(num_units=10, state_is_tuple=True, activation=tf.tanh)
outputs, _ = v1.nn.dynamic_rnn(cell, X, dtype=tf.float32)
pred = v1.layers.dense(outputs[:, -1], 1, activation=None)
loss = tf.reduce_sum(tf.square(pred - Y))
train = v1.train.AdamOptimizer(0.01).minimize(loss)
x = np.random.rand(16, 7, 5).astype(np.float32); y = np.random.rand(16, 1).astype(np.float32)
with v1.Session() as s:
    s.run(v1.global_variables_initializer())
    for _ in range(2): s.run([train, loss], {X: x, Y: y})
    print("PRED", float(s.run(pred, {X: x[:5]})[0, 0]))
    s.run([train, loss], {X: x, Y: y})  # and training again after the evaluation
"""


def _evaluation_after_training(env_extra):
    env = child_env()
    env.update(env_extra, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    proc = subprocess.run([sys.executable, "-c", _EVALUATION_AFTER_TRAINING], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(proc.stdout.split("PRED")[1].split()[0])


@pytest.mark.parametrize("dtype", [pytest.param("bfloat16", marks=pytest.mark.heavy), "float16"])
def test_fetch_sets_rewritten_differently_do_not_share_stateful_kernels(dtype):
    # The training run keeps the RNN's input TensorArray float32, the evaluation run stores
    # it in half: a Session caches stateful kernels by node name across its executors.
    pytest.importorskip("tf_keras", reason="tf.compat.v1.layers need tf_keras")
    # without loss scaling: its first float16 steps overflow and are skipped by design, which
    # would make the two runs train for different numbers of steps
    mixed = _evaluation_after_training(_mixed_env(dtype, TF_MPT_LOSS_SCALING="0"))
    reference = _evaluation_after_training({})
    rtol, atol = LOSS_TOLERANCE[dtype]
    assert abs(mixed - reference) <= rtol * abs(reference) + atol, (mixed, reference)
