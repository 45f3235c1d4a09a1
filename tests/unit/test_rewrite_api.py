"""The public API contract: errors, no mutation, idempotence, fallback, report, dump dir."""

import json
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt import rewrite as rewrite_module
from tf_mpt.rewrite import painting
from support.helpers import added_casts, rewrite, tf1, type_attr


def _mlp_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf1.placeholder(tf.float32, [8, 8], name="w")
        allow1 = tf.matmul(x, w, name="allow1")
        clr1 = tf.nn.relu(allow1, name="clr1")
        allow2 = tf.matmul(clr1, w, name="allow2")
        deny1 = tf.exp(tf.tanh(allow2), name="deny1")
        tf.reduce_mean(deny1, name="loss")
    return graph


def test_input_graph_def_is_never_mutated(half_dtype):
    graph_def = _mlp_graph().as_graph_def()
    before = graph_def.SerializeToString(deterministic=True)
    result = tf_mpt.rewrite_graph_def(graph_def, dtype=half_dtype, target="rules")
    assert result.modified
    assert graph_def.SerializeToString(deterministic=True) == before


def test_rewriting_a_rewritten_graph_changes_nothing(half_dtype):
    first = tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), dtype=half_dtype)
    second = tf_mpt.rewrite_graph_def(first.graph_def, dtype=half_dtype)
    assert not second.modified
    assert second.report.converted_nodes == 0 and second.report.casts_added == 0
    assert (second.graph_def.SerializeToString(deterministic=True)
            == first.graph_def.SerializeToString(deterministic=True))


def test_rewrite_is_deterministic(half_dtype):
    a = tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), dtype=half_dtype)
    b = tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), dtype=half_dtype)
    assert a.graph_def.SerializeToString(deterministic=True) == b.graph_def.SerializeToString(
        deterministic=True)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, "float16", "bfloat16"])
def test_dtype_accepts_strings_and_tf_dtypes(dtype):
    result = tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), dtype=dtype)
    assert result.report.dtype == tf.as_dtype(dtype).name


@pytest.mark.parametrize("bad", ["int8", "float32", tf.float64, 16, None])
def test_bad_dtype_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=r"dtype must be 'float16' or 'bfloat16'.*Received"):
        tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), dtype=bad)


@pytest.mark.parametrize("strict", [False, True])
def test_not_a_graph_def_is_a_type_error_in_both_modes(strict):
    with pytest.raises(TypeError, match="rewrite_graph"):
        tf_mpt.rewrite_graph_def(_mlp_graph(), strict=strict)
    with pytest.raises(TypeError, match="GraphDef"):
        tf_mpt.rewrite_graph_def(b"not a graph", strict=strict)


@pytest.mark.parametrize("strict", [False, True])
def test_duplicate_node_names_are_rejected(strict):
    graph_def = _mlp_graph().as_graph_def()
    graph_def.node.add().CopyFrom(graph_def.node[0])
    with pytest.raises(tf_mpt.GraphDefError, match="two nodes named 'x'"):
        tf_mpt.rewrite_graph_def(graph_def, strict=strict)


@pytest.mark.parametrize("strict", [False, True])
def test_dangling_input_is_rejected(strict):
    graph_def = _mlp_graph().as_graph_def()
    node = [n for n in graph_def.node if n.name == "allow1"][0]
    node.input[1] = "nowhere"
    with pytest.raises(tf_mpt.GraphDefError, match="no node named 'nowhere'"):
        tf_mpt.rewrite_graph_def(graph_def, strict=strict)


def test_input_port_past_the_producers_outputs_is_rejected():
    graph_def = _mlp_graph().as_graph_def()
    node = [n for n in graph_def.node if n.name == "allow1"][0]
    node.input[1] = "w:3"
    with pytest.raises(tf_mpt.GraphDefError, match="reads output 3 of node 'w'"):
        tf_mpt.rewrite_graph_def(graph_def)


def test_unknown_fetch_name_is_rejected():
    with pytest.raises(ValueError, match="no node 'nope'"):
        tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), fetches=["nope:0"])


def _break_pass(monkeypatch):
    def broken(paint):
        raise RuntimeError("simulated bug")
    passes = tuple((name, broken if name == "propagate_allow_through_clear" else fn)
                   for name, fn in painting.PASSES)
    monkeypatch.setattr(painting, "PASSES", passes)


