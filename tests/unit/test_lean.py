"""The lean graph (tf_mpt/rewrite/lean.py, issue "memory" item 2): a half Cast of a held
value made at each use after the use's other input; weight gradients' products ordered. The
structure is checked exactly, and the lean graph computes the same numbers as the graph it
came from (the same ops, only control edges and Cast copies added)."""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.rewrite import lean
from tf_mpt.rewrite.graph_view import GraphView

tf1 = tf.compat.v1
BATCH, WIDTH = 8, 16
SAME = dict(rtol=0, atol=0)  # the same kernels on the same inputs: bit for bit


def _training_graph(layers, control_flow_v1=False):
    """x [BATCH, WIDTH] -> layers(x) -> mean as 'loss'; SGD on it ('train'), the variables'
    initializer ('init'); built with control flow v1 where asked (restored to v2 after).
    Returns the GraphDef and its fetches."""
    graph = tf.Graph()
    if control_flow_v1:
        tf1.disable_control_flow_v2()
    try:
        with graph.as_default():
            tf1.set_random_seed(0)
            h = layers(tf1.placeholder(tf.float32, [BATCH, WIDTH], name="x"))
            loss = tf.reduce_mean(h, name="loss")
            tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
            tf1.variables_initializer(tf1.global_variables(), name="init")
    finally:
        if control_flow_v1:
            tf1.enable_control_flow_v2()
    return graph.as_graph_def(), ["loss", "train", "init"]


def _weight():
    return tf1.get_variable("w", [WIDTH, WIDTH], use_resource=True)


def _training_mlp(depth=2):
    """x -> depth x (MatMul with a resource variable, Relu) -> mean; SGD on it."""
    def layers(h):
        for k in range(depth):
            w = tf1.get_variable(f"w{k}", [WIDTH, WIDTH], use_resource=True)
            h = tf.nn.relu(tf.matmul(h, w, name=f"matmul_{k}"))
        return h
    return _training_graph(layers)


def _half(graph_def, fetches):
    return tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=fetches,
                                    target="rules").graph_def


def _run(graph_def, fetch, feeds, steps=2):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as session:
        session.run("init")
        values = []
        for _ in range(steps):
            values.append(session.run([f"{fetch}:0", "train"], feeds)[0])
    return values


def _casts_of(graph_def, source):
    return [n for n in graph_def.node if n.op == "Cast" and n.input[0] == source]


def test_a_weights_half_cast_is_made_at_each_use_after_the_other_input():
    """Each weight's read feeds a forward MatMul and the backward MatMul for the input's
    gradient: one Cast each, waiting for that product's other input (the activation; the
    incoming gradient). The first layer's input is fed: both operands are held, nothing to
    wait for."""
    graph_def, fetches = _training_mlp()
    half = _half(graph_def, fetches)
    original = half.SerializeToString()
    out, moved = lean.late_casts(half)
    assert half.SerializeToString() == original  # the input is not changed
    view = GraphView(out)
    stem = "matmul_1/ReadVariableOp-0-CastToBf16"
    assert [n.name for n in half.node if n.name.startswith(stem)] == [stem + "-TfMpt"]
    casts = [n for n in out.node if n.name.startswith(stem)]
    assert len(casts) == 2 and all(c.input[0] == "matmul_1/ReadVariableOp" for c in casts)
    for cast in casts:
        [(consumer, port)] = view.fanout_of(view.index[cast.name])[0]
        other = [view.nodes[s].name for k, (s, _) in enumerate(view.fanin[consumer])
                 if k != port]
        assert [i for i in cast.input if i.startswith("^")] == [f"^{other[0]}"]
    assert moved >= 2


def test_the_lean_graph_computes_what_the_candidate_does():
    """Two SGD steps of the lean graph and of the graph it came from: the same losses, bit for
    bit; and both within a named tolerance of float32's."""
    graph_def, fetches = _training_mlp()
    half = _half(graph_def, fetches)
    lean_graph, changes = lean.lean(half)
    assert changes["late casts"] >= 2 and changes["ordered products"] >= 1
    feeds = {"x:0": np.random.RandomState(0).standard_normal((BATCH, WIDTH)).astype(
        np.float32)}
    got = _run(lean_graph, "loss", feeds)
    np.testing.assert_allclose(got, _run(half, "loss", feeds), **SAME)
    np.testing.assert_allclose(got, _run(graph_def, "loss", feeds), rtol=0.05, atol=0.02)


