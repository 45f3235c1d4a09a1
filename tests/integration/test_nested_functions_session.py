"""A TF1 graph calling a tf.function that calls another tf.function, under TF_MPT_ENABLE=1.

tf_mpt.function rebuilds the outer function from its rewritten GraphDef, whose library (the
inner function, renamed ..._tf_mpt_<dtype>) went to the eager context only: the TF1 graph got
the outer function without the inner one and the Session failed with NotFoundError.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from support.helpers import alternating, heavy_except, child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = textwrap.dedent("""
    import json, numpy as np, tensorflow as tf
    v1 = tf.compat.v1; v1.disable_v2_behavior()
    W = np.random.RandomState(0).randn(4, 4).astype(np.float32); X = W[:3] + 1
    w = v1.get_variable("w", initializer=W, use_resource=True)
    @tf.function
    def f(x): return tf.matmul(x, w)
    @tf.function
    def g(x): return tf.nn.relu(f(x) + tf.matmul(x, w))
    x = v1.placeholder(tf.float32, [None, 4]); y = g(x)
    with v1.Session() as s:
        s.run(v1.global_variables_initializer()); md = v1.RunMetadata()
        out = s.run(y, {x: X}, options=v1.RunOptions(output_partition_graphs=True),
                    run_metadata=md)
    nodes = [n for pg in md.partition_graphs
             for n in list(pg.node) + [m for fd in pg.library.function for m in fd.node_def]]
    print(json.dumps({"out": out.tolist(), "ref": np.maximum(2 * X @ W, 0).tolist(),
                      "matmuls": [tf.as_dtype(n.attr["T"].type).name
                                  for n in nodes if n.op in ("MatMul", "_MklMatMul")]}))
""")


# float16 through the Grappler path by default; the other pairs under -m heavy
@pytest.mark.parametrize("dtype, session_rewrite", heavy_except(
    alternating(["float16", "bfloat16"], ["grappler", "copy"]), ("float16-grappler",)))
def test_tf_function_calling_a_tf_function_runs_half_in_a_tf1_session(dtype, session_rewrite,
                                                                       tmp_path):
    script = tmp_path / "nested.py"
    script.write_text(SCRIPT)
    env = child_env()
    # the cost model off: it would keep these tiny MatMuls float32 (test_cost_model.py)
    env.update(TF_MPT_ENABLE="1", TF_MPT_DTYPE=dtype, TF_MPT_SESSION_REWRITE=session_rewrite,
               TF_MPT_TARGET="rules", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]  # was: NotFoundError ... is not defined
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["matmuls"] == [dtype, dtype]  # f's and g's
    tol = 0.01 if dtype == "float16" else 0.06
    np.testing.assert_allclose(result["out"], result["ref"], rtol=tol, atol=tol)


REF_ARGUMENT = textwrap.dedent("""
    import numpy as np, tensorflow as tf
    v1 = tf.compat.v1; v1.disable_v2_behavior()
    w = v1.get_variable("w", [8, 8], initializer=v1.glorot_uniform_initializer(seed=1))
    @tf.function
    def block(h, w): return tf.nn.relu(tf.matmul(h, w))
    @tf.function
    def outer(h, w): return block(h, w) + 1.0
    x = v1.placeholder(tf.float32, [None, 8]); y = outer(block(x, w), w)
    loss = tf.reduce_mean(y); train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with v1.Session() as s:
        s.run(v1.global_variables_initializer())
        print("LOSSES", [float(s.run([train, loss], {x: np.ones((2, 8))})[1]) for _ in range(3)])
""")


@pytest.mark.parametrize("dtype", [pytest.param("float16", marks=pytest.mark.heavy),
                                   "bfloat16"])
def test_a_ref_variable_passed_to_a_tf_function_runs_as_without_tf_mpt(dtype, tmp_path):
    """A TF1 ref variable as a tf.function argument does not bind to the rebuilt
    mixed-precision function: that call runs float32 with one warning (it raised before)."""
    script = tmp_path / "ref_argument.py"
    script.write_text(REF_ARGUMENT)
    losses = {}
    for label, extra in (("float32", {}), ("mixed", dict(  # the lists decide (cost model off)
            TF_MPT_ENABLE="1", TF_MPT_DTYPE=dtype, TF_MPT_LOSS_SCALING="0",
            TF_MPT_TARGET="rules"))):
        env = child_env()
        env.update(extra, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-4000:]
        losses[label] = json.loads(proc.stdout.split("LOSSES")[1].strip().replace("'", '"'))
        if label == "mixed":
            assert "in float32 for these arguments" in proc.stderr
    tol = 0.01 if dtype == "float16" else 0.06
    np.testing.assert_allclose(losses["mixed"], losses["float32"], rtol=tol, atol=tol)
