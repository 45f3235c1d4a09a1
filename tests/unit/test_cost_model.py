"""The cost model (TF_MPT_COST_MODEL): tiny layers stay float32, big ones go half, the report
gives the measured times, and the model acts only with static shapes, above its noise floor,
and where it is switched on. The kernel times are the injected Zen 4 table (conftest)."""

import json
import logging
import os

import numpy as np
import re

import pytest
import tensorflow as tf

import tf_mpt
import tf_mpt.targets
from tf_mpt import rewrite as _rewrite
from tf_mpt.costs import op_costs as _op_costs
from tf_mpt.rewrite.paint import shapes as _shapes
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
    def set_to(value):  # (the cost model on, "1": target here; off, "0": target rules)
        if value is None:
            monkeypatch.delenv(_config.TF_MPT_TARGET, raising=False)
        else:
            monkeypatch.setenv(_config.TF_MPT_TARGET, {"0": "rules", "1": "here"}[value])
    return set_to


def test_many_tiny_layers_stay_float32_in_bfloat16_by_default(cost_model):
    cost_model(None)
    rewritten = tf_mpt.rewrite_graph(_layers(16, 16, 30), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.float32}
    assert not [op for op in rewritten.get_operations() if op.type == "Cast"]
    cost_model("0")
    rewritten = tf_mpt.rewrite_graph(_layers(16, 16, 30), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.bfloat16}  # Grappler's name-based decision


def test_report_gives_the_measured_numbers(cost_model):
    cost_model(None)
    graph = _layers(16, 16, 30)
    graph_def = graph.as_graph_def(add_shapes=True)  # shapes travel in `_output_shapes`
    report = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=["y"]).report
    costs = _op_costs.costs_for(_config.Config.from_env(os.environ), "bfloat16")
    flops = 2 * 16 * 16 * 16
    ratio = costs.time("MatMul", flops, True) / costs.time("MatMul", flops, False)
    decision = report.decisions["matmul_3"]
    assert decision.colour == "fp32" and not decision.converted
    assert decision.reason.startswith(
        f"cost model: float32 here (bfloat16 MatMul over {flops / 1e6:.2g} MFLOP measured "
        f"{ratio:.2f}x slower than float32 in op_costs_zen4.json; the region of 3 op(s) then "
        "runs ~")
    assert report.summary() == ("Converted 0/182 nodes to bfloat16 using 0 cast(s) for target "
                                "op_costs_zen4.json; 90 kept float32 by the cost model "
                                "(bfloat16 would be slower on the target, Casts included); "
                                "the cost model weighed 182/182 nodes")


def _sigmoid_between_matmuls(fused=False, swish=False, rows=16384, n=64):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [rows, n], name="x")
        w1 = tf.constant(np.eye(n, dtype=np.float32), name="w1")
        w2 = tf.constant(np.eye(n, dtype=np.float32), name="w2")
        h = tf.matmul(x, w1, name="mm1")
        if fused:
            h = tf.nn.bias_add(h, tf.constant(np.zeros(n, np.float32)), name="bias")
        s = h * tf.sigmoid(h, name="sig") if swish else tf.sigmoid(h, name="sig")
        tf.identity(tf.matmul(s, w2, name="mm2"), name="out")
    return graph.as_graph_def(add_shapes=True)


def _casts(graph_def):
    return sorted(n.name for n in graph_def.node if n.op == "Cast")


