"""Shapes for every graph: a GraphDef without `_output_shapes` (a frozen graph, a SavedModel's
graph, rewrite_graph_def's input) is sized by TensorFlow's shape inference, so the cost model
weighs it as it weighs a traced graph, and the report says how much it weighed.

The decisions read the suite's Zen 4 table (conftest.py), never this machine's clock.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.models import sources
from support import model_corpus
from support.helpers import run, tf1


def _typed_nodes(report):
    """Nodes with a float type the rewrite decided about (the weighed count's denominator)."""
    return sum(1 for d in report.decisions.values() if d.attrs)


def _with_shape_attrs(graph_def):
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
    return graph.as_graph_def(add_shapes=True)


@pytest.mark.parametrize("name", ["mobilenet_v2", "transformer_block"])
def test_a_frozen_graph_without_shapes_is_weighed_as_one_with_them(name):
    model = model_corpus.build(name)
    assert not any("_output_shapes" in n.attr for n in model.graph_def.node)
    plain = tf_mpt.rewrite_graph_def(model.graph_def, dtype="bfloat16",
                                     fetches=model.fetch_nodes)
    shaped = tf_mpt.rewrite_graph_def(_with_shape_attrs(model.graph_def), dtype="bfloat16",
                                      fetches=model.fetch_nodes)
    weighed, of = plain.report.weighed_nodes
    assert of == _typed_nodes(plain.report) and weighed == of, plain.report.weighed_nodes
    assert plain.report.unweighed_why is None
    assert f"the cost model weighed {of}/{of} nodes" in plain.report.summary()
    # the same decisions, node by node, as with the shapes written into the graph
    assert {k: d.converted for k, d in plain.report.decisions.items()} == \
        {k: d.converted for k, d in shaped.report.decisions.items()}
    assert plain.report.predicted_saving == pytest.approx(shaped.report.predicted_saving)
    # the cost model, not the op lists, decided: it differs from the rules' colouring
    rules = tf_mpt.rewrite_graph_def(model.graph_def, dtype="bfloat16",
                                     fetches=model.fetch_nodes, target="rules")
    assert "weighed" not in rules.report.summary()
    by_cost = [d for d in plain.report.decisions.values()
               if d.reason.startswith("cost model:")]
    assert by_cost or plain.report.predicted_saving > 0
    assert rules.report.converted_nodes != plain.report.converted_nodes or \
        rules.report.casts_added != plain.report.casts_added


def _wide_mlp(batch):
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default():
        h = tf1.placeholder(tf.float32, [batch, 512], name="x")
        for k in range(3):
            w = tf.constant(rng.uniform(-0.05, 0.05, (512, 512)).astype(np.float32))
            h = tf.nn.relu(tf.matmul(h, w, name=f"matmul_{k}"))
        tf.identity(h, name="y")
    return graph.as_graph_def()


def test_an_open_batch_is_costed_at_the_assumed_size():
    """x: [None, 512], no `_output_shapes`: the inferred [-1, 512] reads as the assumed batch
    (TF_MPT_COST_BATCH): every node is weighed, and decided as in the same graph with that
    batch declared."""
    open_batch = tf_mpt.rewrite_graph_def(_wide_mlp(None), dtype="bfloat16", fetches=["y"])
    assert open_batch.report.weighed_nodes[0] == open_batch.report.weighed_nodes[1] > 0
    batch = tf_mpt.Config.from_env(os.environ).cost_batch
    declared = tf_mpt.rewrite_graph_def(_wide_mlp(batch), dtype="bfloat16", fetches=["y"])
    assert {k: d.converted for k, d in open_batch.report.decisions.items()} == \
        {k: d.converted for k, d in declared.report.decisions.items()}
    assert open_batch.report.predicted_saving == pytest.approx(
        declared.report.predicted_saving)
    assert all(open_batch.report.decisions[f"matmul_{k}"].converted for k in range(3))
    x = np.random.RandomState(1).uniform(-1, 1, (5, 512)).astype(np.float32)
    expected = run(_wide_mlp(None), "y:0", {"x:0": x})
    actual = run(open_batch.graph_def, "y:0", {"x:0": x})
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=0.05, atol=0.05)


def test_a_graph_tensorflow_cannot_shape_keeps_the_rules_and_says_why():
    graph_def = _wide_mlp(None)
    custom = graph_def.node.add(name="custom", op="MyCustomOp", input=["y"])
    custom.attr["T"].type = tf.float32.as_datatype_enum
    result = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=["custom"])
    rules = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=["custom"],
                                     target="rules")
    assert result.report.weighed_nodes == (0, _typed_nodes(result.report))
    assert "MyCustomOp" in result.report.unweighed_why
    assert "(no shapes: NotFoundError: Op type not registered 'MyCustomOp'" in \
        result.report.summary()
    assert result.graph_def == rules.graph_def  # unsized: the op lists decide


def test_a_converted_saved_model_reports_what_it_weighed(tmp_path):
    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_uniform([512, 512], seed=(1, 2)) * 0.05)

        @tf.function(input_signature=[tf.TensorSpec([256, 512], tf.float32)])
        def serve(self, x):
            return {"y": tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, self.w)), self.w))}

    module = Module()
    tf.saved_model.save(module, str(tmp_path / "sm"),
                        signatures={"serving_default": module.serve})
    converted = sources.open_model(str(tmp_path / "sm")).convert("bfloat16", lists=None)
    (report,) = converted.reports.values()
    weighed, of = report.weighed_nodes
    assert f"the cost model weighed {weighed}/{of} nodes" in report.summary()
    # all but the restore function's RestoreV2 and what reads it (their shapes are set
    # only when a checkpoint is read)
    assert of - weighed == len(report.unweighed_nodes) > 0
    assert all("_traced_restore_" in name for name in report.unweighed_nodes), \
        report.unweighed_nodes
    # the two [256x512] x [512x512] MatMuls of the serving function: converted
    matmuls = [d for d in report.decisions.values() if d.op == "MatMul"]
    assert matmuls and all(d.converted for d in matmuls), [str(d) for d in matmuls]
