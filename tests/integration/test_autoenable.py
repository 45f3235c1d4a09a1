"""Zero code edits: unmodified example scripts under TF_MPT_ENABLE=1 and `python -m tf_mpt`.

Each script runs in a subprocess (with this source tree first on PYTHONPATH); the rewrite is
checked in the dumped report and graph, not only in the log.
"""

import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from support import half_ops
from support.tolerances import FINAL_LOSS_RTOL
from support.helpers import alternating, child_env, heavy_except

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TIMEOUT_S = 300
# Mixed precision must reach float32's accuracy to within a point. One-sided: on an AVX2-only
# CPU (Eigen's bfloat16 kernels) the bfloat16 LSTM ends a point *above* float32 (99.49% vs
# 98.46%), which is no failure.
ACCURACY_POINTS = 0.01
EXAMPLES = {"tf1_mlp_digits": ["--epochs", "3"], "tf1_convnet_digits": ["--epochs", "2"],
            "tf2_custom_loop_digits": ["--epochs", "3"],
            # the LSTM is compared where training has converged (before, the last-epoch
            # accuracy of both runs still swings by a few points from epoch to epoch)
            "tf1_lstm_digits": ["--epochs", "15"]}


def _run(args, env, keras_as_on_a_gpu=False):
    """The script run as a user runs it, observed: half_ops.half_ops(proc.stderr) is the
    number of half ops TensorFlow executed in it (XLA's programs included). TF_MPT_CPU_FLAGS
    passes through: a run of the suite "as another CPU" reaches the scripts.
    keras_as_on_a_gpu: Keras 3's compile() default resolves to XLA, as on a GPU machine."""
    full_env = child_env(keep=("TF_MPT_CPU_FLAGS",))
    full_env.update(env, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, *args],
                          env=half_ops.observed_env(full_env, keras_as_on_a_gpu),
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)


def _metrics(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = dict(re.findall(r"(\w+)=([0-9.]+)", proc.stdout))
    return {k: float(v) for k, v in found.items()}


@pytest.fixture(scope="module")
def float32_runs():
    """{name: metrics} of each example's float32 run, run at the first test that asks."""
    cache = {}

    def get(name):
        if name not in cache:
            proc = _run([f"examples/{name}.py", *EXAMPLES[name]], {})
            assert half_ops.half_ops(proc.stderr) == 0
            cache[name] = _metrics(proc)
        return cache[name]
    return get


# An unmodified script of layers wide enough that bfloat16 pays on a CPU with native bfloat16
# ([64 x 512] x [512 x 512]): a TF1 Session and a TF2 tf.function training step.
_WIDE_SCRIPT = """
import numpy as np
import tensorflow as tf
rng = np.random.RandomState(0)
x_data = rng.randn(64, 512).astype(np.float32)
w_init = (rng.randn(512, 512) / 32).astype(np.float32)
graph = tf.Graph()
with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [64, 512])
    w1 = tf.compat.v1.get_variable("w1", initializer=w_init)
    w2 = tf.compat.v1.get_variable("w2", initializer=w_init)
    loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    init = tf.compat.v1.global_variables_initializer()
with tf.compat.v1.Session(graph=graph) as sess:
    sess.run(init)
    tf1_losses = [sess.run([loss, train], {x: x_data})[0] for _ in range(3)]
v1, v2 = tf.Variable(w_init), tf.Variable(w_init)
@tf.function
def step(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, v1)), v2)))
    for v, g in zip((v1, v2), tape.gradient(loss, [v1, v2])):
        v.assign_sub(0.1 * g)
    return loss
tf2_losses = [float(step(tf.constant(x_data))) for _ in range(3)]
print("losses", " ".join(f"{v:.6f}" for v in tf1_losses + tf2_losses))
"""


def test_an_unmodified_script_runs_half_under_the_default_target(tmp_path):
    """TF_MPT_ENABLE=1 TF_MPT_DTYPE=bfloat16 and nothing else: the default target reads the
    suite's table standing in for this CPU (TF_MPT_OP_COSTS), whose cost model converts the
    wide products; counted in what the Session and the tf.function executed."""
    script = tmp_path / "wide.py"
    script.write_text(_WIDE_SCRIPT)
    table = {"TF_MPT_OP_COSTS": os.environ["TF_MPT_OP_COSTS"], "TF_MPT_STEP_TIMING": "off"}
    float32 = _run([str(script)], {})
    mixed = _run([str(script)], dict(table, TF_MPT_ENABLE="1", TF_MPT_DTYPE="bfloat16"))
    assert float32.returncode == 0 and mixed.returncode == 0, mixed.stderr[-3000:]
    assert "for target op_costs_zen4.json" in mixed.stderr, mixed.stderr[-3000:]
    assert half_ops.half_ops(float32.stderr) == 0
    executed = half_ops.parse(mixed.stderr)["half_types"]
    assert sum(n for op, n in executed.items() if "MatMul" in op) >= 4, executed
    want = [float(v) for v in float32.stdout.split("losses")[1].split()]
    got = [float(v) for v in mixed.stdout.split("losses")[1].split()]
    np.testing.assert_allclose(got, want, rtol=FINAL_LOSS_RTOL["bfloat16"])


# one launch of each in the default run; the other (the same rewrite, started another way)
# with -m heavy
_SECOND = pytest.mark.heavy


# In the default run the TF1 conv net; the MLP (a TF1 Session like it), the LSTM (while loops
# in a TF1 graph: test_tensor_arrays.py, test_tf1_layers.py) and the TF2 custom loop
# (test_auto_loss_scaling.py, test_tf2_patterns.py) under -m heavy
_DEFAULT_EXAMPLES = ("tf1_convnet_digits",)


@pytest.mark.parametrize("launch", ["env", pytest.param("module", marks=_SECOND)])
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=() if name in _DEFAULT_EXAMPLES else _SECOND)
    for name in sorted(EXAMPLES)])