def test_internal_error_returns_the_original_graph_with_one_warning(monkeypatch, caplog):
    _break_pass(monkeypatch)
    graph_def = _mlp_graph().as_graph_def()
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        result = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "propagate_allow_through_clear" in warnings[0].getMessage()
    assert not result.modified
    assert result.graph_def == graph_def and result.graph_def is not graph_def
    assert "simulated bug" in result.report.error
    assert "rewrite abandoned" in result.report.summary()


def test_internal_error_raises_with_strict(monkeypatch):
    _break_pass(monkeypatch)
    with pytest.raises(tf_mpt.RewriteError, match="propagate_allow_through_clear.*simulated bug"):
        tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), strict=True)


def test_summary_line_and_info_log(caplog):
    with caplog.at_level(logging.INFO, logger="tf_mpt"):
        result = tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), dtype="bfloat16",
                                          target="rules")
    report = result.report
    # (the cost model's additions to the line: test_cost_model, test_graph_shapes)
    line = (f"Converted {report.converted_nodes}/{report.total_nodes} nodes to bfloat16 "
            f"using {report.casts_added} cast(s) for target rules")
    assert report.summary() == line
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [line]
    assert report.total_nodes == len(_mlp_graph().as_graph_def().node)
    assert report.converted_nodes == 4  # allow1, clr1, allow2 and the Tanh after it
    assert report.casts_added == len(added_casts(result.graph_def)) == 3


def test_debug_log_has_one_line_per_node(caplog):
    with caplog.at_level(logging.DEBUG, logger="tf_mpt"):
        result = tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def())
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == result.report.total_nodes
    assert "allow1 (MatMul): allow: op MatMul is on the allow list" in debug


def test_report_json_round_trips():
    report = tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def()).report
    data = json.loads(report.to_json())
    assert data["summary"] == report.summary()
    assert data["casts_added"] == report.casts_added
    assert data["nodes"]["deny1"]["colour"] == "deny"
    assert data["nodes"]["allow1"]["attrs"]["T"]["colour"] == "allow"
    assert set(data["nodes"]) == set(report.decisions)


def test_dump_dir_gets_graphs_lists_and_report(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_MPT_DUMP_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("TF_MPT_TARGET", "rules")  # a graph of 4x8 matrices: the lists convert
    tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), dtype="bfloat16")
    files = sorted(os.listdir(tmp_path / "dump"))
    suffixes = sorted(re.sub(r"^tf_mpt_\d+_\d+_", "", f) for f in files)
    assert suffixes == ["after.pb", "after.pbtxt", "before.pb", "before.pbtxt", "lists.txt",
                        "report.json"]
    stem = os.path.join(tmp_path, "dump", re.match(r"tf_mpt_\d+_\d+", files[0]).group(0))
    after = tf1.GraphDef()
    with open(stem + "_after.pb", "rb") as f:
        after.ParseFromString(f.read())
    assert type_attr(after, "allow1") == "bfloat16"
    with open(stem + "_lists.txt") as f:
        assert f.read().startswith("allow (")


def test_env_list_edit_moves_an_op_with_one_add(monkeypatch):
    monkeypatch.setenv("TF_MPT_DENYLIST_ADD", "MatMul")
    result = rewrite(_mlp_graph(), "bfloat16")
    assert type_attr(result.graph_def, "allow1") == "float32"
    assert result.report.decisions["allow1"].reason == "op MatMul is on the deny list"
    monkeypatch.setenv("TF_MPT_DENYLIST_ADD", "")
    monkeypatch.setenv("TF_MPT_ALLOWLIST_REMOVE", "MatMul")
    assert rewrite(_mlp_graph(), "bfloat16").report.converted_nodes == 0


def test_explicit_lists_replace_the_defaults():
    lists = tf_mpt.OpLists(allow={"MatMul"})
    result = rewrite(_mlp_graph(), "float16", lists=lists)
    assert type_attr(result.graph_def, "clr1") == "float32"  # Relu is on no list here
    with pytest.raises(TypeError, match="lists must be a tf_mpt.OpLists"):
        rewrite(_mlp_graph(), "float16", lists={"allow": ["MatMul"]})


