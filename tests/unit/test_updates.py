"""A variable's update runs in the variable's dtype (tf_mpt/rewrite/paint/updates.py): the
element-wise arithmetic whose values flow only into writes of float32 variables keeps float32,
with one Cast of each half gradient, and the slots a mixed step leaves match float32's."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.rewrite import graph_view, type_attrs
from tf_mpt.rewrite.paint import updates

tf1 = tf.compat.v1
RULES = tf_mpt.Config.from_env({"TF_MPT_TARGET": "rules"})
# Adam's first moment after one step from m = 1000.3 with a gradient of 8 (exact in both half
# types): float32 arithmetic gives 901.07 to within float32's rounding; bfloat16's Sub and Mul
# round (8 - 1000.3) and the step to 8 bits of mantissa (901.07 becomes 900.8).
SLOT_RTOL = 1e-6
M0 = 1000.3


def _dense_adam():
    inp = keras.Input((16,))
    model = keras.Model(inp, keras.layers.Dense(4, name="dense")(inp))
    opt = keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return model, opt, step


def _first_moments(opt):
    """{'kernel': m, 'bias': m}: Adam's first moments."""
    return {("kernel" if "kernel" in v.path else "bias"): v.numpy()
            for v in opt.variables if "momentum" in v.path}


def _one_step(half, rewrite):
    keras.utils.set_random_seed(1)
    model, opt, step = _dense_adam()
    for slot in opt.variables:
        if "momentum" in slot.path:
            slot.assign(np.full(slot.shape, M0, np.float32))
    x = tf.ones([8, 16])
    spec = tf.TensorSpec([8, 16])
    fn = tf.function(step).get_concrete_function(spec)
    if rewrite:
        fn = tf_mpt.rewrite_function(fn, dtype=half, config=RULES)
    fn(x)
    return fn, _first_moments(opt)


def _in_adam(name):
    return re.search(r"(^|/)adam(_\d+)?/", name) is not None


def _half_nodes(graph_def, half):
    enum = tf.as_dtype(half).as_datatype_enum
    return [node for node in graph_def.node
            if any(value.type == enum for key, value in node.attr.items() if key != "SrcT")]


def test_adams_update_stays_float32_and_reads_each_half_gradient_through_one_cast(half_dtype):
    fn, _ = _one_step(half_dtype, rewrite=True)
    graph_def = fn.graph.as_graph_def()
    half = _half_nodes(graph_def, half_dtype)
    assert {n.op for n in half if "gradient_tape/" in n.name} >= {"MatMul"}
    read = {i.split(":")[0].lstrip("^") for n in graph_def.node for i in n.input}
    # (Keras's optimizer leaves two unread Identity nodes of the gradients: dead code)
    assert not [n.name for n in half if _in_adam(n.name) and n.name in read]
    # the kernel's gradient (a half MatMul) and the bias's (BiasAddGrad, reduced in half from
    # the half dy) each reach Adam through exactly one Cast to float32
    casts_into_adam = {n.name for n in graph_def.node
                       if n.op == "Cast" and n.attr["DstT"].type == tf.float32.as_datatype_enum
                       and n.attr["SrcT"].type == tf.as_dtype(half_dtype).as_datatype_enum
                       and "gradient_tape/" in n.input[0]}
    readers = {c for n in graph_def.node for i in n.input if i.split(":")[0] in casts_into_adam
               for c in [n.name]}
    assert len(casts_into_adam) == 2, casts_into_adam
    assert readers and all(_in_adam(name) for name in readers), readers


def test_one_mixed_adam_step_leaves_the_slots_float32_leaves(half_dtype):
    _, expected = _one_step(half_dtype, rewrite=False)
    _, mixed = _one_step(half_dtype, rewrite=True)
    assert expected.keys() == mixed.keys() and len(expected) == 2
    for path, value in expected.items():
        np.testing.assert_allclose(mixed[path], value, rtol=SLOT_RTOL, err_msg=path)
    np.testing.assert_allclose(expected["kernel"], M0 + (8 - M0) * 0.1, rtol=SLOT_RTOL)


def test_without_the_rule_the_slots_drift_by_what_the_tolerance_catches(monkeypatch):
    """The check above can fail: the paint alone runs Adam's arithmetic in bfloat16."""
    _, expected = _one_step("bfloat16", rewrite=False)
    monkeypatch.setattr(updates, "variable_update_reasons", lambda view, types, allow: {})
    _, mixed = _one_step("bfloat16", rewrite=True)
    drift = np.max(np.abs(mixed["kernel"] - expected["kernel"]) / expected["kernel"])
    assert drift > 100 * SLOT_RTOL, drift