def test_unmodified_script_runs_in_mixed_precision(name, launch, tmp_path, float32_runs):
    dump = str(tmp_path / "dump")
    # an explicit half type: runs on every CPU (what `auto` picks is tested below)
    # the cost model off: the path is under test, and at these scripts' sizes the model keeps
    # the MLP float32 on a CPU (test_cost_model.py), by this machine's measurements
    env = {"TF_MPT_DUMP_DIR": dump, "TF_MPT_DTYPE": "bfloat16", "TF_MPT_TARGET": "rules"}
    if launch == "env":
        env["TF_MPT_ENABLE"] = "1"
        args = [f"examples/{name}.py", *EXAMPLES[name]]
    else:
        args = ["-m", "tf_mpt", f"examples/{name}.py", *EXAMPLES[name]]
    proc = _run(args, env)
    metrics = _metrics(proc)
    assert "tf_mpt: enabled: dtype=bfloat16" in proc.stderr
    assert re.search(r"tf_mpt: Converted [1-9]\d*/\d+ nodes to bfloat16", proc.stderr)
    reports = sorted(glob.glob(os.path.join(dump, "*_report.json")))
    assert reports, "no rewrite was dumped"
    # one rewrite per graph the Session ran (initialiser, training step, evaluation): the
    # one with the most half MatMuls/Conv2Ds is the training step's
    chosen, half_matmuls = None, []
    for path in reports:
        report = json.loads(open(path).read())
        names = [n for n, d in report["nodes"].items()
                 if d["op"] in ("MatMul", "Conv2D") and d["colour"] == "allow"]
        if len(names) > len(half_matmuls):
            chosen, half_matmuls = path, names
    assert half_matmuls
    after = tf.compat.v1.GraphDef()
    with open(chosen.replace("_report.json", "_after.pb"), "rb") as f:
        after.ParseFromString(f.read())
    half = {n.name for n in after.node if n.op in ("MatMul", "Conv2D")
            and n.attr["T"].type in (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum)}
    assert set(half_matmuls) <= half
    assert half_ops.half_ops(proc.stderr) >= len(half_matmuls)  # and they ran
    assert metrics["last_loss"] < metrics["first_loss"] / 2
    assert metrics["accuracy"] >= float32_runs(name)["accuracy"] - ACCURACY_POINTS - 1e-9


# the policy mode (TF_MPT_KERAS=policy) is also run by test_tf_keras.py and
# test_auto_loss_scaling.py: here with the second launches; every launch under -m heavy (a
# Keras fit script under TF_MPT_ENABLE=1 runs its steps half in the default run in
# test_xla.py, compiled, and in test_tf2_patterns.py's keras_fit pattern, not compiled)
@pytest.mark.parametrize("launch", [pytest.param("env", marks=_SECOND),
                                    pytest.param("module", marks=_SECOND),
                                    pytest.param("console", marks=_SECOND),
                                    pytest.param("policy", marks=_SECOND),
                                    pytest.param("env-gpu-default", marks=_SECOND)])
