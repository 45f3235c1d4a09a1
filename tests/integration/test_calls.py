"""Decisions across call boundaries (PartitionedCall / If): arguments and results that are half
on both sides cross in half, shared functions are specialised, signatures stay consistent."""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from support.tolerances import TOLERANCES
from support.helpers import half_tag

_CALLS = ("PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf")


def _weights():
    return tf.Variable(tf.random.stateless_uniform([8, 8], seed=(1, 2), minval=-0.5,
                                                   maxval=0.5))


def _call_then_cond():
    w = _weights()

    @tf.function
    def inner(h):
        return tf.tanh(tf.matmul(h, w))

    @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32, name="x"),
                                  tf.TensorSpec([], tf.bool, name="p")])
    def f(x, p):
        h = inner(tf.matmul(x, w))
        h = tf.cond(p, lambda: tf.matmul(h, w), lambda: tf.nn.relu(tf.matmul(h, w) * 2.0))
        return tf.matmul(h, w)

    return f.get_concrete_function()


def _rewrite(cf, dtype):
    fetches = [t.op.name for t in cf.outputs] + [t.op.name for t in cf.inputs]
    return tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=dtype, fetches=fetches,
                                    strict=True)


def _check_signatures(graph_def):
    """Every call's Tin/Tout (in the graph and in every function) equals the signature of
    every function it calls."""
    library = {f.signature.name: f.signature for f in graph_def.library.function}
    for node in list(graph_def.node) + [n for f in graph_def.library.function
                                        for n in f.node_def]:
        if node.op not in _CALLS:
            continue
        names = ([node.attr["f"].func.name] if "f" in node.attr
                 else [node.attr["then_branch"].func.name, node.attr["else_branch"].func.name])
        for name in names:
            signature = library[name]
            assert [a.type for a in signature.input_arg] == list(node.attr["Tin"].list.type)
            assert [a.type for a in signature.output_arg] == list(node.attr["Tout"].list.type)


def test_half_values_cross_calls_and_conds_without_casts(half_dtype):
    cf = _call_then_cond()
    result = _rewrite(cf, half_dtype)
    gd, half, tag = result.graph_def, tf.as_dtype(half_dtype).as_datatype_enum, half_tag(half_dtype)
    _check_signatures(gd)
    nodes = {n.name: n for n in gd.node}
    call, cond = nodes["StatefulPartitionedCall"], nodes["cond"]
    assert list(call.attr["Tin"].list.type)[0] == half and call.attr["Tout"].list.type[0] == half
    assert list(cond.attr["Tin"].list.type)[1] == half and cond.attr["Tout"].list.type[0] == half
    assert result.report.call_values_kept_half == 4
    # Left: x in, the result out, and one Cast per variable read (in each function).
    functions = {f.signature.name for f in gd.library.function}

    def local(name):
        head, _, rest = name.partition("/")
        return rest if head in functions else name

    assert sorted(map(local, result.report.cast_names)) == sorted(
        ["MatMul_1-0-CastToFp32-TfMpt", f"x-0-CastTo{tag}-TfMpt",
         f"MatMul_1/ReadVariableOp-0-CastTo{tag}-TfMpt"]
        + [f"MatMul/ReadVariableOp-0-CastTo{tag}-TfMpt"] * 2
        + [f"cond/MatMul/ReadVariableOp-0-CastTo{tag}-TfMpt"] * 2)
    assert sorted(result.report.cast_names) == sorted(
        [n.name for n in gd.node if n.op == "Cast"]
        + [f"{f.signature.name}/{n.name}" for f in gd.library.function
           for n in f.node_def if n.op == "Cast"])
    rewritten = tf_mpt.rewrite_function(cf, dtype=half_dtype)
    x = tf.random.stateless_uniform([4, 8], seed=(3, 4), minval=-1, maxval=1)
    for p in (True, False):
        expected, actual = cf(x, tf.constant(p)), rewritten(x, tf.constant(p))
        assert actual.dtype == tf.float32
        np.testing.assert_allclose(actual, expected, **TOLERANCES[half_dtype])


def test_function_called_in_half_and_in_float32_is_specialised(half_dtype):
    w = _weights()

    @tf.function
    def inner(h):
        return tf.tanh(tf.matmul(h, w))

    @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32, name="x")])
    def f(x):
        in_half = inner(tf.matmul(x, w))             # half on both sides
        in_fp32 = inner(tf.math.log(tf.abs(x) + 1))  # Log (deny) feeds it, Exp (deny) reads it
        return tf.matmul(in_half, w) + tf.math.exp(in_fp32)

    cf = f.get_concrete_function()
    original = cf.graph.as_graph_def()
    callee = {n.name: n.attr["f"].func.name for n in original.node
              if n.op == "StatefulPartitionedCall"}
    assert len(set(callee.values())) == 1  # one function, called twice
    result = _rewrite(cf, half_dtype)
    gd, half = result.graph_def, tf.as_dtype(half_dtype).as_datatype_enum
    _check_signatures(gd)
    called = {n.name: n.attr["f"].func.name for n in gd.node if n.op == "StatefulPartitionedCall"}
    assert len(set(called.values())) == 2, called
    library = {f.signature.name: f.signature for f in gd.library.function}
    kinds = sorted(tuple(a.type for a in library[name].input_arg)[:1] for name in called.values())
    assert kinds == sorted([(tf.float32.as_datatype_enum,), (half,)])
    assert library[next(iter(callee.values()))].input_arg[0].type == tf.float32.as_datatype_enum
    x = tf.random.stateless_uniform([4, 8], seed=(3, 4), minval=-1, maxval=1)
    np.testing.assert_allclose(tf_mpt.rewrite_function(cf, dtype=half_dtype)(x), cf(x),
                               **TOLERANCES[half_dtype])


