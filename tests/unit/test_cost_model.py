"""The cost model (TF_MPT_COST_MODEL): tiny clusters stay float32, big ones go half, and the
model acts only with static shapes, above its noise floor, and where it is switched on."""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.rewrite.paint import cost as _cost
from tf_mpt import config as _config


def _layers(width, batch, depth, known_batch=True):
    """depth x [MatMul by a constant -> Relu -> Exp]: each Exp (deny) forces a Cast pair."""
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        h = tf.compat.v1.placeholder(tf.float32, [batch if known_batch else None, width],
                                     name="x")
        for k in range(depth):
            w = tf.constant(rng.standard_normal((width, width)).astype(np.float32) / width)
            h = tf.math.exp(tf.nn.relu(tf.matmul(h, w, name=f"matmul_{k}")) * 0.01)
        tf.identity(h, name="y")
    return graph


def _matmul_dtypes(graph):
    return {op.get_attr("T") for op in graph.get_operations() if op.type == "MatMul"}


@pytest.fixture
def cost_model(monkeypatch):
    def set_to(value):
        if value is None:
            monkeypatch.delenv(_config.TF_MPT_COST_MODEL, raising=False)
        else:
            monkeypatch.setenv(_config.TF_MPT_COST_MODEL, value)
    return set_to


def test_many_tiny_layers_stay_float32_in_bfloat16_by_default(cost_model):
    cost_model(None)
    rewritten = tf_mpt.rewrite_graph(_layers(16, 16, 30), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.float32}
    assert not [op for op in rewritten.get_operations() if op.type == "Cast"]
    cost_model("0")
    rewritten = tf_mpt.rewrite_graph(_layers(16, 16, 30), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.bfloat16}  # Grappler's name-based decision


def test_report_gives_the_cost_models_numbers(cost_model):
    cost_model(None)
    graph = _layers(16, 16, 30)
    graph_def = graph.as_graph_def(add_shapes=True)  # shapes travel in `_output_shapes`
    report = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=["y"]).report
    constants = _cost.CPU_BFLOAT16
    saved = constants.op_saving(2 * 16 * 16 * 16)
    cost = 2 * constants.cast_cost(16 * 16)  # h in, the cluster's output (to Exp) out
    decision = report.decisions["matmul_3"]
    assert decision.colour == "fp32" and not decision.converted
    # the cluster: MatMul, Relu and the Mul by 0.01 (the constant is stored in half later)
    assert decision.reason == (f"cost model: its cluster of 3 would save ~{saved * 1e6:.1f} us "
                               f"in half but its Casts cost ~{cost * 1e6:.1f} us")


def test_big_layers_stay_half(cost_model):
    cost_model(None)
    rewritten = tf_mpt.rewrite_graph(_layers(512, 64, 3), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.bfloat16}


def test_below_the_noise_floor_or_without_shapes_nothing_changes(cost_model):
    cost_model(None)
    one_layer = tf_mpt.rewrite_graph(_layers(16, 16, 1), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(one_layer) == {tf.bfloat16}  # saves ~4 us < the 50 us floor
    unknown = tf_mpt.rewrite_graph(_layers(16, 16, 30, known_batch=False), dtype="bfloat16",
                                   fetches=["y"])
    assert _matmul_dtypes(unknown) == {tf.bfloat16}
    plain_graph_def = _layers(16, 16, 30).as_graph_def()  # no `_output_shapes`
    result = tf_mpt.rewrite_graph_def(plain_graph_def, dtype="bfloat16", fetches=["y"])
    assert all(d.converted for d in result.report.decisions.values() if d.op == "MatMul")


def test_float16_is_off_unless_forced(cost_model):
    cost_model(None)
    rewritten = tf_mpt.rewrite_graph(_layers(16, 16, 30), dtype="float16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.float16}
    cost_model("1")
    rewritten = tf_mpt.rewrite_graph(_layers(16, 16, 30), dtype="float16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.float32}


def test_tiny_layers_give_the_same_numbers_as_float32(cost_model):
    cost_model(None)
    graph = _layers(16, 16, 30)
    rewritten = tf_mpt.rewrite_graph(graph, dtype="bfloat16", fetches=["y"])
    x = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    outputs = []
    for g in (graph, rewritten):
        with tf.compat.v1.Session(graph=g) as session:
            outputs.append(session.run("y:0", {"x:0": x}))
    np.testing.assert_array_equal(outputs[1], outputs[0])  # all float32: bit-identical


def test_bad_value_is_refused():
    with pytest.raises(ValueError, match="TF_MPT_COST_MODEL must be auto.*'maybe'"):
        _config.Config.from_env({"TF_MPT_COST_MODEL": "maybe"})
    assert _config.Config.from_env({"TF_MPT_COST_MODEL": "off"}).cost_model == "0"
    assert _config.Config.from_env({}).cost_model == "auto"