def test_keras_fit_script_runs_its_traced_steps_in_mixed_precision(launch):
    """TF_MPT_KERAS=rewrite (default): Keras stays float32 and tf_mpt rewrites the step
    functions fit / evaluate trace; TF_MPT_KERAS=policy: Keras's mixed_bfloat16 policy.
    env-gpu-default: the script's compile() default resolved as on a GPU machine (issue
    "XLA": Keras 3 compiles its steps with XLA there), both runs; the half ops counted in
    the HLO handed to XLA."""
    args = ["examples/keras_fit_digits.py", "--epochs", "3"]
    gpu_default = launch == "env-gpu-default"
    float32_run = _run(args, {}, keras_as_on_a_gpu=gpu_default)
    float32 = _metrics(float32_run)
    # whether this CPU's kernels make the digits MLP's small steps pay in bfloat16 is the
    # cost model's call (test_cost_model.py); here: that the traced steps are rewritten
    mixed_env = {"TF_MPT_DTYPE": "bfloat16", "TF_MPT_TARGET": "rules"}
    if launch in ("env", "env-gpu-default"):
        proc = _run(args, {"TF_MPT_ENABLE": "1", **mixed_env}, keras_as_on_a_gpu=gpu_default)
    elif launch == "policy":
        proc = _run(args, {"TF_MPT_ENABLE": "1", "TF_MPT_KERAS": "policy", **mixed_env})
    elif launch == "module":
        proc = _run(["-m", "tf_mpt", *args], mixed_env)
    else:  # what the `tf-mpt run` console command calls
        proc = _run(["-c", "import sys; from tf_mpt.cli import main; main(sys.argv[1:])",
                     "run", *args], mixed_env)
    mixed = _metrics(proc)
    assert "policy=float32" in float32_run.stdout
    if launch == "policy":
        assert "policy=mixed_bfloat16" in proc.stdout
        assert "tf_mpt: Keras global dtype policy set to mixed_bfloat16" in proc.stderr
    else:
        assert "policy=float32" in proc.stdout and "dtype policy" not in proc.stderr
        converted = re.findall(r"tf_mpt: Converted (\d+)/\d+ nodes to bfloat16", proc.stderr)
        assert len(converted) == 2 and all(int(n) > 0 for n in converted), proc.stderr[-3000:]
    assert half_ops.half_ops(float32_run.stderr) == 0
    assert half_ops.half_ops(proc.stderr) > 0, proc.stderr[-3000:]  # the steps ran half
    xla = {op: n for op, n in half_ops.parse(proc.stderr)["half_types"].items()
           if op.endswith("(XLA)")}
    assert bool(xla) is gpu_default, (xla, proc.stderr[-2000:])  # compiled exactly there
    assert mixed["last_loss"] < mixed["first_loss"] / 2
    assert mixed["accuracy"] >= float32["accuracy"] - ACCURACY_POINTS - 1e-9


# A small TF1 script: one MatMul trained for a step, then its dtype as the Session ran it.
_TINY_TF1_SCRIPT = """
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
x = tf.compat.v1.placeholder(tf.float32, [4, 8])
w = tf.compat.v1.get_variable("w", [8, 2])
y = tf.nn.relu(tf.matmul(x, w))  # the fetched Relu keeps float32, the MatMul goes half
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    print("value", sess.run(y, {x: [[1.0] * 8] * 4})[0, 0])
"""
_AUTO_FLOAT32_WARNING = ("tf_mpt: TF_MPT_DTYPE=auto found no GPU and no native bfloat16 on this "
                         "CPU")
# (CPU kind, flags as /proc/cpuinfo lists them, what `auto` must pick)
_CPU_KINDS = [("zen3_avx2_only", "fpu sse4_2 avx avx2 fma f16c", None),
              ("zen4_avx512_bf16", "avx2 avx512f avx512bw avx512_bf16", "bfloat16"),
              ("xeon_amx", "avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8", "bfloat16"),
              ("avx512f_without_bf16", "avx2 avx512f avx512bw", None)]


def _check_auto_decision(proc, expected):
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "value" in proc.stdout
    assert "tf_mpt: tf_mpt:" not in proc.stderr
    if expected is None:
        assert proc.stderr.count(_AUTO_FLOAT32_WARNING) == 1, proc.stderr[-3000:]
        assert "enabled: dtype" not in proc.stderr and "Converted" not in proc.stderr
    else:
        assert _AUTO_FLOAT32_WARNING not in proc.stderr
        assert f"tf_mpt: enabled: dtype={expected}" in proc.stderr, proc.stderr[-3000:]
        assert re.search(rf"tf_mpt: Converted [1-9]\d*/\d+ nodes to {expected}", proc.stderr)


# In the default run one kind of each verdict (float32, bfloat16), each launched one way;
# every kind both ways under -m heavy (test_targets.py and test_cpu.py decide for every kind
# in-process)
@pytest.mark.parametrize("kind, flags, expected, launch", heavy_except(
    alternating(_CPU_KINDS, ["env", "module"], [kind[0] for kind in _CPU_KINDS]),
    ("zen3_avx2_only-env", "zen4_avx512_bf16-module")))
