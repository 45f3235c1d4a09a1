"""TensorArray v3 element dtypes: one array, one dtype, half where it saves Casts."""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from support.tolerances import TOLERANCES
from support.helpers import run

tf1 = tf.compat.v1
_ARRAY_ATTRS = {"TensorArrayV3": "dtype", "TensorArrayWriteV3": "T", "TensorArrayScatterV3": "T",
                "TensorArraySplitV3": "T", "TensorArrayReadV3": "dtype",
                "TensorArrayGatherV3": "dtype", "TensorArrayConcatV3": "dtype"}


def _array_dtypes(graph_def):
    return {n.name: n.attr[_ARRAY_ATTRS[n.op]].type for n in graph_def.node
            if n.op in _ARRAY_ATTRS}


def test_lstm_output_array_is_stored_in_half_with_its_gradient(half_dtype):
    from support import lstm
    graph = lstm.build_v1_graph()
    fetches = ["loss", "grad0", "grad1", "grad2", "init"]
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype, fetches=fetches)
    gd = result.graph_def
    half = tf.as_dtype(half_dtype).as_datatype_enum
    dtypes = _array_dtypes(gd)
    # Declaration, the write in the loop, the stack, and the gradient array's scatter and read.
    assert len(dtypes) == 5 and set(dtypes.values()) == {half}, dtypes
    nodes = {n.name: n for n in gd.node}
    write = [n for n in gd.node if n.op == "TensorArrayWriteV3"][0]
    assert nodes[write.input[2].split(":")[0]].op != "Cast"  # no Cast per loop step
    decision = result.report.decisions["TensorArray"]
    assert decision.converted and "stored in half" in decision.reason
    feeds = {"xs:0": lstm.inputs()}
    names = [f"{f}:0" for f in fetches[:-1]]
    expected = run(graph.as_graph_def(), names, feeds, init="init")
    actual = run(gd, names, feeds, init="init")
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype == np.float32
        np.testing.assert_allclose(a, e, **TOLERANCES[half_dtype])


def _loop_writing(value, reader):
    """A v1 loop h <- tanh(h @ w) writing value(h) per step to a TensorArray; `reader` maps
    the stacked array to the output 'y'."""
    tf1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [4, 8], name="x")
            w = tf.constant(np.random.RandomState(0).uniform(-0.5, 0.5, (8, 8)).astype(np.float32))

            def body(t, h, ta):
                h = tf.tanh(tf.matmul(h, w))
                return t + 1, h, ta.write(t, value(h))

            _, _, ta = tf1.while_loop(lambda t, *_: t < 3, body,
                                      [tf.constant(0), x, tf.TensorArray(tf.float32, size=3)])
            tf.identity(reader(ta.stack()), name="y")
    finally:
        tf1.enable_control_flow_v2()
    return graph


def _check_numbers(graph, result, dtype):
    x = np.random.RandomState(1).uniform(-1, 1, (4, 8)).astype(np.float32)
    expected = run(graph.as_graph_def(), ["y:0"], {"x:0": x})[0]
    actual = run(result.graph_def, ["y:0"], {"x:0": x})[0]
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, **TOLERANCES[dtype])


def _exp(t):
    return tf.math.exp(-tf.abs(t))  # Exp: a deny op for both half types


def test_float32_values_read_by_float32_ops_stay_float32(half_dtype):
    graph = _loop_writing(_exp, _exp)
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype, fetches=["y"])
    assert set(_array_dtypes(result.graph_def).values()) == {tf.float32.as_datatype_enum}
    _check_numbers(graph, result, half_dtype)


def test_half_values_are_stored_in_half_even_when_a_deny_op_reads_them(half_dtype):
    # tanh(h @ w) is computed in half: half storage rounds nothing, and the Cast to float32
    # moves from every loop step to the one read after the loop.
    graph = _loop_writing(lambda h: h, _exp)
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype, fetches=["y"])
    assert set(_array_dtypes(result.graph_def).values()) == {
        tf.as_dtype(half_dtype).as_datatype_enum}
    _check_numbers(graph, result, half_dtype)


def test_array_written_in_half_and_read_by_a_half_op_is_half(half_dtype):
    w2 = np.random.RandomState(2).uniform(-0.5, 0.5, (8, 2)).astype(np.float32)
    graph = _loop_writing(lambda h: h, lambda s: tf.matmul(tf.reshape(s, [12, 8]), w2))
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype, fetches=["y"])
    half = tf.as_dtype(half_dtype).as_datatype_enum
    assert set(_array_dtypes(result.graph_def).values()) == {half}
    # Casts: x in, y out; the weights are half constants; none at the array.
    casts = sorted(n.name for n in result.graph_def.node if n.op == "Cast")
    assert len(casts) == 2, casts
    _check_numbers(graph, result, half_dtype)