def test_a_half_kernel_that_loses_more_than_its_casts_cost_runs_float32(cost_model):
    """[16384x64] Sigmoid between two MatMuls by [64x64]: bfloat16 Sigmoid is ~3x slower
    than float32's in the Zen 4 table, which costs more than the two Casts around a float32
    Sigmoid (and more than the relative floor: the MatMuls are no 100x bigger)."""
    cost_model(None)
    result = tf_mpt.rewrite_graph_def(_sigmoid_between_matmuls(), dtype="bfloat16",
                                      fetches=["out"], strict=True)
    assert _casts(result.graph_def) == ["mm1-0-CastToFp32-TfMpt", "mm2-0-CastToFp32-TfMpt",
                                        "sig-0-CastToBf16-TfMpt", "x-0-CastToBf16-TfMpt"]
    costs = _op_costs.costs_for(_config.Config.from_env(os.environ), "bfloat16")
    n = 16384 * 64
    ratio = costs.time("Sigmoid", n, True) / costs.time("Sigmoid", n, False)
    assert result.report.decisions["sig"].reason.startswith(
        f"cost model: float32 here (bfloat16 Sigmoid over {n} elements measured {ratio:.2f}x "
        "slower than float32 in op_costs_zen4.json; the region of 3 op(s) then runs ~")
    assert result.report.decisions["mm1"].converted and result.report.decisions["mm2"].converted
    wide = tf_mpt.rewrite_graph_def(_sigmoid_between_matmuls(rows=1024, n=1024),
                                    dtype="bfloat16", fetches=["out"], strict=True)
    # [1024x1024]: the Sigmoid would save ~0.3 ms of ~42 ms of float32 kernels, under the
    # 2% the model's kernel times are trusted to: the rules' colours stay (0 Casts around it)
    assert _casts(wide.graph_def) == ["mm2-0-CastToFp32-TfMpt", "x-0-CastToBf16-TfMpt"]
    assert wide.report.decisions["sig"].converted


@pytest.mark.parametrize("fused, swish", [(True, False), (False, True)])
def test_an_op_fused_into_the_kernel_before_it_stays_half(cost_model, fused, swish):
    """MatMul -> BiasAdd -> Sigmoid and x * sigmoid(x) run as one kernel (TensorFlow's
    remapper) in both dtypes: no reason to cast around them."""
    cost_model(None)
    result = tf_mpt.rewrite_graph_def(_sigmoid_between_matmuls(fused, swish), dtype="bfloat16",
                                      fetches=["out"], strict=True)
    assert _casts(result.graph_def) == ["mm2-0-CastToFp32-TfMpt", "x-0-CastToBf16-TfMpt"]
    assert result.report.decisions["sig"].converted


def _loop(batch, width):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, width], name="x")
        w = tf.constant(np.eye(width, dtype=np.float32) * 0.5, name="w")
        _, h = tf.while_loop(lambda i, h: i < 30, lambda i, h: (
            i + 1, tf.tanh(tf.sigmoid(tf.matmul(h, w, name="mm")))), [0, x])
        tf.identity(h, name="out")
    return graph


_WEIGHED = "cost model: float32 here (bfloat16 MatMul over 1 MFLOP measured"


def _body_matmul_decisions(result):
    return [d for name, d in result.report.decisions.items() if name.endswith("/mm")]


def test_a_loop_body_is_weighed_at_its_shapes_without_a_noise_floor(cost_model):
    """A while_v2 body has no static shapes of its own: they come from the While's inputs.
    Per iteration the body saves less than the 50 us floor, but it runs every iteration."""
    cost_model(None)
    graph_def = _loop(32, 128).as_graph_def(add_shapes=True)
    result = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=["out"],
                                      strict=True)
    body_mm = _body_matmul_decisions(result)
    assert len(body_mm) == 1 and not body_mm[0].converted
    assert body_mm[0].reason.startswith(_WEIGHED)
    assert _casts(result.graph_def) == []
    cost_model("0")
    result = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=["out"],
                                      strict=True)
    assert [d.converted for d in _body_matmul_decisions(result)] == [True]