def test_rewrite_graph_returns_a_new_graph_with_every_node_name(half_dtype, no_cost_model):
    graph = _mlp_graph()
    new_graph = tf_mpt.rewrite_graph(graph, dtype=half_dtype)
    assert new_graph is not graph
    old_names = {op.name for op in graph.get_operations()}
    assert old_names <= {op.name for op in new_graph.get_operations()}
    assert new_graph.get_tensor_by_name("loss:0").dtype == tf.float32
    assert new_graph.get_operation_by_name("allow1").get_attr("T") == tf.as_dtype(half_dtype)
    assert graph.get_operation_by_name("allow1").get_attr("T") == tf.float32


def test_rewrite_graph_keeps_collections():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf1.get_variable("w", [8, 8])
        loss = tf.reduce_sum(tf.matmul(x, w), name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    new_graph = tf_mpt.rewrite_graph(graph, dtype="bfloat16")
    with new_graph.as_default():
        assert [v.name for v in tf1.trainable_variables()] == ["w:0"]


def test_rewrite_graph_rejects_a_graph_def():
    with pytest.raises(TypeError, match="rewrite_graph_def"):
        tf_mpt.rewrite_graph(_mlp_graph().as_graph_def())


def test_data_input_after_a_control_input_is_rejected():
    graph_def = _mlp_graph().as_graph_def()
    node = [n for n in graph_def.node if n.name == "allow1"][0]
    node.input[:] = ["^x", "x", "w"]
    with pytest.raises(tf_mpt.GraphDefError, match="lists data input 'x' after a control input"):
        tf_mpt.rewrite_graph_def(graph_def)


def test_a_fetch_that_is_not_a_name_is_a_type_error():
    with pytest.raises(TypeError, match="fetches must be node or tensor names"):
        tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(), fetches=[3])


# --- an explicit Config -------------------------------------------------------------------------

def test_explicit_config_is_used_instead_of_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_MPT_DENYLIST_ADD", "MatMul")
    graph = _mlp_graph()
    from_env = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype="float16")
    assert type_attr(from_env.graph_def, "allow1") == "float32"
    config = tf_mpt.Config.from_env({"TF_MPT_DUMP_DIR": str(tmp_path)})
    explicit = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype="float16", config=config)
    assert type_attr(explicit.graph_def, "allow1") == "float16"
    assert any(name.endswith("_report.json") for name in os.listdir(tmp_path))
    mixed = tf_mpt.rewrite_graph(graph, dtype="float16", config=config)
    assert mixed.get_operation_by_name("allow1").get_attr("T") == tf.float16


def test_explicit_config_reaches_rewrite_function(monkeypatch):
    @tf.function
    def f(x, w):
        return tf.nn.relu(tf.matmul(x, w, name="allow1"))

    cf = f.get_concrete_function(tf.TensorSpec([4, 8]), tf.TensorSpec([8, 8]))
    deny = tf_mpt.Config.from_env({"TF_MPT_DENYLIST_ADD": "MatMul"})
    assert tf_mpt.rewrite_function(cf, dtype="bfloat16", config=deny) is cf  # nothing to do
    half = tf_mpt.rewrite_function(  # the cost model would keep this tiny graph float32
        cf, dtype="bfloat16", config=tf_mpt.Config.from_env({"TF_MPT_TARGET": "rules"}))
    assert half is not cf
    ops = {op.type: op for op in half.graph.get_operations()}
    assert ops["MatMul"].get_attr("T") == tf.bfloat16


def test_bad_config_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"config must be a tf_mpt.Config .* Received: "
                       r"config=\{'TF_MPT_DENYLIST_ADD': 'MatMul'\} \(of type dict\)"):
        tf_mpt.rewrite_graph_def(_mlp_graph().as_graph_def(),
                                 config={"TF_MPT_DENYLIST_ADD": "MatMul"})


def test_the_summary_counts_what_already_computed_in_half():
    """A graph that already computes in half (a Keras model under a mixed policy) is not
    reported as 'nothing happened': the summary says how many nodes were half already."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf.constant(np.ones((8, 8), np.float16), name="w")
        allow1 = tf.matmul(tf.cast(x, tf.float16), w, name="allow1")  # already float16
        tf.nn.relu(tf.cast(allow1, tf.float32), name="y")
    report = rewrite(graph, "float16", fetches=["y"]).report
    assert report.already_half_nodes >= 1
    assert report.decisions["allow1"].colour == "allow" and not report.decisions["allow1"].converted
    assert report.summary().endswith(f"; {report.already_half_nodes} more were float16 already")
    assert report.to_dict()["already_half_nodes"] == report.already_half_nodes