def test_lstm_gradient_stacks_hold_half_values_without_casts_per_step(half_dtype):
    """The v1 gradient keeps forward values in Stacks (pushed in the forward loop, popped in the
    gradient loop): half values go in and come out as they are."""
    from support import lstm
    graph = lstm.build_v1_graph()
    gd = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype,
                                  fetches=["loss", "grad0", "grad1", "grad2", "init"]).graph_def
    nodes = {n.name: n for n in gd.node}
    half = tf.as_dtype(half_dtype).as_datatype_enum
    pushes = [n for n in gd.node if n.op == "StackPushV2"]
    pops = [n for n in gd.node if n.op == "StackPopV2"]
    assert sum(n.attr["T"].type == half for n in pushes) == 8
    for push in pushes:
        assert nodes[push.input[1].split(":")[0]].op != "Cast", push.name
    for pop in pops:
        readers = [n for n in gd.node if any(i.split(":")[0] == pop.name for i in n.input)]
        assert not any(r.op == "Cast" for r in readers), pop.name
    # Left: the three weight reads, the input, the loss gradient in, the array stack and three
    # gradient accumulations out.
    assert len([n for n in gd.node if n.op == "Cast"]) == 9


@pytest.mark.parametrize("nested", [False, True], ids=["main_graph", "in_a_called_function"])
def test_tf2_lstm_gradient_accumulators_are_half_tensor_lists(half_dtype, nested):
    """while_v2 keeps the forward values its gradient needs in TensorLists (pushed in the
    forward body, popped in the gradient body, made in the graph that runs the loops, here the
    main graph or a function it calls): lists of half values are switched to half as a whole,
    so no value is cast to float32 before its push."""
    from support import lstm
    cf, _ = lstm.tf2_loss_and_grads(nested=nested)
    result = tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=half_dtype,
                                      fetches=[t.op.name for t in cf.outputs])
    half = tf.as_dtype(half_dtype).as_datatype_enum
    # 10 lists of values the forward body computes in half, and the accumulator of c, which
    # the forward loop carries in half (its push reads a Cast of it back to float32 until the
    # list is half too)
    assert result.report.tensor_lists_kept_half == 11
    gd = result.graph_def
    nodes = list(gd.node) + [n for f in gd.library.function for n in f.node_def]
    list_ops = [n for n in nodes if n.op.startswith(("TensorList", "EmptyTensorList"))
                and "element_dtype" in n.attr]
    assert sum(n.attr["element_dtype"].type == half for n in list_ops) >= 3 * 11
    for fdef in gd.library.function:
        nodes = {n.name: n for n in fdef.node_def}
        for push in (n for n in fdef.node_def if n.op == "TensorListPushBack"):
            producer = nodes.get(push.input[1].split(":")[0])
            if push.attr["element_dtype"].type == half:
                assert producer is None or producer.op != "Cast" or \
                    producer.attr["SrcT"].type == tf.float32.as_datatype_enum, push.name
    # Run forward and gradient: a list whose ops disagreed would fail at run time.
    xs = lstm.inputs()
    loss32, grads32 = cf(xs)
    loss, grads = tf_mpt.rewrite_function(cf, dtype=half_dtype)(xs)
    np.testing.assert_allclose(loss, loss32, **TOLERANCES[half_dtype])
    for g, g32 in zip(grads, grads32):
        assert g.dtype == tf.float32
        np.testing.assert_allclose(g, g32, **TOLERANCES[half_dtype])


def _array_groups_agree(graph_def):
    """Every TensorArray op's dtype equals its array's declaration (handle traced back)."""
    nodes = {n.name: n for n in graph_def.node}

    def source(node):
        while node.op not in ("TensorArrayV3",):
            node = nodes[node.input[0].split(":")[0].lstrip("^")]
            if node.op in ("TensorArrayGradV3",):
                node = nodes[node.input[0].split(":")[0]]
        return node

    for node in graph_def.node:
        if node.op in _ARRAY_ATTRS and node.op != "TensorArrayV3":
            declared = source(node).attr["dtype"].type
            assert node.attr[_ARRAY_ATTRS[node.op]].type == declared, node.name


def test_unstacked_inputs_with_static_shapes_and_the_cost_model(half_dtype, monkeypatch):
    """Regression: with static shapes (rewrite_graph) the cost model put the cluster of an
    array's scatter back to float32 after the array had gone half (the Cast of the 4x64x512
    inputs costs more than the model's noise floor, so it acted)."""
    monkeypatch.setenv("TF_MPT_TARGET", "here")
    tf1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            xs = tf1.placeholder(tf.float32, [3, 64, 512], name="xs")
            w = tf.constant(np.random.RandomState(0).uniform(-0.05, 0.05, (512, 512)).astype(np.float32))
            inputs = tf.TensorArray(tf.float32, size=3).unstack(xs)

            def body(t, h, out):
                h = tf.tanh(tf.matmul(inputs.read(t) + h, w))
                return t + 1, h, out.write(t, h)

            _, _, out = tf1.while_loop(lambda t, *_: t < 3, body,
                                       [tf.constant(0), tf.zeros([64, 512]),
                                        tf.TensorArray(tf.float32, size=3)])
            tf.reduce_mean(out.stack(), axis=2, name="y")
    finally:
        tf1.enable_control_flow_v2()
    rewritten = tf_mpt.rewrite_graph(graph, dtype=half_dtype, fetches=["y"])
    _array_groups_agree(rewritten.as_graph_def())
    x = np.random.RandomState(1).uniform(-1, 1, (3, 64, 512)).astype(np.float32)
    expected = run(graph.as_graph_def(), ["y:0"], {"xs:0": x})[0]
    actual = run(rewritten.as_graph_def(), ["y:0"], {"xs:0": x})[0]
    np.testing.assert_allclose(actual, expected, **TOLERANCES[half_dtype])