@pytest.mark.parametrize("where", ["tf1_graph", "tf_function"])
def test_a_loop_body_reading_a_variable_is_weighed_at_the_variables_shape(cost_model, where):
    """The body gets a resource handle, a scalar: the shape of what it reads comes from the
    variable. A TF1 graph's body carries it in `_output_shapes`; a tf.function's does not,
    and its captured variable's handle data gives it (before, the body was left to the op
    lists: Keras 3's LSTM reads its kernels that way in every time step)."""
    cost_model(None)
    start = np.eye(128, dtype=np.float32) * 0.5

    def body(i, h, w):
        return i + 1, tf.tanh(tf.sigmoid(tf.matmul(h, w, name="mm")))

    if where == "tf1_graph":
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [32, 128], name="x")
            w = tf.compat.v1.get_variable("w", initializer=start, use_resource=True)
            _, h = tf.while_loop(lambda i, h: i < 30, lambda i, h: body(i, h, w), [0, x])
            tf.identity(h, name="out")
        graph_def, fetches = graph.as_graph_def(add_shapes=True), ["out"]
        shapes = None
        assert "VarHandleOp" in {n.op for n in graph_def.node}
    else:
        w = tf.Variable(start)

        @tf.function
        def step(x):
            return tf.while_loop(lambda i, h: i < 30, lambda i, h: body(i, h, w), [0, x])[1]

        concrete = step.get_concrete_function(tf.TensorSpec([32, 128], tf.float32))
        graph_def = concrete.graph.as_graph_def()
        fetches = [concrete.outputs[0].op.name] + [t.op.name for t in concrete.inputs]
        shapes = lambda: _shapes.shapes_of_graph(concrete.graph)  # noqa: E731 (as tf_mpt.function)
    result = _rewrite.rewrite_with_library(graph_def, dtype="bfloat16", fetches=fetches,
                                           lists=None, strict=True, shapes=shapes,
                                           config=_config.Config.from_env(os.environ))
    (matmul,) = _body_matmul_decisions(result)
    assert not matmul.converted and matmul.reason.startswith(_WEIGHED), matmul.reason
    assert _casts(result.graph_def) == []
    cost_model("0")
    result = _rewrite.rewrite_with_library(graph_def, dtype="bfloat16", fetches=fetches,
                                           lists=None, strict=True, shapes=shapes,
                                           config=_config.Config.from_env(os.environ))
    assert [d.converted for d in _body_matmul_decisions(result)] == [True]


def test_tf_keras_lstm_loop_inside_its_selected_implementation_is_weighed(cost_model):
    """tf_keras runs its LSTM's loop inside standard_lstm, a function the graph reaches
    through gpu_lstm_with_fallback and TensorFlow's implementation selector: the cost model
    weighs that loop body too (its bfloat16 Sigmoids stay float32)."""
    tf_keras = pytest.importorskip("tf_keras")
    cost_model(None)
    tf_keras.utils.set_random_seed(0)
    tokens = tf_keras.Input((64,), dtype="int32")
    hidden = tf_keras.layers.LSTM(256)(tf_keras.layers.Embedding(8000, 128)(tokens))
    model = tf_keras.Model(tokens, tf_keras.layers.Dense(10)(hidden))
    concrete = tf.function(lambda t: model(t, training=False)).get_concrete_function(
        tf.TensorSpec([32, 64], tf.int32))
    graph_def = concrete.graph.as_graph_def()
    fetches = [t.op.name for t in concrete.outputs] + [t.op.name for t in concrete.inputs]
    result = _rewrite.rewrite_with_library(
        graph_def, dtype="bfloat16", fetches=fetches, lists=None, strict=True,
        shapes=lambda: _shapes.shapes_of_graph(concrete.graph),
        config=_config.Config.from_env(os.environ))
    body = {name.rsplit("/", 1)[-1]: d for name, d in result.report.decisions.items()
            if d.function and d.function.startswith("while_body") and d.op in (
                "MatMul", "Sigmoid")}
    assert sorted(body) == ["MatMul", "MatMul_1", "Sigmoid", "Sigmoid_1", "Sigmoid_2"], body
    for name, decision in body.items():
        assert decision.reason.startswith("cost model: "), (name, decision.reason)
    # bfloat16 Sigmoid is measured slower than float32's in the Zen 4 table
    assert not any(body[f].converted for f in ("Sigmoid", "Sigmoid_1", "Sigmoid_2"))