def test_a_function_the_graph_and_another_function_both_call_is_specialised_inside(half_dtype):
    w = _weights()

    @tf.function
    def inner(h):
        return tf.tanh(tf.matmul(h, w))

    @tf.function
    def outer(h):
        return tf.matmul(inner(tf.matmul(h, w)), w)  # inner is half on both sides here

    @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32, name="x")])
    def f(x):
        # ... and float32 on both sides here (Log and Exp are deny ops)
        return outer(x) + tf.math.exp(inner(tf.math.log(tf.abs(x) + 1)))

    cf = f.get_concrete_function()
    original = cf.graph.as_graph_def()
    inner_name = next(n.attr["f"].func.name for n in original.node
                      if n.op == "StatefulPartitionedCall" and "inner" in n.attr["f"].func.name)
    result = _rewrite(cf, half_dtype)
    gd = result.graph_def
    _check_signatures(gd)  # the graph's own call of inner still matches inner's signature
    library = {f.signature.name: f for f in gd.library.function}
    assert library[inner_name].signature.input_arg[0].type == tf.float32.as_datatype_enum
    assert result.report.call_values_kept_half >= 2  # outer's call of inner, on a copy
    assert any(name.startswith(inner_name + "_tf_mpt_call_") for name in library)
    x = tf.random.stateless_uniform([4, 8], seed=(3, 4), minval=-1, maxval=1)
    np.testing.assert_allclose(tf_mpt.rewrite_function(cf, dtype=half_dtype)(x), cf(x),
                               **TOLERANCES[half_dtype])


def test_fetched_call_keeps_its_signature(half_dtype):
    cf = _call_then_cond()
    graph_def = cf.graph.as_graph_def()
    fetches = [t.op.name for t in cf.outputs] + [t.op.name for t in cf.inputs] + [
        "StatefulPartitionedCall", "cond"]
    result = tf_mpt.rewrite_graph_def(graph_def, dtype=half_dtype, fetches=fetches)
    assert result.report.call_values_kept_half == 0
    for node in result.graph_def.node:
        if node.op in _CALLS:
            assert set(node.attr["Tout"].list.type) == {tf.float32.as_datatype_enum}
    _check_signatures(result.graph_def)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_unchanged_when_nothing_is_half_inside(dtype):
    @tf.function
    def inner(h):
        return tf.math.exp(h)  # deny: the function stays float32

    @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32, name="x")])
    def f(x):
        return inner(tf.math.log(tf.abs(x) + 1.0))

    result = _rewrite(f.get_concrete_function(), dtype)
    assert result.report.call_values_kept_half == 0
    assert result.report.casts_added == 0


def test_loop_inside_a_called_function_keeps_its_variable_half(half_dtype):
    """The boundary passes run inside function bodies too: a While in a function that the
    main graph calls gets its loop variable switched, as one in the main graph would."""
    w = _weights()

    @tf.function
    def inner(h):
        return tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                             [0, h])[1]

    @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32, name="x")])
    def f(x):
        return tf.math.exp(-tf.abs(inner(tf.math.exp(-tf.abs(x)))))  # Exp (deny) on both sides

    cf = f.get_concrete_function()
    result = _rewrite(cf, half_dtype)
    assert result.report.loop_variables_kept_half == 1
    gd, half = result.graph_def, tf.as_dtype(half_dtype).as_datatype_enum
    _check_signatures(gd)
    library = {fd.signature.name: fd for fd in gd.library.function}
    called = [n.attr["f"].func.name for n in gd.node if n.op == "StatefulPartitionedCall"][0]
    loop = [n for n in library[called].node_def if n.op in ("While", "StatelessWhile")][0]
    assert half in list(loop.attr["T"].list.type)
    body = library[loop.attr["body"].func.name]
    assert half in [a.type for a in body.signature.input_arg]
    assert library[called].signature.input_arg[0].type == tf.float32.as_datatype_enum
    x = tf.random.stateless_uniform([4, 8], seed=(3, 4), minval=-1, maxval=1)
    np.testing.assert_allclose(tf_mpt.rewrite_function(cf, dtype=half_dtype)(x), cf(x),
                               **TOLERANCES[half_dtype])
