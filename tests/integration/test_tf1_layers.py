"""tf.compat.v1.layers under TF_MPT_ENABLE=1: examples/tf1_layers_digits.py, unmodified.

TF1 model code is mostly written with tf.compat.v1.layers (conv2d, batch_normalization with
UPDATE_OPS, dropout, dense). On TensorFlow 2.16+ they come from tf_keras, whose metadata
asks for the full `tensorflow` wheel: CI installs it with --no-deps; without it these tests
skip and say so.
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
from support.helpers import child_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tf_keras") is None,
    reason='tf.compat.v1.layers need tf_keras: python -m pip install --no-deps "tf_keras==2.21.*"')

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join("examples", "tf1_layers_digits.py")
TIMEOUT_S = 300
# Mixed precision must reach float32's test accuracy to within a point (389 test digits: a
# point is 4 of them; the script's last-epoch accuracy is stable to about that, see its
# batch-norm momentum). One-sided: ending above float32 is no failure.
ACCURACY_POINTS = 0.01
LAYER_PRODUCTS = ["conv1/Conv2D", "conv2/Conv2D", "fc1/MatMul", "logits/MatMul"]


def _run(env, *args):
    full_env = child_env()
    full_env.update(env, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, SCRIPT, *args], env=full_env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", proc.stdout)}


def _checkpoint_dtypes(prefix):
    return {name: dtype.name for name, dtype in
            tf.train.load_checkpoint(prefix).get_variable_to_dtype_map().items()}


@pytest.fixture(scope="module")
def float32_run(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("float32") / "model")
    _, metrics = _run({}, "--checkpoint", prefix)
    return metrics, prefix


@pytest.mark.parametrize("dtype", [pytest.param("float16", marks=pytest.mark.heavy),
                                   "bfloat16"])
def test_v1_layers_script_trains_in_mixed_precision_with_float32_variables(
        dtype, tmp_path, float32_run):
    float32_metrics, float32_prefix = float32_run
    dump, prefix = str(tmp_path / "dump"), str(tmp_path / "model")
    # the cost model off: at this script's sizes it keeps fc1 float32 on a CPU, by this
    # machine's measurements; the layers' path is under test
    proc, metrics = _run({"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": dtype, "TF_MPT_DUMP_DIR": dump,
                          "TF_MPT_TARGET": "rules"}, "--checkpoint", prefix)
    assert f"tf_mpt: enabled: dtype={dtype}" in proc.stderr
    assert metrics["accuracy"] >= float32_metrics["accuracy"] - ACCURACY_POINTS, (
        metrics, float32_metrics)

    # the training step's graph: every layer's Conv2D / MatMul runs in the half type
    steps = []
    for path in glob.glob(os.path.join(dump, "*_report.json")):
        nodes = json.loads(open(path).read())["nodes"]
        if "gradients/conv1/Conv2D_grad/Conv2DBackpropFilter" in nodes:
            steps.append(path)
    assert len(steps) == 1, steps
    after = tf.compat.v1.GraphDef()
    with open(steps[0].replace("_report.json", "_after.pb"), "rb") as f:
        after.ParseFromString(f.read())
    by_name = {n.name: n for n in after.node}
    for name in LAYER_PRODUCTS + ["gradients/conv1/Conv2D_grad/Conv2DBackpropFilter"]:
        assert tf.dtypes.as_dtype(by_name[name].attr["T"].type).name == dtype, name

    # variables (batch norm's moving averages included) are stored in float32, as in the
    # float32 run; float16 adds the loss scale's state, bfloat16 needs none
    dtypes = _checkpoint_dtypes(prefix)
    scale_state = {"tf_mpt/current_loss_scale": "float32", "tf_mpt/good_steps": "int64",
                   "tf_mpt/skipped_steps": "int64"}
    expected = dict(_checkpoint_dtypes(float32_prefix))
    if dtype == "float16":
        expected.update(scale_state)
    assert dtypes == expected
    reader = tf.train.load_checkpoint(prefix)
    for name in ("bn1/moving_mean", "bn1/moving_variance", "conv1/kernel", "fc1/kernel"):
        assert np.all(np.isfinite(reader.get_tensor(name))), name
