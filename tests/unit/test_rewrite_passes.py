"""Each painting pass on small graphs whose node names say their role.

Structure first (per-node dtypes, the exact Casts added), then numbers against float32.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from support.tolerances import TOLERANCES
from support.helpers import added_casts, half_tag, inputs_of, random_feed, rewrite, run, tf1, type_attr

SHAPE = [8, 8]


@pytest.fixture(autouse=True)
def _op_lists_decide(monkeypatch):
    """These tests are of the painting passes: the op lists decide (TF_MPT_TARGET=rules). The cost model sizes any graph
    (TensorFlow's shape inference) and would keep these graphs of 8x8 matrices float32 in
    bfloat16; its decisions are tests/unit/test_cost_model.py's."""
    monkeypatch.setenv("TF_MPT_TARGET", "rules")


def _placeholders(*names):
    return [tf1.placeholder(tf.float32, SHAPE, name=n) for n in names]


def _compare(graph, result, fetches, dtype, feeds_names=("x", "y")):
    feeds = {f"{n}:0": random_feed(SHAPE, seed=k) for k, n in enumerate(feeds_names)}
    expected = run(graph.as_graph_def(), fetches, feeds)
    actual = run(result.graph_def, fetches, feeds)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, **TOLERANCES[dtype])


def test_allow_op_goes_half_with_casts_at_its_boundary(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        tf.identity(allow1, name="out")
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert type_attr(gd, "allow1") == half_dtype
    assert type_attr(gd, "out") == "float32"
    assert added_casts(gd) == sorted([f"x-0-CastTo{tag}-TfMpt", f"y-0-CastTo{tag}-TfMpt",
                                      "allow1-0-CastToFp32-TfMpt"])
    assert inputs_of(gd, "out") == ["allow1-0-CastToFp32-TfMpt"]
    assert result.report.converted_nodes == 1 and result.report.casts_added == 3
    _compare(graph, result, ["out:0"], half_dtype)


def test_deny_propagates_forward_through_clear_and_infer_to_infer(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        deny1 = tf.exp(tf.tanh(allow1, name="infer0"), name="deny1")
        clr1 = tf.nn.relu(deny1, name="clr1")
        infer1 = tf.add(clr1, clr1, name="infer1")
        allow2 = tf.matmul(infer1, y, name="allow2")
        tf.identity(allow2, name="out")
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    for name in ("allow1", "infer0", "allow2"):
        assert type_attr(gd, name) == half_dtype, name
    for name in ("deny1", "clr1", "infer1"):
        assert type_attr(gd, name) == "float32", name
    decisions = result.report.decisions
    assert decisions["deny1"].colour == "deny"
    assert decisions["clr1"].reason == "downstream of deny op 'deny1' through clear/infer ops"
    assert decisions["infer1"].colour == "deny"
    # y is cast once and shared by allow1 and allow2.
    assert added_casts(gd) == sorted([
        f"x-0-CastTo{tag}-TfMpt", f"y-0-CastTo{tag}-TfMpt", "infer0-0-CastToFp32-TfMpt",
        f"infer1-0-CastTo{tag}-TfMpt", "allow2-0-CastToFp32-TfMpt"])
    assert inputs_of(gd, "allow2")[1] == f"y-0-CastTo{tag}-TfMpt"
    _compare(graph, result, ["out:0"], half_dtype)


def test_clear_op_downstream_of_deny_that_leads_to_no_deny_stays_free(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        deny1 = tf.exp(x, name="deny1")
        clr1 = tf.nn.relu(deny1, name="clr1")
        allow1 = tf.matmul(clr1, y, name="allow1")
        tf.identity(allow1, name="out")
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert type_attr(gd, "clr1") == half_dtype
    assert type_attr(gd, "deny1") == "float32"
    assert added_casts(gd) == sorted([f"deny1-0-CastTo{tag}-TfMpt", f"y-0-CastTo{tag}-TfMpt",
                                      "allow1-0-CastToFp32-TfMpt"])
    _compare(graph, result, ["out:0"], half_dtype)


def test_clear_and_infer_between_allow_ops_go_half(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        clr1 = tf.nn.relu(allow1, name="clr1")
        infer1 = tf.add(clr1, x, name="infer1")
        allow2 = tf.matmul(infer1, y, name="allow2")
        tf.identity(allow2, name="out")
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    for name in ("allow1", "clr1", "infer1", "allow2"):
        assert type_attr(gd, name) == half_dtype, name
    assert result.report.decisions["infer1"].reason == (
        "infer op between allow ops 'allow1' and 'allow2'")
    # x feeds allow1 and infer1: one shared Cast.
    assert added_casts(gd) == sorted([f"x-0-CastTo{tag}-TfMpt", f"y-0-CastTo{tag}-TfMpt",
                                      "allow2-0-CastToFp32-TfMpt"])
    _compare(graph, result, ["out:0"], half_dtype)


def test_infer_chain_following_allow_goes_half_but_not_past_a_deny_input(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        infer1 = tf.tanh(allow1, name="infer1")
        infer2 = tf.sigmoid(infer1, name="infer2")
        deny1 = tf.exp(x, name="deny1")
        infer3 = tf.add(infer2, deny1, name="infer3")
        tf.identity(infer2, name="out1")
        tf.identity(infer3, name="out2")
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert [type_attr(gd, n) for n in ("allow1", "infer1", "infer2", "infer3")] == [
        half_dtype, half_dtype, half_dtype, "float32"]
    assert result.report.decisions["infer2"].reason == "infer op follows allow op 'infer1'"
    assert result.report.decisions["infer3"].colour == "deny"
    assert added_casts(gd) == sorted([f"x-0-CastTo{tag}-TfMpt", f"y-0-CastTo{tag}-TfMpt",
                                      "infer2-0-CastToFp32-TfMpt"])
    # out1 and infer3 share the one CastToFp32 of infer2.
    assert inputs_of(gd, "infer3")[0] == "infer2-0-CastToFp32-TfMpt"
    _compare(graph, result, ["out1:0", "out2:0"], half_dtype)


def test_clear_ops_touching_allow_go_half_upstream_and_downstream(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        clr1 = tf.reshape(x, [8, 8], name="clr1")
        allow1 = tf.matmul(clr1, y, name="allow1")
        clr2 = tf.nn.relu(allow1, name="clr2")
        clr3 = tf.transpose(clr2, name="clr3")
        tf.identity(clr3, name="out")
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    for name in ("clr1", "allow1", "clr2", "clr3"):
        assert type_attr(gd, name) == half_dtype, name
    assert added_casts(gd) == sorted([f"x-0-CastTo{tag}-TfMpt", f"y-0-CastTo{tag}-TfMpt",
                                      "clr3-0-CastToFp32-TfMpt"])
    assert inputs_of(gd, "clr1")[0] == f"x-0-CastTo{tag}-TfMpt"
    _compare(graph, result, ["out:0"], half_dtype)


def test_fetched_allow_op_keeps_its_dtype(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        tf.matmul(allow1, y, name="allow2")
    result = rewrite(graph, half_dtype, fetches=["allow1:0", "allow2"])
    gd = result.graph_def
    assert type_attr(gd, "allow1") == "float32"
    assert type_attr(gd, "allow2") == "float32"
    assert result.report.decisions["allow1"].reason == "fetched: its outputs keep their dtype"
    assert added_casts(gd) == [] and not result.modified


def test_keep_fp32_scope_opts_nodes_out(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        with tf_mpt.keep_fp32("head"):
            allow1 = tf.matmul(x, y, name="allow1")
        allow2 = tf.matmul(allow1, y, name="allow2")
        tf.identity(allow2, name="out")
    gd = rewrite(graph, half_dtype).graph_def
    assert type_attr(gd, "head/allow1") == "float32"
    assert type_attr(gd, "allow2") == half_dtype
    node = {n.name: n for n in gd.node}["head/allow1"]
    assert node.attr["_tf_mpt_keep_fp32"].b


def test_missing_kernel_on_device_keeps_float32_and_says_so(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        with tf.device("/device:NOSUCHDEVICE:0"):
            allow1 = tf.matmul(x, y, name="allow1")
        tf.identity(allow1, name="out")
    result = rewrite(graph, half_dtype)
    assert type_attr(result.graph_def, "allow1") == "float32"
    assert result.report.decisions["allow1"].reason == (
        f"no {half_dtype} kernel for MatMul on NOSUCHDEVICE")
    assert added_casts(result.graph_def) == []


def test_unknown_op_stays_float32_and_gets_float32_inputs(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        tf.identity(allow1, name="out")
    graph_def = graph.as_graph_def()
    custom = graph_def.node.add(name="custom1", op="MyCustomOp", input=["allow1"])
    custom.attr["T"].type = tf.float32.as_datatype_enum
    result = tf_mpt.rewrite_graph_def(graph_def, dtype=half_dtype)
    gd = result.graph_def
    assert type_attr(gd, "allow1") == half_dtype
    assert inputs_of(gd, "custom1") == ["allow1-0-CastToFp32-TfMpt"]
    assert inputs_of(gd, "out") == ["allow1-0-CastToFp32-TfMpt"]
    assert result.report.decisions["custom1"].reason == (
        "unknown op MyCustomOp (not registered): kept float32")


def test_ref_variable_is_cast_after_its_read_and_gradients_return_to_float32(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        (x,) = _placeholders("x")
        w = tf1.get_variable("w", SHAPE, use_resource=False,
                             initializer=tf1.random_uniform_initializer(-1, 1, seed=1))
        allow1 = tf.matmul(x, w, name="allow1")
        loss = tf.reduce_sum(tf.square(allow1), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train")
        tf1.global_variables_initializer()
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert type_attr(gd, "w", "dtype") == "float32"
    assert type_attr(gd, "w/read") == "float32"
    assert inputs_of(gd, "allow1") == [f"x-0-CastTo{tag}-TfMpt", f"w/read-0-CastTo{tag}-TfMpt"]
    apply = [n for n in gd.node if n.op == "ApplyGradientDescent"][0]
    assert tf.as_dtype(apply.attr["T"].type) == tf.float32
    assert not any(n.op == "Cast" and n.input[0] == "w" for n in gd.node)
    feeds = {"x:0": random_feed(SHAPE)}
    graph_out = tf.Graph()
    with graph_out.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with tf1.Session(graph=graph_out) as sess:
        sess.run("init")
        before = sess.run("loss:0", feeds)
        for _ in range(3):
            sess.run(train.name, feeds)
        assert sess.run("loss:0", feeds) < before


def test_existing_casts_are_reused_in_both_directions(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        (y,) = _placeholders("y")
        xi = tf1.placeholder(tf.int32, SHAPE, name="xi")
        cast_in = tf.cast(xi, tf.float32, name="cast_in")
        allow1 = tf.matmul(cast_in, y, name="allow1")
        tf.cast(allow1, tf.int32, name="cast_out")
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert type_attr(gd, "cast_in", "DstT") == half_dtype
    assert type_attr(gd, "cast_out", "SrcT") == half_dtype
    assert added_casts(gd) == [f"y-0-CastTo{tag}-TfMpt"]
    feeds = {"xi:0": np.arange(64).reshape(8, 8) % 5, "y:0": random_feed(SHAPE)}
    np.testing.assert_allclose(run(gd, "cast_out:0", feeds),
                               run(graph.as_graph_def(), "cast_out:0", feeds),
                               **TOLERANCES[half_dtype])


def test_half_wanted_from_a_cast_to_float32_reads_the_half_tensor(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        h = tf1.placeholder(half_dtype, SHAPE, name="h")
        up = tf.cast(h, tf.float32, name="up")
        allow1 = tf.matmul(up, up, name="allow1")
        tf.identity(allow1, name="out")
        tf.identity(up, name="out_up")
    result = rewrite(graph, half_dtype)
    gd = result.graph_def
    assert inputs_of(gd, "allow1") == ["h", "h"]
    assert added_casts(gd) == ["allow1-0-CastToFp32-TfMpt"]


def test_constants_read_only_by_half_ops_are_stored_in_half(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        (x,) = _placeholders("x")
        w = tf.constant(random_feed(SHAPE, seed=3), name="w")
        allow1 = tf.matmul(x, w, name="allow1")
        tf.identity(allow1, name="out")
    result = rewrite(graph, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert type_attr(gd, "w", "dtype") == half_dtype
    assert added_casts(gd) == sorted([f"x-0-CastTo{tag}-TfMpt", "allow1-0-CastToFp32-TfMpt"])
    _compare(graph, result, ["out:0"], half_dtype, feeds_names=("x",))


def test_constants_float16_cannot_hold_keep_what_they_feed_float32(half_dtype):
    """x * 1e7 and x + 1e-10 after a half MatMul: in float16 the constants would be inf and
    0 (0 * inf = NaN downstream); they and the ops they feed stay float32. bfloat16 has
    float32's range: everything goes half."""
    graph = tf.Graph()
    with graph.as_default():
        (x,) = _placeholders("x")
        w = tf.constant(random_feed(SHAPE, seed=3), name="w")
        allow1 = tf.matmul(x, w, name="allow1")
        big = tf.multiply(allow1, 1e7, name="big")
        eps = tf.add(allow1, 1e-10, name="eps")
        fits = tf.multiply(allow1, 3.0, name="fits")
        tf.identity(big + eps + fits, name="out")
    result = rewrite(graph, half_dtype)
    gd = result.graph_def
    assert type_attr(gd, "allow1") == type_attr(gd, "fits") == half_dtype
    kept = "float32" if half_dtype == "float16" else half_dtype
    assert type_attr(gd, "big") == type_attr(gd, "eps") == kept
    assert type_attr(gd, "big/y", "dtype") == type_attr(gd, "eps/y", "dtype") == kept
    if half_dtype == "float16":
        decisions = result.report.decisions
        assert decisions["big/y"].reason == "constant 1e+07 overflows float16 (largest finite 65504)"
        assert decisions["eps/y"].reason == "constant 1e-10 rounds to 0 in float16"
    out = run(gd, "out:0", {"x:0": np.ones(SHAPE, np.float32)})
    assert np.all(np.isfinite(out))


def test_multi_input_and_multi_output_ops_are_painted_per_type_attr(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        parts = tf.split(allow1, 2, axis=1, name="split1")
        concat1 = tf.concat([parts[1], parts[0]], axis=1, name="concat1")
        addn1 = tf.add_n([concat1, allow1, concat1], name="addn1")
        ident = tf.identity_n([addn1, x], name="identn1")
        allow2 = tf.matmul(ident[0], y, name="allow2")
        tf.identity(allow2, name="out")
        tf.identity(ident[1], name="out_x")
    result = rewrite(graph, half_dtype)
    gd = result.graph_def
    for name in ("split1", "concat1", "addn1"):
        assert type_attr(gd, name) == half_dtype, name
    identn = {n.name: n for n in gd.node}["identn1"]
    types = [tf.as_dtype(t).name for t in identn.attr["T"].list.type]
    assert types == [half_dtype, "float32"]
    assert result.report.decisions["identn1"].attrs["T[1]"][0] == "fp32"
    _compare(graph, result, ["out:0", "out_x:0"], half_dtype)


def test_fused_batch_norm_runs_half_with_float32_statistics(half_dtype):
    graph = tf.Graph()
    with graph.as_default():
        x4 = tf1.placeholder(tf.float32, [2, 4, 4, 3], name="x4")
        k = tf1.placeholder(tf.float32, [3, 3, 3, 3], name="k")
        allow1 = tf.nn.conv2d(x4, k, 1, "SAME", name="allow1")
        scale, offset = tf.ones([3]), tf.zeros([3])
        bn, _, _ = tf1.nn.fused_batch_norm(allow1, scale, offset, name="infer1")
        tf.identity(bn, name="out")
    result = rewrite(graph, half_dtype)
    gd = result.graph_def
    bn_node = [n for n in gd.node if n.op == "FusedBatchNormV3"][0]
    assert tf.as_dtype(bn_node.attr["T"].type).name == half_dtype
    assert tf.as_dtype(bn_node.attr["U"].type).name == "float32"
    feeds = {"x4:0": random_feed([2, 4, 4, 3]), "k:0": random_feed([3, 3, 3, 3], seed=1)}
    np.testing.assert_allclose(run(gd, "out:0", feeds), run(graph.as_graph_def(), "out:0", feeds),
                               **TOLERANCES[half_dtype])


def test_float16_denies_sum_but_bfloat16_lets_it_follow_allow():
    graph = tf.Graph()
    with graph.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        tf.reduce_sum(allow1, axis=1, name="sum1")
    assert type_attr(rewrite(graph, "float16").graph_def, "sum1") == "float32"
    graph2 = tf.Graph()
    with graph2.as_default():
        x, y = _placeholders("x", "y")
        allow1 = tf.matmul(x, y, name="allow1")
        sum1 = tf.reduce_sum(allow1, axis=1, name="sum1")
        tf.identity(sum1, name="out")
    assert type_attr(rewrite(graph2, "bfloat16").graph_def, "sum1") == "bfloat16"


# --- the small side of a selection (word2vec's embedding_lookup) --------------------------------

VOCAB, EMBED, BATCH, HIDDEN = 900, 20, 16, 8


def _embedding_graph(batch=BATCH, tied=False):
    """ids -> embedding_lookup(table) -> MatMul (allow1) -> loss, trained by SGD; with `tied`
    the table is also the output layer's weight (a second half reader of the whole table)."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [batch], name="ids")
        table = tf1.get_variable("table", [VOCAB, EMBED], use_resource=False,
                                 initializer=tf1.random_uniform_initializer(-1.0, 1.0, seed=1))
        w = tf1.get_variable("w", [EMBED, HIDDEN], use_resource=False,
                             initializer=tf1.random_uniform_initializer(-1.0, 1.0, seed=2))
        rows = tf.nn.embedding_lookup(table, ids, name="lookup")
        hidden = tf.matmul(rows, w, name="allow1")
        if tied:
            hidden = tf.matmul(tf.matmul(hidden, w, transpose_b=True), table,
                               transpose_b=True, name="allow2")
        loss = tf.reduce_mean(tf.square(hidden), name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        tf1.global_variables_initializer()
    return graph


def _cast_sources(graph_def):
    nodes = {n.name: n for n in graph_def.node}
    return sorted(nodes[c].input[0] for c in added_casts(graph_def))


# The gather passes under test take no_cost_model (conftest): the cost model keeps this
# 900x20 embedding and its 16-row batch float32 on a CPU.


def test_gather_casts_its_rows_not_the_whole_table(half_dtype, no_cost_model):
    graph = _embedding_graph()
    graph_def = graph.as_graph_def(add_shapes=True)  # static shapes: 900x20 table, 16 rows
    result = tf_mpt.rewrite_graph_def(graph_def, dtype=half_dtype, fetches=["loss", "train"])
    sources = _cast_sources(result.graph_def)
    assert "lookup" in sources and "table/read" not in sources, sources
    assert type_attr(result.graph_def, "lookup", "Tparams") == "float32"
    assert type_attr(result.graph_def, "allow1") == half_dtype
    decision = result.report.decisions["lookup"]
    assert "selects 320 of 18000 elements" in str(decision)
    # the same through rewrite_graph, whose shapes come from the tf.Graph
    mixed = tf_mpt.rewrite_graph(graph, dtype=half_dtype, fetches=["loss", "train"])
    casts = [op.inputs[0].op.name for op in mixed.get_operations()
             if op.type == "Cast" and op.name.endswith("-TfMpt")]
    assert "lookup" in casts and "table/read" not in casts
    feeds = {"ids:0": np.random.RandomState(0).randint(0, VOCAB, BATCH)}
    expected = run(graph_def, "loss:0", feeds, init="init")
    actual = run(result.graph_def, "loss:0", feeds, init="init")
    np.testing.assert_allclose(actual, expected, **TOLERANCES[half_dtype])


def test_gather_stays_half_when_the_table_is_cast_anyway(half_dtype, no_cost_model):
    graph_def = _embedding_graph(tied=True).as_graph_def(add_shapes=True)
    result = tf_mpt.rewrite_graph_def(graph_def, dtype=half_dtype, fetches=["loss", "train"])
    sources = _cast_sources(result.graph_def)
    assert "table/read" in sources and "lookup" not in sources, sources
    assert type_attr(result.graph_def, "lookup", "Tparams") == half_dtype


def test_gather_with_unknown_shapes_is_left_as_painted(half_dtype, no_cost_model):
    graph_def = _embedding_graph(batch=None).as_graph_def(add_shapes=True)
    result = tf_mpt.rewrite_graph_def(graph_def, dtype=half_dtype, fetches=["loss", "train"])
    assert "table/read" in _cast_sources(result.graph_def)
    assert type_attr(result.graph_def, "lookup", "Tparams") == half_dtype


def test_a_nodes_vertices_come_in_port_order_whatever_the_hash_seed():
    """Vertices are numbered in the order of a node's type keys; from a set they followed
    PYTHONHASHSEED, so which of two tied attrs gave a node's reason (and the order the cuts
    saw their regions in) changed from run to run."""
    from tf_mpt.rewrite import type_attrs as ta  # pylint: disable=import-outside-toplevel
    graph = tf.Graph()
    with graph.as_default():
        xs = [tf1.placeholder(tf.float32, [2], name=f"x{k}") for k in range(8)]
        tf.raw_ops.IdentityN(input=xs, name="ids")
    node = next(n for n in graph.as_graph_def().node if n.name == "ids")
    assert list(ta.node_types(node, {}).dtypes) == [("T", k) for k in range(8)]