def test_big_layers_stay_half(cost_model):
    cost_model(None)
    rewritten = tf_mpt.rewrite_graph(_layers(512, 64, 3), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.bfloat16}


def test_below_the_noise_floor_the_rules_stay_unless_slower_than_float32(cost_model,
                                                                        monkeypatch):
    """Changes that save less than the 50 us floor leave the rules' colours, unless those
    are slower than float32 by the model; a graph it cannot weigh keeps the rules' colours;
    a GraphDef without `_output_shapes` is weighed by TensorFlow's shape inference."""
    cost_model(None)
    one_layer = tf_mpt.rewrite_graph_def(_layers(16, 16, 1).as_graph_def(add_shapes=True),
                                         dtype="bfloat16", fetches=["y"])
    (matmul,) = [d for d in one_layer.report.decisions.values() if d.op == "MatMul"]
    assert not matmul.converted and one_layer.report.casts_added == 0  # R: ~4.5 us slower
    assert re.fullmatch(r"cost model: float32 here \(bfloat16 MatMul over 0\.0082 MFLOP "
                        r"measured 1\.40x slower than float32 in op_costs_zen4\.json; the "
                        r"region of 3 op\(s\) then runs ~\d+\.\d us faster than with the "
                        r"rules' colours\)",
                        matmul.reason), matmul.reason
    wider = tf_mpt.rewrite_graph(_layers(256, 64, 1), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(wider) == {tf.bfloat16}  # R saves ~20 us over float32: it stays
    monkeypatch.setenv(_config.TF_MPT_COST_BATCH, "0")  # no batch assumed for [None, 16]
    unknown = tf_mpt.rewrite_graph(_layers(16, 16, 30, known_batch=False), dtype="bfloat16",
                                   fetches=["y"])
    assert _matmul_dtypes(unknown) == {tf.bfloat16}
    assert "weighed" not in tf_mpt.rewrite_graph_def(
        _layers(16, 16, 30).as_graph_def(), dtype="bfloat16", fetches=["y"],
        target="rules").report.summary()  # the lists decide: nothing weighed
    plain_graph_def = _layers(16, 16, 30).as_graph_def()  # no `_output_shapes`
    result = tf_mpt.rewrite_graph_def(plain_graph_def, dtype="bfloat16", fetches=["y"])
    shaped = tf_mpt.rewrite_graph_def(_layers(16, 16, 30).as_graph_def(add_shapes=True),
                                      dtype="bfloat16", fetches=["y"])
    assert not any(d.converted for d in result.report.decisions.values() if d.op == "MatMul")
    assert result.report.weighed_nodes == shaped.report.weighed_nodes == (182, 182)
    assert result.graph_def == shaped.graph_def.__class__.FromString(
        _without_shape_attrs(shaped.graph_def).SerializeToString())


def _without_shape_attrs(graph_def):
    stripped = type(graph_def)()
    stripped.CopyFrom(graph_def)
    for node in stripped.node:
        node.attr.pop("_output_shapes", None)
    return stripped


def test_where_the_rules_are_slower_a_half_region_under_the_floor_goes_float32_too(cost_model):
    """30 tiny layers (the rules' bfloat16 ~4.5 us slower each) beside one [256x256] layer at
    batch 64 (bfloat16 ~20 us faster): the rules' colours are slower than float32, and the one
    region half would help saves less than the noise floor, so the graph runs float32 as a
    whole, the wide layer saying why."""
    cost_model(None)
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        for name, (width, batch, depth) in {"narrow": (16, 16, 30), "wide": (256, 64, 1)}.items():
            h = tf.compat.v1.placeholder(tf.float32, [batch, width], name=f"{name}_x")
            for k in range(depth):
                w = tf.constant(rng.standard_normal((width, width)).astype(np.float32) / width)
                h = tf.math.exp(tf.nn.relu(tf.matmul(h, w, name=f"{name}_{k}")) * 0.01)
            tf.identity(h, name=f"{name}_y")
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(add_shapes=True), dtype="bfloat16",
                                      fetches=["narrow_y", "wide_y"])
    decisions = result.report.decisions
    assert result.report.casts_added == 0
    assert not any(d.converted for d in decisions.values() if d.op == "MatMul")
    assert re.fullmatch(r"cost model: float32 here \(bfloat16 MatMul over \d+(\.\d+)? MFLOP "
                        r"measured \d\.\d\dx faster than float32 in op_costs_zen4\.json; "
                        r"float32 like the rest: "
                        r"half would save ~\d+\.\d us per run over float32 in all, under the "
                        r"noise floor of 50 us\)", decisions["wide_0"].reason), \
        decisions["wide_0"].reason
    alone = tf_mpt.rewrite_graph(_layers(256, 64, 1), dtype="bfloat16", fetches=["y"])
    assert _matmul_dtypes(alone) == {tf.bfloat16}  # without the narrow layers it stays half