def test_a_weight_gradient_waits_for_the_input_gradient_and_the_previous_weight_gradient():
    """The products read only as float32 (each weight's gradient, cast for the float32
    optimizer) wait for the products reading the same incoming gradient (the gradient for
    the layer's input) and for the previous weight gradient's Cast to float32."""
    graph_def, fetches = _training_mlp(depth=3)
    half = _half(graph_def, fetches)
    out, ordered = lean.ordered_products(half)
    by_name = {n.name: n for n in out.node}
    gradients = sorted(n.name for n in out.node if n.op == "MatMul" and
                       n.name.endswith("_grad/MatMul_1"))
    assert gradients == [f"gradients/matmul_{k}_grad/MatMul_1" for k in range(3)]
    assert ordered == 3
    for k in (1, 2):  # the layers whose input gradient is computed
        control = [i for i in by_name[f"gradients/matmul_{k}_grad/MatMul_1"].input
                   if i.startswith("^")]
        assert f"^gradients/matmul_{k}_grad/MatMul" in control, control
    # the first layer's weight gradient (computed last) waits for the second's Cast
    control = [i for i in by_name["gradients/matmul_0_grad/MatMul_1"].input
               if i.startswith("^")]
    assert any(i.startswith("^gradients/matmul_1_grad/") and i.endswith("CastToFp32-TfMpt")
               for i in control), control


def test_a_loops_weight_cast_waits_for_each_iterations_other_input():
    """In a control-flow-v1 while loop (the weight read in the body and, for the gradient,
    popped from a stack each iteration), each Cast of the weight waits for its product's
    other input of the same iteration; the lean graph's gradients equal the candidate's."""
    def loop(x):
        w = _weight()
        _, h = tf1.while_loop(lambda t, h: t < 4, lambda t, h: (t + 1, tf.tanh(tf.matmul(h, w))),
                              [tf.constant(0), x], name="rnn")
        return h
    half = _half(*_training_graph(loop, control_flow_v1=True))
    out, moved = lean.late_casts(half)
    waiting = [n for n in out.node if n.op == "Cast" and n.name.startswith(
        ("rnn/", "gradients/rnn/")) and any(i.startswith("^") for i in n.input)]
    assert moved >= 2 and len(waiting) >= 2, [n.name for n in waiting]
    feeds = {"x:0": np.random.RandomState(1).standard_normal((BATCH, WIDTH)).astype(
        np.float32)}
    np.testing.assert_allclose(_run(out, "loss", feeds, 3), _run(half, "loss", feeds, 3),
                               **SAME)


@pytest.mark.parametrize("change", [lean.late_casts, lean.ordered_products])
def test_a_graph_with_nothing_to_change_is_returned_as_it_is(change):
    graph = tf.Graph()
    with graph.as_default():
        tf.identity(tf1.placeholder(tf.float32, [2], name="x") * 2.0, name="y")
    graph_def = graph.as_graph_def()
    assert change(graph_def) == (graph_def, 0)