def _tf1_graph(clip_fetched=False, var_dtype=tf.float32):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [32, 64], name="x")
        w = tf1.get_variable("w", [64, 64], dtype=tf.float32)
        b = tf1.get_variable("b", [64], dtype=tf.float32)
        y = tf.nn.bias_add(tf.matmul(x, w), b)
        loss = tf.reduce_mean(tf.square(tf.nn.relu(y)), name="loss")
        dw, db = tf.gradients(loss, [w, b])
        dw = tf.multiply(dw, 0.5, name="clip_dw")
        fetches = ["loss"]
        if clip_fetched:
            tf.identity(dw, name="dw_seen")
            fetches.append("dw_seen")
        lr = tf.constant(0.01, name="lr")
        train = [tf.raw_ops.ResourceApplyGradientDescent(var=w.handle, alpha=lr, delta=dw,
                                                         name="apply_w"),
                 tf.raw_ops.ResourceApplyGradientDescent(var=b.handle, alpha=lr, delta=db,
                                                         name="apply_b")]
        if var_dtype != tf.float32:
            h = tf1.get_variable("h", [64], dtype=var_dtype)
            train.append(h.assign_add(tf.cast(db, var_dtype) * 2, name="assign_h").op)
        with tf.control_dependencies(train):
            tf.no_op(name="train")
    return graph, fetches + ["train"]


def _report(graph, fetches):
    return tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype="bfloat16", fetches=fetches,
                                    config=RULES, strict=True).report


def test_a_fused_optimizers_gradient_arithmetic_stays_float32_and_the_reduction_is_painted():
    decisions = _report(*_tf1_graph()).decisions
    assert decisions["clip_dw"].colour == "fp32"
    assert "update of a float32 variable" in decisions["clip_dw"].reason
    assert "apply_w" in decisions["clip_dw"].reason
    assert decisions["MatMul"].converted  # the product that makes dw stays half
    # BiasAddGrad reduces an activation to the bias's gradient: not update arithmetic
    grad = next(name for name in decisions if name.endswith("BiasAddGrad"))
    assert decisions[grad].converted, decisions[grad]


def test_the_summary_counts_the_nodes_kept_as_variable_updates():
    report = _report(*_tf1_graph())
    kept = sorted(name for name, d in report.decisions.items()
                  if d.reason.startswith("update of a float32 variable"))
    # the Mul and its constant 0.5, the learning rate (the initializers' arithmetic, float32
    # anyway, is not counted)
    assert kept == ["clip_dw", "clip_dw/y", "lr"], kept
    assert report.kept_as_variable_updates == 3
    assert report.summary().endswith(
        "; 3 compute variable updates (an optimizer's step, moving averages): kept float32")


def test_an_op_the_user_puts_on_the_allow_list_runs_half_in_an_update():
    """An explicit request is honoured: with Mul on the allow list (TF_MPT_ALLOWLIST_ADD=Mul),
    the gradient's clipping Mul is painted half, and what only it reads (its constant) is
    no longer an update's; the learning rate still is."""
    graph, fetches = _tf1_graph()
    lists = tf_mpt.lists.default_lists("bfloat16").edited(add={"allow": ["Mul"]})
    report = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype="bfloat16", fetches=fetches,
                                      config=RULES, strict=True, lists=lists).report
    decisions = report.decisions
    assert decisions["clip_dw"].converted, decisions["clip_dw"]
    kept = sorted(name for name, d in decisions.items()
                  if d.reason.startswith("update of a float32 variable"))
    assert kept == ["lr"], kept
    assert report.kept_as_variable_updates == 1

def test_a_value_the_script_also_reads_is_not_update_arithmetic():
    decisions = _report(*_tf1_graph(clip_fetched=True)).decisions
    assert decisions["clip_dw"].converted, decisions["clip_dw"]


def test_a_half_variables_write_keeps_nothing_float32():
    graph, _ = _tf1_graph(var_dtype=tf.float16)
    view, types = _view_and_types(graph)
    kept = {view.nodes[i].name for i in updates.variable_update_reasons(view, types)}
    assert "clip_dw" in kept
    assign = next(node for node in view.nodes if node.op == "AssignAddVariableOp")
    value = assign.input[1].split(":")[0]
    assert view.nodes[view.index[value]].op == "Mul" and value not in kept, kept


def _view_and_types(graph):
    view = graph_view.GraphView(graph.as_graph_def())
    return view, [type_attrs.node_types(node, {}) for node in view.nodes]


@pytest.mark.parametrize("op", sorted(updates.UPDATE_ARITHMETIC_OPS))
def test_every_update_op_is_registered(op):
    from tensorflow.python.framework import op_def_registry
    assert op_def_registry.get(op) is not None