@pytest.mark.parametrize("width, depth", [(16, 30), (512, 3)])
def test_an_unknown_batch_is_costed_as_the_assumed_batch(cost_model, monkeypatch, width,
                                                         depth):
    """A graph fed [None, width] gets the decisions of the same graph fed [32, width]
    (TF_MPT_COST_BATCH's default), and the report says the batch was assumed."""
    cost_model(None)
    unknown = tf_mpt.rewrite_graph_def(
        _layers(width, None, depth, known_batch=False).as_graph_def(add_shapes=True),
        dtype="bfloat16", fetches=["y"])
    known = tf_mpt.rewrite_graph_def(_layers(width, 32, depth).as_graph_def(add_shapes=True),
                                     dtype="bfloat16", fetches=["y"])
    converted = {name: d.converted for name, d in known.report.decisions.items()}
    assert {name: d.converted for name, d in unknown.report.decisions.items()} == converted
    assert unknown.report.casts_added == known.report.casts_added
    by_cost = [d.reason for d in unknown.report.decisions.values()
               if d.reason.startswith("cost model:")]
    if width == 16:  # tiny layers: float32 at batch 32 as at batch 16
        assert not any(converted[f"matmul_{k}"] for k in range(depth))
        assert by_cost and all(r.endswith("; its batch dimension, unknown in the graph, "
                                          "costed as 32 (TF_MPT_COST_BATCH))")
                               for r in by_cost)
    else:
        assert all(converted[f"matmul_{k}"] for k in range(depth))
    monkeypatch.setenv(_config.TF_MPT_COST_BATCH, "1024")
    assumed = tf_mpt.rewrite_graph_def(
        _layers(width, None, depth, known_batch=False).as_graph_def(add_shapes=True),
        dtype="bfloat16", fetches=["y"])
    known = tf_mpt.rewrite_graph_def(_layers(width, 1024, depth).as_graph_def(add_shapes=True),
                                     dtype="bfloat16", fetches=["y"])
    assert {name: d.converted for name, d in assumed.report.decisions.items()} == \
        {name: d.converted for name, d in known.report.decisions.items()}


def test_float16_is_off_unless_forced(cost_model, monkeypatch, tmp_path):
    cost_model(None)
    rewritten = tf_mpt.rewrite_graph(_layers(16, 16, 30), dtype="float16", fetches=["y"])
    assert _matmul_dtypes(rewritten) == {tf.float16}
    cost_model("1")
    table_path = os.environ[_config.TF_MPT_OP_COSTS]
    with open(table_path) as f:
        tables = json.load(f)
    only_bfloat16 = [t for t in tables if t["dtype"] == "bfloat16"]
    (tmp_path / "bfloat16.json").write_text(json.dumps(only_bfloat16))
    monkeypatch.setenv(_config.TF_MPT_OP_COSTS, str(tmp_path / "bfloat16.json"))
    with pytest.raises(ValueError, match="holds costs for bfloat16, not float16.*--dtype "
                                         "float16 --out FILE"):
        tf_mpt.rewrite_graph(_layers(16, 16, 30), dtype="float16", fetches=["y"])
    monkeypatch.setenv(_config.TF_MPT_OP_COSTS, table_path)  # bfloat16 and float16
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