def test_float32_products_compute_each_weight_gradient_in_float32():
    """The leaner change: each weight gradient's product (read only through Casts to float32)
    computes in float32 on the float32 tensors the candidate cast from; its Casts become
    Identities of the same names; the forward products stay half. Its losses are within a
    named tolerance of the candidate's (float32 sums instead of bfloat16 ones)."""
    graph_def, fetches = _training_mlp()
    half = _half(graph_def, fetches)
    out, changed = lean.float32_products(half)
    assert changed == 2
    by_name = {n.name: n for n in out.node}
    for k in range(2):
        product = by_name[f"gradients/matmul_{k}_grad/MatMul_1"]
        assert product.attr["T"].type == tf.float32.as_datatype_enum
        assert by_name[f"matmul_{k}"].attr["T"].type == tf.bfloat16.as_datatype_enum
        for name in product.input:
            source = by_name[name.split(":")[0]]
            assert not (source.op == "Cast" and
                        source.attr["DstT"].type == tf.bfloat16.as_datatype_enum), name
        cast = f"gradients/matmul_{k}_grad/tuple/control_dependency_1-0-CastToFp32-TfMpt"
        assert [n.op for n in half.node if n.name == cast] == ["Cast"]
        assert by_name[cast].op == "Identity" and by_name[cast].attr["T"].type == \
            tf.float32.as_datatype_enum
    feeds = {"x:0": np.random.RandomState(0).standard_normal((BATCH, WIDTH)).astype(
        np.float32)}
    np.testing.assert_allclose(_run(out, "loss", feeds, 3), _run(half, "loss", feeds, 3),
                               rtol=0.02, atol=0.005)


def test_the_leaner_version_is_tried_where_the_lean_one_still_holds_too_much(
        monkeypatch, tmp_path):
    """Graph timing (an injected clock and sandbox): every half candidate holds 20% more than
    float32, the lean version 10% more, the leaner one (weight gradients in float32) as much
    as float32; the leaner one is kept, faster than float32, and a cached verdict makes it
    again."""
    from support import fake_timing  # pylint: disable=import-outside-toplevel
    from tf_mpt.rewrite import graph_timing  # pylint: disable=import-outside-toplevel
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "5")
    monkeypatch.setenv("TF_MPT_CACHE_DIR", str(tmp_path))
    fakes = fake_timing.install(monkeypatch)
    bf16, fp32 = tf.bfloat16.as_datatype_enum, tf.float32.as_datatype_enum

    def kind(g):
        matmuls = [n for n in g.node if n.op == "MatMul"]
        if not any(n.attr["T"].type == bf16 for n in matmuls):
            return "float32"
        if any(n.attr["T"].type == fp32 and n.name.endswith("_grad/MatMul_1")
               for n in matmuls):
            return "leaner"
        return "lean" if any(n.op == "Cast" and any(i.startswith("^") for i in n.input)
                             for n in g.node) else "half"
    fakes.cost = lambda g, i: {"float32": 1e-3, "half": 0.5e-3, "lean": 0.55e-3,
                               "leaner": 0.7e-3}[kind(g)]
    fakes.peak = lambda g: {"float32": 10 << 20, "half": 12 << 20, "lean": 11 << 20,
                            "leaner": 10 << 20}[kind(g)]
    graph_def, fetches = _training_mlp()

    def rewrite():
        return tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=fetches,
                                        target="here")
    result = rewrite()
    verdict = result.report.verdict
    assert verdict.pick == graph_timing.LEAN, verdict.describe()
    assert verdict.lean_changes["float32 products"] == 2, verdict.lean_changes
    assert kind(result.graph_def) == "leaner"
    assert "picked lean, 1.43x float32" in verdict.describe(), verdict.describe()
    again = rewrite()
    assert again.report.verdict.source == "cached" and again.graph_def == result.graph_def


def test_no_product_is_ordered_in_a_graph_with_tf1_control_flow(monkeypatch):
    """A tf.cond (control flow v1) in the graph: no ordering edge is added, since a product
    waiting for one under the other branch would be dead where it ran before."""
    def branch(x):
        h = tf.nn.relu(tf.matmul(x, _weight()))
        return tf1.cond(tf.reduce_sum(x) > 0, lambda: h * 2.0, lambda: h)
    half = _half(*_training_graph(branch, control_flow_v1=True))
    assert any(n.op == "Switch" for n in half.node)
    assert any(n.op == "MatMul" and n.attr["T"].type == tf.bfloat16.as_datatype_enum
               for n in half.node)
    assert lean.ordered_products(half) == (half, 0)
    monkeypatch.setattr(lean, "_SWITCHES", frozenset())  # (without the rule: ordered)
    assert lean.ordered_products(half)[1] >= 1