def test_auto_dtype_follows_the_cpu_flags(kind, flags, expected, launch, tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(_TINY_TF1_SCRIPT)
    # the cost model would keep this tiny MatMul float32; here only the dtype decision counts
    env = {"TF_MPT_CPU_FLAGS": flags, "TF_MPT_TARGET": "rules"}
    if launch == "env":
        proc = _run([str(script)], dict(env, TF_MPT_ENABLE="1"))
    else:  # with TF_MPT_ENABLE set too: the start-up hook and the module both install
        proc = _run(["-m", "tf_mpt", str(script)], dict(env, TF_MPT_ENABLE="1"))
    _check_auto_decision(proc, expected)


def test_auto_dtype_on_this_cpu(tmp_path):
    """No flags injected: what `auto` must pick on the machine running the suite."""
    from tf_mpt import _cpu
    script = tmp_path / "tiny.py"
    script.write_text(_TINY_TF1_SCRIPT)
    env = child_env()
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_ENABLE="1",
               TF_MPT_TARGET="rules")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=ROOT)
    expected = _cpu.auto_dtype(bool(tf.config.list_physical_devices("GPU")),
                               _cpu.real_cpu_flags())
    _check_auto_decision(proc, expected)


# under -m heavy: float16's loss scaling in a zero-code TF1 script stays in the default run
# (test_auto_loss_scaling.py's tf.gradients script)
@pytest.mark.heavy
def test_float16_turns_loss_scaling_on_and_a_sub_switch_turns_it_off():
    name, args = "tf1_mlp_digits", ["--epochs", "1"]
    on = _run([f"examples/{name}.py", *args], {"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "float16"})
    assert "loss_scaling=True" in on.stderr, on.stderr[-2000:]
    off = _run([f"examples/{name}.py", *args], {"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "float16",
                                                "TF_MPT_LOSS_SCALING": "0"})
    assert "loss_scaling=False" in off.stderr and "graph_rewrite=True" in off.stderr
    _metrics(on), _metrics(off)


@pytest.mark.parametrize("variable, value", [("TF_MPT_ENABLE", "maybe"),
                                             ("TF_MPT_DTYPE", "fp8")])
def test_bad_value_stops_the_script_at_start_with_a_clear_message(variable, value):
    env = {"TF_MPT_ENABLE": "1", variable: value}
    proc = _run(["-c", "print('script ran')"], env)
    assert proc.returncode == 2
    assert "script ran" not in proc.stdout
    assert f"{variable}" in proc.stderr and repr(value) in proc.stderr


def test_bad_value_with_every_switch_off_warns_and_the_script_runs():
    env = {"TF_MPT_ENABLE": "0", "TF_MPT_DTYPE": "float32"}
    proc = _run(["-c", "print('script ran')"], env)
    assert proc.returncode == 0 and proc.stdout.strip() == "script ran", proc.stderr
    assert "TF_MPT_DTYPE" in proc.stderr and "'float32'" in proc.stderr
    assert "ignored: tf_mpt is off" in proc.stderr


def test_unset_switch_costs_no_tensorflow_import():
    proc = _run(["-c", "import sys; print('tensorflow' in sys.modules)"], {})
    assert proc.returncode == 0 and proc.stdout.strip() == "False"


def test_python_m_tf_mpt_without_a_script_prints_usage():
    proc = _run(["-m", "tf_mpt"], {})
    assert proc.returncode == 2 and "usage: python -m tf_mpt script.py" in proc.stderr


# under -m heavy: tf_keras under TF_MPT_ENABLE=1 stays in the default run (test_tf_keras.py)
@pytest.mark.heavy
@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                    reason='needs tf_keras: python -m pip install --no-deps "tf_keras==2.21.*"')
def test_tf_keras_imported_after_tf_mpt_enable_gets_its_policy_and_scaling():
    # the policy only under TF_MPT_KERAS=policy; the optimizer patches in both modes
    """A script that calls tf_mpt.enable() and then imports tf_keras (`import tensorflow`
    itself imports Keras 3, so only tf_keras can come later)."""
    script = ("import tensorflow as tf, tf_mpt, sys\n"
              "assert 'tf_keras' not in sys.modules\n"
              "tf_mpt.enable(tf_mpt.Config.from_env({'TF_MPT_ENABLE': '1',\n"
              "                                      'TF_MPT_DTYPE': 'float16',\n"
              "                                      'TF_MPT_KERAS': sys.argv[1]}))\n"
              "import tf_keras\n"
              "print('policy', tf_keras.mixed_precision.global_policy().name)\n"
              "method = tf_keras.optimizers.Adam.apply_gradients\n"
              "print('patched', method.__code__.co_filename.endswith('state.py'))\n")
    for keras_mode, policy in (("policy", "mixed_float16"), ("rewrite", "float32")):
        proc = _run(["-c", script, keras_mode], {})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == ["policy", policy, "patched", "True"], proc.stdout
