"""TF2 scripts as a new user writes them, unmodified under TF_MPT_ENABLE=1 (subprocesses:
tests/support/tf2_patterns_worker.py): an eager raw-TF loop, an eager Keras loop, a
tf.function loop (and one whose loss is `model(x) - y` in plain ops), a tf_keras custom loop adding its regularization loss, Keras 3 fit, a GAN
with two optimizers, a MirroredStrategy loop on two logical CPUs; float16 and bfloat16.

Each must exit 0, hand the script tensors of float32's dtypes, reach float32's losses, and
run its matrix products in half where tf_mpt says it does (the executed partition graphs)
and not at all where it says it does not (eager code: bit-identical to float32). The float16
underflow probe takes the gradients of loss x 1e-7: with tf_mpt's loss scale it trains like
float32, without it (TF_MPT_LOSS_SCALING=0) it does not.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support.tolerances import FINAL_LOSS_RTOL, HALF_DTYPES
from support.helpers import child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORKER = os.path.join(ROOT, "tests", "support", "tf2_patterns_worker.py")
EAGER = ("eager_raw", "eager_keras")
GRAPH = ("function_loop", "function_mse", "tf_keras_regularized", "keras_fit", "gan",
         "mirrored")
PATTERNS = EAGER + GRAPH
# tf_keras comes with --no-deps (README); a machine without it runs every other pattern
NEEDS_TF_KERAS = ("tf_keras_regularized",)
HAS_TF_KERAS = importlib.util.find_spec("tf_keras") is not None
RUNNABLE = tuple(p for p in PATTERNS if HAS_TF_KERAS or p not in NEEDS_TF_KERAS)
PROBE = ("eager_raw", "function_loop", "keras_fit", "gan", "mirrored")
# (1e-5 no longer shows it for Keras's fit: the gradients it underflows are few, and the
# update, float32 since it stays in the variables' dtype, no longer squares them to zero)
PROBE_FACTOR = "1e-7"
# The underflow probe: an unscaled float16 run's final loss stays this far above float32's
# (or is NaN).
UNDERFLOW_GAP = 0.05


# The suite's variables a worker keeps: the cost table standing in for this CPU and no step
# timing (conftest), so what the cost model decides is the same on every CPU.
KEPT = ("TF_MPT_OP_COSTS", "TF_MPT_STEP_TIMING", "TF_MPT_CACHE_DIR")
# Weighed by the cost model (the suite's table): layers wide enough that bfloat16 pays.
WEIGHED = ("function_loop_wide",)


def _worker(env, *args):
    full = child_env(keep=KEPT)
    full.update(env, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
                TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, WORKER, *args], env=full, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, f"{env} {args}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _mixed(dtype, **env):
    return {"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": dtype, **env}


@pytest.fixture(scope="module")
def runs():
    """float32; float16 (its target is the rules by default); bfloat16 on the rules target
    (the patterns' 16-64 wide layers are ones the cost model keeps float32: the rules show
    every pattern's graph converted); and "weighed": bfloat16 under the default target,
    which reads the suite's table, on the wide pattern."""
    out = {"float32": _worker({}, *RUNNABLE, *WEIGHED)}
    out["float16"] = _worker(_mixed("float16"), *RUNNABLE)
    out["bfloat16"] = _worker(_mixed("bfloat16", TF_MPT_TARGET="rules"), *RUNNABLE)
    out["weighed"] = _worker(_mixed("bfloat16"), *WEIGHED)
    return out


def _runnable(pattern):
    if pattern not in RUNNABLE:
        pytest.skip('needs tf_keras: python -m pip install --no-deps "tf_keras==2.21.*"')


@pytest.fixture(scope="module")
def probes():
    probe = ("--factor", PROBE_FACTOR, *PROBE)
    return {"float32": _worker({}, *probe)[0],
            "scaled": _worker(_mixed("float16"), *probe)[0],
            "unscaled": _worker(_mixed("float16", TF_MPT_LOSS_SCALING="0"), *probe)[0]}


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_keeps_user_visible_dtypes_and_float32_losses(runs, pattern, dtype):
    _runnable(pattern)
    float32, mixed = runs["float32"][0][pattern], runs[dtype][0][pattern]
    assert mixed["dtypes"] == float32["dtypes"]
    assert all(value in ("float32", "int32") for value in float32["dtypes"].values())
    np.testing.assert_allclose(mixed["losses"][-1], float32["losses"][-1],
                               rtol=FINAL_LOSS_RTOL[dtype])
    assert mixed["losses"][-1] < mixed["losses"][0]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("pattern", GRAPH)
def test_traced_pattern_runs_its_matrix_products_in_half(runs, pattern, dtype):
    """Counted in the partition graphs TensorFlow executed: no log line excuses a zero."""
    _runnable(pattern)
    float32, (mixed, _) = runs["float32"][0][pattern], runs[dtype]
    assert float32["half_ops"] == 0 and float32["matrix_ops"] > 0
    assert mixed[pattern]["half_ops"] > 0, mixed[pattern]


@pytest.mark.parametrize("pattern", WEIGHED)
def test_wide_pattern_runs_half_where_the_cost_model_weighs_it(runs, pattern):
    """Under the default target (the suite's Zen 4 table standing in for this CPU) the cost
    model converts [64 x 512] x [512 x 512] products; the script sees float32's dtypes and
    losses."""
    float32, (mixed, stderr) = runs["float32"][0][pattern], runs["weighed"]
    assert "for target op_costs_zen4.json" in stderr, stderr[-3000:]
    assert float32["half_ops"] == 0 and float32["matrix_ops"] > 0
    assert mixed[pattern]["half_ops"] > 0, mixed[pattern]
    assert mixed[pattern]["dtypes"] == float32["dtypes"]
    np.testing.assert_allclose(mixed[pattern]["losses"][-1], float32["losses"][-1],
                               rtol=FINAL_LOSS_RTOL["bfloat16"])
    assert mixed[pattern]["losses"][-1] < mixed[pattern]["losses"][0]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("pattern", EAGER)
def test_eager_pattern_runs_float32_and_is_told_so(runs, pattern, dtype):
    """Eager ops are not rewritten: the same numbers as float32 to the bit, no loss scale
    (so no skipped step), one INFO line at start saying what runs where."""
    mixed, stderr = runs[dtype]
    assert mixed[pattern]["half_ops"] == 0
    assert mixed[pattern]["losses"] == runs["float32"][0][pattern]["losses"]
    assert stderr.count("eager ops (outside tf.function) run in float32") == 1
    if dtype == "float16":  # loss scaling is on: the eager tape says it is not scaled
        assert stderr.count("runs eagerly (outside tf.function)") == 1


@pytest.mark.heavy
@pytest.mark.parametrize("pattern", PROBE)
def test_float16_underflow_probe_trains_like_float32_only_with_scaling(probes, pattern):
    float32 = probes["float32"][pattern]["losses"][-1]
    scaled = probes["scaled"][pattern]["losses"][-1]
    unscaled = probes["unscaled"][pattern]["losses"][-1]
    if pattern in EAGER:  # float32 eagerly: nothing underflows, nothing to scale
        assert scaled == unscaled == float32
        return
    np.testing.assert_allclose(scaled, float32, rtol=FINAL_LOSS_RTOL["float16"])
    # underflowed gradients: a loss that stalls, or NaN (0 / 0 in the script's division)
    assert not np.isfinite(unscaled) or unscaled > float32 + UNDERFLOW_GAP, (unscaled, float32)


# Issue "XLA": the patterns whose steps a user compiles (Keras 3's default on a machine with a
# GPU; tf.function(jit_compile=True) in a custom loop), counted in the HLO handed to XLA
JIT_PATTERNS = ("function_loop", "function_mse", "keras_fit")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{way: (the worker's JSON, stderr)} of the patterns compiled by XLA, each worker with
    its own XLA dump directory: float32, bfloat16 on the rules target (and float16 under
    -m heavy: loss scaling in compiled steps is test_xla.py's in the default run)."""
    ways = {"float32": {}, "bfloat16": _mixed("bfloat16", TF_MPT_TARGET="rules"),
            "float16": _mixed("float16")}
    out = {}

    def run(way):  # (each way once, when a test first asks for it)
        if way not in out:
            dump = tmp_path_factory.mktemp(f"xla-{way}")
            env = dict(ways[way], XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text")
            out[way] = _worker(env, "--jit", str(dump), *JIT_PATTERNS)
        return out[way]
    return run


@pytest.mark.parametrize("dtype", [pytest.param("float16", marks=pytest.mark.heavy),
                                   "bfloat16"])
@pytest.mark.parametrize("pattern", JIT_PATTERNS)
def test_a_compiled_pattern_runs_half_in_the_hlo_xla_compiles(runs, compiled, pattern,
                                                              dtype):
    """Against float32 without XLA (the same patterns' run in `runs`: the default run starts
    no float32 worker under XLA; test_the_hlo_count_sees_float32s_compiled_dots does)."""
    float32, mixed = runs["float32"][0][pattern], compiled(dtype)[0][pattern]
    assert mixed["dtypes"] == float32["dtypes"]
    np.testing.assert_allclose(mixed["losses"][-1], float32["losses"][-1],
                               rtol=FINAL_LOSS_RTOL[dtype])
    assert mixed["losses"][-1] < mixed["losses"][0]
    # the programs XLA compiled hold half dots
    assert mixed["matrix_ops"] > 0 and mixed["half_ops"] > 0, (mixed,
                                                               compiled(dtype)[1][-3000:])


@pytest.mark.heavy
@pytest.mark.parametrize("pattern", JIT_PATTERNS)
def test_the_hlo_count_sees_float32s_compiled_dots(runs, compiled, pattern):
    """The count itself: float32 compiled by XLA has dots, none half, and trains as float32
    does without XLA."""
    float32 = compiled("float32")[0][pattern]
    assert float32["matrix_ops"] > 0 and float32["half_ops"] == 0, float32
    assert float32["dtypes"] == runs["float32"][0][pattern]["dtypes"]
    np.testing.assert_allclose(float32["losses"][-1], runs["float32"][0][pattern]["losses"][-1],
                               rtol=1e-3)


@pytest.mark.slow
def test_keras_modes_benchmark_quick_run_prints_both_tables():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "keras_modes.py"),
                           "--quick"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("CPU")
    policy_row = next(line for line in lines if line.startswith("| function_mse | float16"))
    assert "raises TypeError" in policy_row.split("|")[3]  # the policy's half output
    assert "dtypes same" in policy_row.split("|")[4]
    assert any(line.startswith("| mlp |") for line in lines)