def test_the_older_name_is_said_once_with_the_target_to_use(caplog):
    """TF_MPT_COST_MODEL still works (its target is TF_MPT_TARGET's rules or here), and one
    WARNING names the TF_MPT_TARGET to set instead; unset, nothing is said."""
    from tf_mpt._process import state
    state.STATE.warned.discard(("deprecated", "TF_MPT_COST_MODEL"))
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        _config.Config.from_env({})
        assert not caplog.records
        for _ in range(2):
            config = _config.Config.from_env({"TF_MPT_COST_MODEL": "0"})
    assert tf_mpt.targets.resolve(config, "bfloat16", False).kind == "rules"
    assert [r.getMessage() for r in caplog.records] == [
        "TF_MPT_COST_MODEL=0 is the older name of TF_MPT_TARGET=rules; it still works. Set "
        "TF_MPT_TARGET instead"]
    assert _config.Config.from_env({}).cost_model == "auto"


def test_ops_nothing_reads_are_weighed_too(cost_model):
    """Regression: an op without readers (the fetched Mul, an unread Sigmoid) made the
    swish check fail and the rewrite give up (`strict` raises instead)."""
    cost_model(None)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [256, 512], name="x")
        h = tf.matmul(x, tf.constant(np.eye(512, dtype=np.float32)), name="mm")
        tf.sigmoid(h, name="unread")
        tf.multiply(h, 2.0, name="out")
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(add_shapes=True), dtype="bfloat16",
                                      fetches=["out"], strict=True)
    assert result.report.error is None and result.report.decisions["mm"].converted


@pytest.mark.parametrize("batch, half", [(16, False), (4096, True)])
def test_a_tf_function_traced_for_any_batch_is_weighed_at_its_first_calls_batch(
        cost_model, batch, half):
    """tf_mpt.function with input_signature [None, 64]: the rewrite at the first call costs
    the batch that call passes (a Keras step's data), not TF_MPT_COST_BATCH's guess (32,
    at which these 20 layers stay float32: see the Session test of the same layers)."""
    cost_model(None)
    rng = np.random.default_rng(0)
    weights = [tf.constant(rng.standard_normal((64, 64)).astype(np.float32) / 64)
               for _ in range(20)]

    def layers(x):
        for k, w in enumerate(weights):
            x = tf.math.exp(tf.nn.relu(tf.matmul(x, w, name=f"matmul_{k}")) * 0.01)
        return x
    spec = tf.TensorSpec([None, 64], tf.float32)
    mixed = tf_mpt.function(layers, dtype="bfloat16", input_signature=[spec])
    out = mixed(tf.ones((batch, 64)))
    assert out.dtype == tf.float32 and out.shape == (batch, 64)
    dtypes = {op.get_attr("T") for op in mixed.get_concrete_function(spec).graph.get_operations()
              if op.type == "MatMul"}
    assert dtypes == ({tf.bfloat16} if half else {tf.float32})
    np.testing.assert_allclose(out.numpy(), layers(tf.ones((batch, 64))).numpy(),
                               rtol=0.02 if half else 0, atol=0.02 if half else 0)


