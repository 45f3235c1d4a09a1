"""Folding inference batch norms into their convolutions (tf_mpt/rewrite/fold_batch_norms.py):
the same float32 numbers, the batch norm's name kept, and no fold where anything could tell."""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.rewrite import fold_batch_norms as fold
from tf_mpt.rewrite.graph_view import GraphView
from tf_mpt.rewrite.paint import cost
from support.helpers import node_map, run, tf1

# float32 folding reorders a multiply: a few ulps
FOLD_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def _graph(depthwise=False, training=False, extra_reader=False, stats_fed=False,
           bias=False):
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
        if depthwise:
            kernel = tf.constant(rng.standard_normal((3, 3, 3, 2)).astype(np.float32))
            y = tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME", name="conv")
            channels = 6
        else:
            kernel = tf.constant(rng.standard_normal((3, 3, 3, 4)).astype(np.float32))
            y = tf.nn.conv2d(x, kernel, 1, "SAME", name="conv")
            channels = 4
        if bias:
            y = tf.nn.bias_add(y, tf.constant(rng.standard_normal(channels).astype(np.float32)),
                               name="bias")
        stats = [tf.identity(tf.constant(v.astype(np.float32))) for v in (
            rng.uniform(0.5, 2, channels), rng.standard_normal(channels),
            rng.standard_normal(channels), rng.uniform(0.5, 2, channels))]
        if stats_fed:
            stats[0] = tf1.placeholder_with_default(stats[0], [channels], name="scale")
        out = tf.raw_ops.FusedBatchNormV3(
            x=y, scale=stats[0], offset=stats[1], mean=stats[2] if not training else [],
            variance=stats[3] if not training else [], epsilon=1e-3, is_training=training,
            name="bn")
        h = tf.nn.relu6(out[0], name="act")
        if extra_reader:
            h = h + tf.reduce_mean(y)
        tf.identity(h, name="out")
    return graph.as_graph_def()


@pytest.mark.parametrize("depthwise, bias", [(False, False), (True, False), (False, True)])
def test_a_frozen_batch_norm_becomes_a_bias_with_the_same_numbers(depthwise, bias):
    graph_def = _graph(depthwise, bias=bias)
    before = graph_def.SerializeToString()
    folded, count = fold.fold_batch_norms(graph_def, {"out"})
    assert count == 1 and graph_def.SerializeToString() == before  # the input is untouched
    nodes = node_map(folded)
    assert nodes["bn"].op == "BiasAdd" and nodes["conv"].input[1].endswith("/folded_filter")
    assert nodes["bn"].input[0] == "conv"  # a bias between them is folded in too
    assert "bias" not in nodes and ("bias" in node_map(graph_def)) == bias  # and removed
    x = np.random.default_rng(1).standard_normal((2, 8, 8, 3)).astype(np.float32)
    expected = run(graph_def, ["out:0"], {"x:0": x})[0]
    got = run(folded, ["out:0"], {"x:0": x})[0]
    np.testing.assert_allclose(got, expected, **FOLD_TOLERANCE)


@pytest.mark.parametrize("case", ["training", "conv read twice", "stats fed", "fetched"])
def test_no_fold_where_something_else_could_tell(case):
    graph_def = _graph(training=case == "training", extra_reader=case == "conv read twice",
                       stats_fed=case == "stats fed")
    fetched = {"out", "bn"} if case == "fetched" else {"out"}
    folded, count = fold.fold_batch_norms(graph_def, fetched)
    assert count == 0 and folded is graph_def


def test_the_bfloat16_rewrite_folds_and_says_so():
    result = tf_mpt.rewrite_graph_def(_graph(), dtype="bfloat16", fetches=["out"], strict=True)
    assert result.report.summary().endswith("; 1 batch norm(s) folded into their convolutions")
    assert node_map(result.graph_def)["bn"].op == "BiasAdd"
    off = tf_mpt.rewrite_graph_def(_graph(), dtype="bfloat16", fetches=["out"],
                                   config=tf_mpt.Config.from_env({"TF_MPT_TARGET": "rules"}))
    assert node_map(off.graph_def)["bn"].op == "FusedBatchNormV3"  # only with the cost model


def test_a_folded_bias_leaves_the_convolution_one_reader_the_remapper_fuses():
    """conv -> BiasAdd -> batch norm: the folded conv bias is gone, so the cost model sees
    the convolution read by the batch norm's BiasAdd alone, fused into its kernel in either
    dtype (left unread in the graph, the bias was a second reader: ResNet50's inference
    costed each of its BiasAdds and Relus as kernels of their own and kept them float32
    with 88 Casts around its bfloat16 convolutions)."""
    folded, count = fold.fold_batch_norms(_graph(bias=True), {"out"})
    view = GraphView(folded)
    assert count == 1 and view.readers(view.index["conv"]) == {view.index["bn"]}
    assert cost.fusion(view, view.index["bn"]) == "both"
    assert cost.fusion(view, view.index["act"]) == "both"


def test_the_bias_keeps_the_batch_norms_output_shape():
    """A GraphDef with `_output_shapes` (as_graph_def(add_shapes=True)) is what the cost
    model sizes tensors by: the BiasAdd that replaces the batch norm keeps its output 0's."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(_graph(), name="")
    folded, count = fold.fold_batch_norms(graph.as_graph_def(add_shapes=True), {"out"})
    shapes = node_map(folded)["bn"].attr["_output_shapes"].list.shape
    assert count == 1 and [[d.size for d in s.dim] for s in shapes] == [[2, 8, 8, 4]]

