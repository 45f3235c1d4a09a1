"""Real TF1 training graphs: rewritten, they run, keep fetched dtypes and match float32."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.costs import dispatch
from support.tolerances import LOSS_RTOL, TOLERANCES, assert_close_to_scale
from support.helpers import added_casts, node_map, tf1
from support import conv_net

STEPS = 4
FETCHES = ["loss", "logits", "accuracy", "train", "init"]
HALF_OPS = ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul")


@pytest.mark.parametrize("use_resource", [False, True], ids=["ref_vars", "resource_vars"])
def test_conv_net_training_structure(half_dtype, use_resource):
    graph, names = conv_net.build(use_resource=use_resource)
    # the op lists' structure (every contraction half); the cost model's: test_cost_model.py
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype, fetches=FETCHES,
                                      target="rules")
    gd = result.graph_def
    nodes = node_map(gd)
    half = tf.as_dtype(half_dtype).as_datatype_enum
    for node in gd.node:
        if node.op in HALF_OPS and not node.name.startswith("init"):
            assert node.attr["T"].type == half, node.name
        if node.op.startswith(("Apply", "ResourceApply", "Assign")):
            assert node.attr["T"].type != half, node.name
        if node.op in ("SparseSoftmaxCrossEntropyWithLogits", "VariableV2", "VarHandleOp"):
            assert all(node.attr[a].type != half for a in ("T", "dtype")), node.name
    bn = nodes["bn1"]
    assert bn.attr["T"].type == half and bn.attr["U"].type == tf.float32.as_datatype_enum
    for fetch in ("loss", "logits", "accuracy"):
        assert nodes[fetch].attr["T"].type == tf.float32.as_datatype_enum
    casts = added_casts(gd)
    assert len(casts) == result.report.casts_added
    assert len({nodes[c].input[0] + str(nodes[c].attr["DstT"].type) for c in casts}) == len(casts)
    assert result.report.converted_nodes >= 20


def _config_as_on_this_cpu(half_dtype):
    """The suite's configuration, with what the numerics check keeps float32 on this CPU: with
    oneDNN off in this process (TensorFlow's default on a CPU without VNNI, bfloat16 or AMX,
    such as a Skylake-SP), Eigen's bfloat16 convolution gradients err 5-20x bfloat16's
    rounding (their weights' momentum then drifts past the tolerance below), and the check
    keeps them float32 wherever the graph runs (tests/unit/test_dispatch_check.py). The
    suite's table stands in for a Zen 4, whose oneDNN kernels are accurate, so it is said
    here."""
    environ = dict(os.environ)
    if half_dtype == "bfloat16" and not dispatch.onednn_on():
        environ["TF_MPT_DENYLIST_ADD"] = "Conv2DBackpropFilter,Conv2DBackpropInput"
    return tf_mpt.Config.from_env(environ)


@pytest.mark.parametrize("use_resource", [False, True], ids=["ref_vars", "resource_vars"])
def test_conv_net_trains_like_float32(half_dtype, use_resource):
    graph, names = conv_net.build(use_resource=use_resource)
    mixed = tf_mpt.rewrite_graph(graph, dtype=half_dtype, fetches=FETCHES,
                                 config=_config_as_on_this_cpu(half_dtype))
    losses32, logits32, vars32 = conv_net.train_losses(graph, names, STEPS)
    losses, logits, variables = conv_net.train_losses(mixed, names, STEPS)
    assert losses.dtype == np.float32 and logits.dtype == np.float32
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, losses32, rtol=LOSS_RTOL[half_dtype])
    assert_close_to_scale(logits, logits32, half_dtype, "logits")
    assert set(variables) == set(vars32)
    for name, value in vars32.items():
        assert variables[name].dtype == value.dtype, name
        assert_close_to_scale(variables[name], value, half_dtype, name)


def test_rewritten_graph_restores_a_float32_checkpoint(tmp_path, half_dtype):
    graph, names = conv_net.build()
    with graph.as_default():
        saver = tf1.train.Saver()
    with tf1.Session(graph=graph) as sess:
        sess.run(names["init"])
        path = saver.save(sess, str(tmp_path / "model"))
        images, labels = conv_net.batch()
        feeds = {names["images"]: images, names["labels"]: labels}
        expected = sess.run(names["logits"], feeds)
    mixed = tf_mpt.rewrite_graph(graph, dtype=half_dtype, fetches=FETCHES + ["save/control_dependency", "save/restore_all"])
    with mixed.as_default():
        restorer = tf1.train.Saver()
    with tf1.Session(graph=mixed) as sess:
        restorer.restore(sess, path)
        actual = sess.run(names["logits"], feeds)
    np.testing.assert_allclose(actual, expected, **TOLERANCES[half_dtype])


def test_v1_while_loop_with_matmul_keeps_back_edges_consistent(half_dtype):
    tf1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [8, 8], name="x")
            w = tf1.placeholder(tf.float32, [8, 8], name="w")
            _, out = tf1.while_loop(lambda i, h: i < 3,
                                    lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                                    [tf.constant(0), x])
            tf.identity(out, name="out")
    finally:
        tf1.enable_control_flow_v2()
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype)
    nodes = node_map(result.graph_def)
    for node in result.graph_def.node:
        if node.op == "NextIteration":
            merges = [n for n in result.graph_def.node if node.name in n.input]
            assert merges and all(m.op == "Merge" for m in merges)
            assert all(m.attr["T"].type == node.attr["T"].type for m in merges), node.name
    matmul = [n for n in result.graph_def.node if n.op == "MatMul"][0]
    assert tf.as_dtype(matmul.attr["T"].type).name == half_dtype
    assert nodes["out"].attr["T"].type == tf.float32.as_datatype_enum
    feeds = {"x:0": np.eye(8, dtype=np.float32) * 0.5,
             "w:0": np.random.RandomState(0).uniform(-1, 1, (8, 8)).astype(np.float32)}
    from support.helpers import run
    np.testing.assert_allclose(run(result.graph_def, "out:0", feeds),
                               run(graph.as_graph_def(), "out:0", feeds),
                               **TOLERANCES[half_dtype])