def _tiled_layers(unread_input):
    """x [16, 16] tiled n times (n fed at run time) -> 30 tiny layers; with `unread_input`
    also a placeholder [None, 16] that no fetch reads (as a tf_keras model called on a
    placeholder of the script's leaves its own Input and the layers built on it)."""
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [16, 16], name="x")
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")
        if unread_input:  # and a layer built on it, which no fetch reads
            unread = tf.compat.v1.placeholder(tf.float32, [None, 16], name="unread_input")
            tf.nn.relu(tf.matmul(unread, tf.ones((16, 16))), name="unfetched")
        h = tf.tile(x, tf.stack([n, 1]))
        for k in range(30):
            w = tf.constant(rng.standard_normal((16, 16)).astype(np.float32) / 16)
            h = tf.math.exp(tf.nn.relu(tf.matmul(h, w, name=f"matmul_{k}")) * 0.01)
        tf.identity(h, name="y")
    assert graph.get_tensor_by_name("matmul_0:0").shape.as_list() == [None, 16]
    return graph


@pytest.mark.parametrize("unread_input", [False, True])
def test_a_graph_whose_inputs_know_their_batch_assumes_none_inside(cost_model, unread_input):
    """The tiled [n, 16] is not a batch the inputs left open (a loop count, a tiling), so no
    batch is assumed there and the region keeps the lists' colours, as any unknown size does;
    a placeholder [None, 16] that no fetch reads does not make the graph's batch unknown."""
    cost_model(None)
    report = tf_mpt.rewrite_graph_def(_tiled_layers(unread_input).as_graph_def(add_shapes=True),
                                      dtype="bfloat16", fetches=["y"]).report
    assert all(report.decisions[f"matmul_{k}"].converted for k in range(30))
    assert not [d for d in report.decisions.values() if "TF_MPT_COST_BATCH" in d.reason]


def test_a_function_traced_for_any_batch_in_a_graph_fed_a_known_one_assumes_none(cost_model):
    """A tf.function with input_signature [None, 16] called in a graph fed [16, 16] (as a
    tf_keras layer's function traced on the model's own Input): its body's [None, 16]
    arguments are not a batch the graph leaves open, so no batch is assumed in it either."""
    cost_model(None)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((16, 16)).astype(np.float32) / 16 for _ in range(30)]

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def layers(h):
        for k, w in enumerate(weights):
            h = tf.math.exp(tf.nn.relu(tf.matmul(h, w, name=f"matmul_{k}")) * 0.01)
        return h
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [16, 16], name="x")
        tf.identity(layers(x), name="y")
    report = tf_mpt.rewrite_graph_def(graph.as_graph_def(add_shapes=True), dtype="bfloat16",
                                      fetches=["y"]).report
    matmuls = [d for d in report.decisions.values() if d.op == "MatMul"]
    assert len(matmuls) == 30 and all(d.converted for d in matmuls)
    assert not [d for d in report.decisions.values() if "TF_MPT_COST_BATCH" in d.reason]


def test_the_leading_size_of_a_batch_is_read_without_converting_or_raising():
    from tf_mpt.rewrite.paint import shapes  # pylint: disable=import-outside-toplevel

    class Hostile:
        @property
        def shape(self):
            raise RuntimeError("reading me fails")

    batch = np.zeros((16, 4), np.float32)
    assert shapes.leading_size([batch, tf.zeros([16, 3]), tf.TensorSpec([None, 2])]) == 16
    assert shapes.leading_size({"x": batch, "rate": 0.5, "flags": [1, 2]}) == 16
    assert shapes.leading_size([batch, tf.Variable(tf.zeros([8, 4]))]) == 16  # not data
    assert shapes.leading_size([batch, np.zeros((8, 4))]) is None  # two sizes: no one batch
    assert shapes.leading_size([np.float32(1.0), tf.TensorSpec(None)]) is None
    assert shapes.leading_size([batch, Hostile()]) is None


