"""Shared fixtures and named tolerances.

Tolerances compare a half-precision run against float32 on the same inputs. They are loose
enough for rounding of inputs and weights to the half type and tight enough to catch a wrong
dtype decision (a deny op in half, a dropped Cast).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# float16 has a 10-bit mantissa (unit roundoff 4.9e-4), bfloat16 a 7-bit one (3.9e-3).
TOLERANCES = {
    "float16": dict(rtol=2e-2, atol=2e-2),
    "bfloat16": dict(rtol=6e-2, atol=6e-2),
}
# Loss after a few training steps, relative to float32.
LOSS_RTOL = {"float16": 1e-2, "bfloat16": 3e-2}

# After a few training steps rounding differences compound (gradients through batch norm in
# half precision, summed in Momentum accumulators): tensors are compared by their largest
# difference relative to the float32 tensor's largest magnitude.
TRAINED_SCALE_TOL = {"float16": 0.1, "bfloat16": 0.2}

HALF_DTYPES = ("float16", "bfloat16")


@pytest.fixture(params=HALF_DTYPES)
def half_dtype(request):
    return request.param


def pytest_sessionfinish(session, exitstatus):
    """A run in which no test passed is a failure, never a pass."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    passed = len(reporter.stats.get("passed", ())) if reporter else 0
    if exitstatus == 0 and passed == 0:
        session.exitstatus = 1


def tf_dtype(name):
    return tf.as_dtype(name)


def run_graph_def(graph_def, fetches, feeds=None, init=None):
    """Imports a GraphDef into a new graph and runs it in a Session."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        if init:
            sess.run(init)
        return sess.run(fetches, feeds or {})


def assert_close_to_scale(actual, expected, dtype, what=""):
    """max|actual - expected| <= TRAINED_SCALE_TOL[dtype] * max|expected|."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = max(np.abs(expected).max(), 1e-6)
    error = np.abs(actual - expected).max()
    assert error <= TRAINED_SCALE_TOL[dtype] * scale, (
        f"{what}: max error {error:.3g} > {TRAINED_SCALE_TOL[dtype]} * scale {scale:.3g}")


def assert_close(actual, expected, dtype, **overrides):
    tol = dict(TOLERANCES[dtype], **overrides)
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               **tol)
