"""A Keras script that does its own mixed precision runs as written under the automatic
path: a `mixed_bfloat16` layer inside a float32 model, or a global mixed policy the script
set, is not converted a second time (the same half and float32 matrix products, the same
Casts as plain Keras), and one INFO line says why; a float32 model is still rewritten."""

import json
import os
import subprocess
import sys

import pytest

from support.helpers import child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

_SCRIPT = r"""
import json, sys
import numpy as np
import keras
from tensorflow.python.eager import context
case = sys.argv[1]
if case == "global":
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
keras.utils.set_random_seed(0)
inputs = keras.Input((64,))
h = keras.layers.Dense(128, activation="relu", name="first")(inputs)
h = keras.layers.Dense(128, activation="relu", name="own",
                       dtype="mixed_bfloat16" if case == "layer" else None)(h)
model = keras.Model(inputs, keras.layers.Dense(4, name="last")(h))
model.compile(optimizer="sgd",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.RandomState(0)
x, y = rng.rand(256, 64).astype("float32"), rng.randint(0, 4, 256).astype("int32")
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
context.enable_run_metadata()
model.train_on_batch(x[:64], y[:64])
graphs = [g for f in context.export_run_metadata().function_graphs for g in f.partition_graphs]
kinds = {}
for node in (n for g in graphs for n in g.node):
    if "MatMul" in node.op or node.op == "Cast":  # oneDNN renames MatMul: _MklMatMul ...
        key = node.op if node.op == "Cast" else f"MatMul:{node.attr['T'].type}"
        kinds[key] = kinds.get(key, 0) + 1
print(json.dumps(kinds))
"""


def _run(case, tf_mpt):
    env = child_env(keep=("TF_MPT_CPU_FLAGS",))
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    if tf_mpt:
        env.update(TF_MPT_ENABLE="1", TF_MPT_DTYPE="bfloat16", TF_MPT_TARGET="rules")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, case], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


BF16, FP32 = "MatMul:14", "MatMul:1"  # DataType enums of T


# a float32 model with its own half layers by default; the global policy under -m heavy
@pytest.mark.parametrize("case", ["layer", pytest.param("global", marks=pytest.mark.heavy)])
def test_a_script_doing_its_own_mixed_precision_runs_as_written(case):
    plain, _ = _run(case, tf_mpt=False)
    mixed, log = _run(case, tf_mpt=True)
    assert plain.get(BF16, 0) > 0  # the script's own half layers
    if case == "layer":
        assert plain.get(FP32, 0) > 0  # ... inside a float32 model
    assert mixed == plain, (mixed, plain)  # no second conversion, not one Cast more
    assert "tf_mpt leaves tf.function one_step_on_data as the script wrote it" in log, log
    assert "already compute in bfloat16 or float16 (the script's own mixed precision" in log


# (a float32 Keras model's fit rewritten: test_autoenable.py's Keras fit script, by default)
@pytest.mark.heavy
def test_a_float32_model_is_still_rewritten():
    plain, _ = _run("none", tf_mpt=False)
    mixed, log = _run("none", tf_mpt=True)
    assert plain.get(BF16, 0) == 0 and mixed.get(BF16, 0) > 0, (plain, mixed)
    assert "as the script wrote it" not in log