@pytest.mark.parametrize("relu_reads_alone", [True, False])
def test_a_relu_after_a_training_batch_norm_runs_inside_its_kernel(relu_reads_alone):
    """FusedBatchNorm (training) -> Relu runs as one _FusedBatchNormEx kernel in float32
    and bfloat16 (DenseNet121's training step runs no Relu kernel): the Relu costs nothing,
    unless the batch norm's output has another reader (then nothing fuses)."""
    from tf_mpt.rewrite import graph_view  # pylint: disable=import-outside-toplevel
    from tf_mpt.rewrite.paint import cost  # pylint: disable=import-outside-toplevel
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16, 16, 32], name="x")
        channels = tf.ones([32])
        y = tf.compat.v1.nn.fused_batch_norm(x, channels, channels * 0.0, is_training=True,
                                             name="bn")[0]
        out = tf.nn.relu(y, name="relu")
        if not relu_reads_alone:
            out = out + y
        tf.identity(out, name="out")
    view = graph_view.GraphView(graph.as_graph_def())
    bn = view.nodes[view.index["bn"]]
    assert bn.op.startswith("FusedBatchNorm") and bn.attr["is_training"].b
    assert cost.fusion(view, view.index["relu"]) == ("both" if relu_reads_alone else None)


def test_the_report_carries_the_cost_models_prediction(cost_model):
    """Wide layers go half: a saving over float32, and a sum of kernel and Cast times above
    it (each Exp, a deny op, costs a Cast pair). Tiny layers stay float32: nothing predicted."""
    cost_model(None)

    def report(width, batch, depth):
        graph_def = _layers(width, batch, depth).as_graph_def(add_shapes=True)
        return tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", fetches=["y"]).report
    wide = report(512, 64, 3)
    assert wide.converted_nodes and wide.casts_added == 6
    assert 0 < wide.predicted_saving < wide.predicted_changed
    assert wide.to_dict()["predicted_saving"] == wide.predicted_saving
    tiny = report(16, 16, 30)
    assert tiny.converted_nodes == 0
    assert (tiny.predicted_saving, tiny.predicted_changed) == (0.0, 0.0)


def _sum_between_matmuls(between):
    """Two [1024 x 1024] products, their sum (`between` applied to the first) into a third:
    the sum (1 M elements) half by the rules, between half products."""
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [1024, 1024], name="x")
        weights = [tf.constant(rng.standard_normal((1024, 1024)).astype(np.float32) / 32)
                   for _ in range(3)]
        total = between(tf.matmul(x, weights[0])) + tf.matmul(x, weights[1])
        tf.identity(tf.matmul(total, weights[2]), name="y")
    return graph.as_graph_def(add_shapes=True)


@pytest.mark.parametrize("between, faster", [(tf.identity, ("add",)),
                                             (tf.nn.relu, ("add",)),
                                             (tf.math.exp, ())])
def test_the_report_says_what_of_the_prediction_rests_on_element_wise_kernels(
        cost_model, between, faster):
    """predicted_elementwise: what the half kernels faster than float32 outside the matrix
    products save by the table (the Zen 4 table: a bfloat16 AddV2 over 1 M elements 1.47x
    faster, counted; a Relu 0.50x: slower, half between the products but not counted); an
    Exp (deny) before the sum leaves it float32: nothing counted."""
    cost_model(None)
    report = tf_mpt.rewrite_graph_def(_sum_between_matmuls(between), dtype="bfloat16",
                                      fetches=["y"]).report
    costs = _op_costs.costs_for(_config.Config.from_env(os.environ), "bfloat16")
    elements = 1024 * 1024
    gain = costs.time("AddV2", elements, False) - costs.time("AddV2", elements, True)
    assert gain > 0 and costs.time("Relu", elements, True) > costs.time("Relu", elements, False)
    half = {name for name, d in report.decisions.items() if d.converted}
    assert {"MatMul", "MatMul_1", "MatMul_2"} <= half
    assert ("add" in half) == bool(faster)
    assert report.predicted_elementwise == pytest.approx(gain * len(faster))
    assert report.predicted_elementwise < report.predicted_saving
    assert report.to_dict()["predicted_elementwise"] == report.predicted_elementwise
