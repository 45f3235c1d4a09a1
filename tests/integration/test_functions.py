"""TF2: rewrite_function and tf_mpt.function on tf.function graphs."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from support.tolerances import TOLERANCES
from support import digits
from support.helpers import executed_ops, half_tag, run

ACCURACY_POINTS = 0.01


MATRIX_OPS = ("MatMul", "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")


# The loops and calls here are tiny: on a CPU the cost model keeps their bodies float32;
# these tests check the function, loop and call passes, so every op the lists convert goes
# half.
pytestmark = pytest.mark.usefixtures("no_cost_model")


def _matrix_ops(concrete_function):
    return [op for op in concrete_function.graph.get_operations() if op.type in MATRIX_OPS]


def _half_ops(concrete_function):
    return [op for op in _matrix_ops(concrete_function) if op.get_attr("T") != tf.float32]


def test_rewrite_function_keeps_signature_outputs_and_captured_variables(half_dtype):
    w = tf.Variable(tf.random.stateless_uniform([4, 4], seed=(1, 2), minval=-1, maxval=1))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def f(x):
        y = tf.matmul(x, w)
        w.assign_add(tf.fill([4, 4], 0.25))
        return {"out": tf.nn.relu(y), "rows": tf.shape(y)[0], "nothing": None}

    cf = f.get_concrete_function()
    expected = f(tf.ones([3, 4]))
    w.assign_sub(tf.fill([4, 4], 0.25))
    mixed = tf_mpt.rewrite_function(cf, dtype=half_dtype)
    assert mixed is not cf
    assert mixed.structured_input_signature == cf.structured_input_signature
    assert len(_half_ops(mixed)) == 1
    before = w.numpy()
    got = mixed(tf.ones([3, 4]))
    assert set(got) == {"out", "rows", "nothing"} and got["nothing"] is None
    assert got["out"].dtype == tf.float32 and got["rows"].dtype == tf.int32
    np.testing.assert_allclose(got["out"], expected["out"], **TOLERANCES[half_dtype])
    np.testing.assert_allclose(w.numpy() - before, 0.25)  # the real variable was updated


def test_rewrite_function_rejects_a_non_concrete_function():
    @tf.function
    def f(x):
        return x
    with pytest.raises(TypeError, match="get_concrete_function"):
        tf_mpt.rewrite_function(f)


def test_tf_mpt_function_is_a_drop_in_for_tf_function(half_dtype):
    w = tf.Variable(tf.eye(4))

    @tf_mpt.function(dtype=half_dtype)
    def f(x, scale=2.0):
        return tf.matmul(x, w) * scale

    x = tf.constant(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
    np.testing.assert_allclose(f(x), x.numpy() * 2, **TOLERANCES[half_dtype])
    np.testing.assert_allclose(f(x, scale=3.0), x.numpy() * 3, **TOLERANCES[half_dtype])
    assert len(_half_ops(f.get_concrete_function(x))) == 1
    assert f.__name__ == "f"


def _keras_step_accuracy(dtype, data, epochs=6):
    import keras
    x_train, y_train, x_test, y_test = data
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    cf = tf.function(step).get_concrete_function(tf.TensorSpec([None, 8, 8, 1], tf.float32),
                                                  tf.TensorSpec([None], tf.int32))
    if dtype is not None:
        cf = tf_mpt.rewrite_function(cf, dtype=dtype)
    for _ in range(epochs):
        for start in range(0, digits.TRAIN, digits.BATCH):
            cf(x_train[start:start + digits.BATCH], y_train[start:start + digits.BATCH])
    accuracy = float(np.mean(np.argmax(model(x_test).numpy(), 1) == y_test))
    return accuracy, len(_half_ops(cf)), len(_matrix_ops(cf))


def test_keras_training_step_rewritten_trains_to_float32_accuracy(half_dtype):
    data = digits.load()
    accuracy32, half32, _ = _keras_step_accuracy(None, data)
    accuracy, half, total = _keras_step_accuracy(half_dtype, data)
    # every conv and matmul, forward and backward (at least conv + 2 dense and their
    # weight gradients), runs in half; none did before
    assert half32 == 0 and half == total >= 6
    assert accuracy32 > 0.95
    assert abs(accuracy - accuracy32) <= ACCURACY_POINTS + 1e-9, (accuracy, accuracy32)


def test_lstm_while_loop_in_tf_function_forward_and_gradients(half_dtype):
    from support import lstm
    cf, _ = lstm.tf2_loss_and_grads()
    result = tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=half_dtype,
                                      fetches=[t.op.name for t in cf.outputs])
    half_matmuls = {(d.function, d.name) for d in result.report.decisions.values()
                    if d.op == "MatMul" and d.converted}
    bodies = {f for f, _ in half_matmuls}
    assert any(f and "body" in f and "grad" not in f for f in bodies)  # forward loop body
    assert any(f and "grad" in f for f in bodies)  # the gradient loop body
    xs = lstm.inputs()
    loss32, grads32 = cf(xs)
    loss, grads = tf_mpt.rewrite_function(cf, dtype=half_dtype)(xs)
    np.testing.assert_allclose(loss, loss32, **TOLERANCES[half_dtype])
    for g, g32 in zip(grads, grads32):
        assert g.dtype == tf.float32
        np.testing.assert_allclose(g, g32, **TOLERANCES[half_dtype])


def test_lstm_tensor_array_v1_loop_forward_and_gradients(half_dtype):
    from support import lstm
    graph = lstm.build_v1_graph()
    fetches = ["loss", "grad0", "grad1", "grad2", "init"]
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype, fetches=fetches)
    gd = result.graph_def
    matmuls = [n for n in gd.node if n.op == "MatMul"]
    assert len(matmuls) >= 6 and all(n.attr["T"].type == tf.as_dtype(half_dtype).as_datatype_enum
                                     for n in matmuls)
    for node in gd.node:
        if node.op == "NextIteration":
            merges = [n for n in gd.node if n.op == "Merge" and node.name in n.input]
            assert all(m.attr["T"].type == node.attr["T"].type for m in merges), node.name
    feeds = {"xs:0": lstm.inputs()}
    names = [f"{f}:0" for f in fetches[:-1]]
    expected = run(graph.as_graph_def(), names, feeds, init="init")
    actual = run(gd, names, feeds, init="init")
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, **TOLERANCES[half_dtype])


def _keras_lstm_training_step():
    """A Keras 3 LSTM classifier's loss and gradients under a GradientTape, as a
    ConcreteFunction (x, y) -> (loss, gradients): a while_v2 forward loop whose h and c come
    back through Identity nodes, and whose c a gradient accumulator reads in float32."""
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((12,), dtype="int32"),
                              keras.layers.Embedding(50, 16), keras.layers.LSTM(24),
                              keras.layers.Dense(4)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([8, 12], tf.int32),
                                  tf.TensorSpec([8], tf.int32)])
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    return step.get_concrete_function()


def test_keras_lstm_carries_h_and_c_and_their_gradients_half_through_its_loops(half_dtype):
    """Forward: h returns through an Identity after its Cast to float32 and c is also pushed,
    in float32, to the gradient's accumulator; both still cross the loop in half, so the
    body casts only the time step's input and the three weight reads per iteration.
    Gradient: the incoming gradients of h and c enter in float32 and the cell's elementwise
    gradients start from them; declared half (the body rewritten again), they cross in half
    and only the output gradient read and the input gradient written are cast."""
    cf = _keras_lstm_training_step()
    result = tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=half_dtype, strict=True,
                                      fetches=[t.op.name for t in cf.outputs])
    gd, half = result.graph_def, tf.as_dtype(half_dtype).as_datatype_enum
    loops = [n for n in gd.node if n.op in ("While", "StatelessWhile")]
    forward, = [n for n in loops if "grad" not in n.name]
    backward, = [n for n in loops if "grad" in n.name]

    def body_casts(loop):
        body, = [f for f in gd.library.function
                 if f.signature.name == loop.attr["body"].func.name]
        return sorted(n.input[0].split(":")[0].rsplit("/", 2)[-2] for n in body.node_def
                      if n.op == "Cast")

    assert body_casts(forward) == ["BiasAdd", "Cast", "Cast_1", "TensorArrayV2Read"]
    assert list(forward.attr["T"].list.type).count(half) == 2  # h and c
    assert body_casts(backward) == ["MatMul_grad", "TensorListSetItem_grad"]
    # the gradients of h and c, and of the three weights (summed over the time steps)
    assert list(backward.attr["T"].list.type).count(half) == 5
    assert result.report.loop_variables_kept_half == 7
    rng = np.random.RandomState(0)
    x, y = rng.randint(0, 50, (8, 12)).astype(np.int32), rng.randint(0, 4, 8).astype(np.int32)
    (loss32, grads32) = cf(x, y)
    loss, grads = tf_mpt.rewrite_function(cf, dtype=half_dtype)(x, y)
    np.testing.assert_allclose(loss, loss32, **TOLERANCES[half_dtype])
    for g, g32 in zip(grads, grads32):
        g, g32 = tf.convert_to_tensor(g), tf.convert_to_tensor(g32)
        assert g.dtype == tf.float32
        np.testing.assert_allclose(g, g32, atol=TOLERANCES[half_dtype]["atol"] *
                                   float(tf.reduce_max(tf.abs(g32))), rtol=0)


def _tanh_matmul_loop():
    """(the ConcreteFunction of x [2, 4] -> 3 iterations of h = tanh(h @ w), w): w is a
    variable the loop reads (so the While is a control output of the function), returned so
    the caller keeps it alive."""
    w = tf.Variable(tf.random.stateless_uniform([4, 4], seed=(1, 2), minval=-0.5, maxval=0.5))

    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32)])
    def f(x):
        return tf.while_loop(lambda i, h: i < 3,
                             lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))), [0, x])[1]

    return f.get_concrete_function(), w


def test_while_loop_variable_stays_half_across_the_loop_boundary(half_dtype):
    cf, _w = _tanh_matmul_loop()
    result = tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=half_dtype,
                                      fetches=[t.op.name for t in cf.outputs])
    gd, half = result.graph_def, tf.as_dtype(half_dtype).as_datatype_enum
    assert result.report.loop_variables_kept_half == 1
    loop = [n for n in gd.node if n.op in ("While", "StatelessWhile")][0]
    assert list(loop.attr["T"].list.type)[3] == half
    body = [fd for fd in gd.library.function if fd.signature.name == loop.attr["body"].func.name][0]
    assert body.signature.input_arg[3].type == half and body.signature.output_arg[3].type == half
    # One Cast into the loop and one out of it, run once; inside, only the weight read's Cast
    # (instead of a Cast on the loop variable in and out of every iteration).
    body_casts = [n.name for n in body.node_def if n.op == "Cast"]
    assert body_casts == ["while/MatMul/ReadVariableOp-0-CastTo"
                          f"{'Bf16' if half_dtype == 'bfloat16' else 'Fp16'}-TfMpt"]
    assert result.report.casts_added == 3
    again = tf_mpt.rewrite_graph_def(gd, dtype=half_dtype, fetches=[t.op.name for t in cf.outputs])
    assert not again.modified
    x = tf.random.stateless_uniform([2, 4], seed=(3, 4))
    np.testing.assert_allclose(tf_mpt.rewrite_function(cf, dtype=half_dtype)(x), cf(x),
                               **TOLERANCES[half_dtype])


def test_rewrite_function_keeps_a_loop_that_is_a_control_output_half_across_its_boundary(
        half_dtype):
    """The loop reads a variable, so the tf.function runs it as a control output (it must
    run, whatever reads its outputs): its dtypes may still change, as in a function body."""
    cf, _w = _tanh_matmul_loop()
    assert [op.type for op in cf.graph.control_outputs] == ["While"]
    rewritten = tf_mpt.rewrite_function(cf, dtype=half_dtype)
    loops = [op for op in rewritten.graph.get_operations() if op.type == "While"]
    assert len(loops) == 1
    assert loops[0].get_attr("T")[3] == tf.as_dtype(half_dtype)  # h crosses in half
    x = tf.random.stateless_uniform([2, 4], seed=(3, 4))
    np.testing.assert_allclose(rewritten(x), cf(x), **TOLERANCES[half_dtype])


def test_tf_mpt_function_decorates_methods_per_instance(half_dtype):
    class Layer(tf.Module):
        def __init__(self, scale):
            super().__init__()
            self.w = tf.Variable(tf.eye(4) * scale)

        @tf_mpt.function(dtype=half_dtype)
        def __call__(self, x):
            return tf.matmul(x, self.w)

    one, two = Layer(1.0), Layer(2.0)
    x = tf.ones([2, 4])
    np.testing.assert_allclose(one(x), np.ones([2, 4]))
    np.testing.assert_allclose(two(x), 2 * np.ones([2, 4]))
    assert len(_half_ops(one.__call__.get_concrete_function(x))) == 1


def test_a_tf_function_calling_tf_mpt_has_only_the_users_code_converted_by_autograph(
        monkeypatch):
    """AutoGraph transpiled every tf_mpt function a user's tf.function reached through a
    nested tf_mpt.function (~200: the whole rewrite, ~9 s of a small script); now it leaves
    tf_mpt as it leaves TensorFlow and Keras, and still converts the user's Python `if`."""
    from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
    converted = []
    original = api._convert_actual  # pylint: disable=protected-access

    def record(entity, program_ctx):
        converted.append(getattr(entity, "__module__", "") or "")
        return original(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", record)
    w = tf.Variable(tf.eye(4) * 2.0)

    @tf_mpt.function(dtype="float16")
    def inner(x):
        if tf.reduce_sum(x) > 0:  # a tensor condition: needs AutoGraph
            return tf.matmul(x, w)
        return -x

    @tf.function
    def outer(x):
        return inner(x) + 1.0

    np.testing.assert_allclose(outer(tf.ones([2, 4])), 3 * np.ones([2, 4]))
    np.testing.assert_allclose(outer(-tf.ones([2, 4])), 2 * np.ones([2, 4]))
    assert [m for m in converted if m.startswith("tf_mpt")] == []
    assert converted.count(__name__) >= 2  # outer and inner, the user's code

def _matmul_loop(x, w):
    return tf.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                         [0, x])[1]


def _rewrite_and_check_numbers(f, half_dtype):
    cf = f.get_concrete_function()
    result = tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=half_dtype, strict=True,
                                      fetches=[t.op.name for t in cf.outputs])
    x = tf.random.stateless_uniform([4, 4], seed=(3, 4), minval=-1, maxval=1)
    np.testing.assert_allclose(tf_mpt.rewrite_function(cf, dtype=half_dtype)(x), cf(x),
                               **TOLERANCES[half_dtype])
    return result


def _loop_reading_in_float32(first_op):
    """A tf.function x -> loop of h -> MatMul(first_op(h), w) (w captured, [4, 4])."""
    w = tf.Variable(tf.random.stateless_uniform([4, 4], seed=(1, 2), minval=-0.5, maxval=0.5))

    @tf.function(input_signature=[tf.TensorSpec([4, 4], tf.float32, name="x")])
    def f(x):
        return tf.while_loop(lambda i, h: i < 3,
                             lambda i, h: (i + 1, tf.matmul(first_op(h) * 0.5, w)), [0, x])[1]

    return f


def _body_casts(graph_def):
    loop, = [n for n in graph_def.node if n.op in ("While", "StatelessWhile")]
    body, = [f for f in graph_def.library.function
             if f.signature.name == loop.attr["body"].func.name]
    return loop, sorted(n.name for n in body.node_def if n.op == "Cast")


def test_loop_variable_returned_half_and_read_in_float32_is_declared_half(half_dtype):
    """h -> Tanh -> Mul -> MatMul -> h: the body, rewritten with h float32, runs Tanh and Mul
    in float32 (nothing half before them) and casts h's next value back to float32; declared
    half and the body rewritten again, only the weight read is cast per iteration."""
    result = _rewrite_and_check_numbers(_loop_reading_in_float32(tf.tanh), half_dtype)
    loop, casts = _body_casts(result.graph_def)
    assert casts == [f"while/MatMul/ReadVariableOp-0-CastTo{half_tag(half_dtype)}-TfMpt"]
    assert list(loop.attr["T"].list.type)[3] == tf.as_dtype(half_dtype).as_datatype_enum
    assert result.report.loop_variables_kept_half == 1


def test_a_failed_declaration_trial_keeps_the_first_rewrite_quietly(monkeypatch, caplog,
                                                                     half_dtype):
    """The body rewritten again with a loop variable declared half is a trial: if it fails,
    the body stays as first rewritten, with no warning (strict=True raises)."""
    import logging
    import tf_mpt.rewrite as orchestrator
    from tf_mpt.rewrite import painting
    half = tf.as_dtype(half_dtype).as_datatype_enum
    first_rewrite = painting.rewrite_function_body

    def failing(fdef, *args):
        if any(arg.type == half for arg in fdef.signature.input_arg):
            raise orchestrator.RewriteError("injected failure")
        return first_rewrite(fdef, *args)

    monkeypatch.setattr(painting, "rewrite_function_body", failing)
    cf = _loop_reading_in_float32(tf.tanh).get_concrete_function()
    fetches = [t.op.name for t in cf.outputs]
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        result = tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=half_dtype,
                                          fetches=fetches)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    loop, casts = _body_casts(result.graph_def)
    assert list(loop.attr["T"].list.type)[3] == tf.float32.as_datatype_enum
    assert len(casts) == 3 and result.report.loop_variables_kept_half == 0
    with pytest.raises(orchestrator.RewriteError, match="injected failure"):
        tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=half_dtype, fetches=fetches,
                                 strict=True)


def test_loop_variable_whose_declaration_saves_no_cast_stays_float32(half_dtype):
    """h -> Exp (deny: float32) -> Mul -> MatMul -> h: declared half, h would need a Cast to
    float32 for Exp instead of one out of the MatMul, as many per iteration: not worth it."""
    result = _rewrite_and_check_numbers(_loop_reading_in_float32(tf.exp), half_dtype)
    loop, casts = _body_casts(result.graph_def)
    assert len(casts) == 3  # the weight read, the Mul's output to half, h's next value back
    assert list(loop.attr["T"].list.type)[3] == tf.float32.as_datatype_enum
    assert result.report.loop_variables_kept_half == 0


def test_loop_variable_kept_half_shares_the_cast_of_its_input(half_dtype):
    """Regression (fuzz): x read by a half MatMul and by a loop kept half got two Casts."""
    @tf.function(input_signature=[tf.TensorSpec([4, 4], tf.float32, name="x")])
    def f(x):
        return tf.matmul(x, x) + _matmul_loop(x, x)

    result = _rewrite_and_check_numbers(f, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert result.report.loop_variables_kept_half == 2  # h, and w (= x), a loop invariant
    loop = [n for n in gd.node if n.op in ("While", "StatelessWhile")][0]
    assert list(loop.input)[3] == list(loop.input)[4] == f"x-0-CastTo{tag}-TfMpt"
    assert sorted(n.name for n in gd.node if n.op == "Cast") == [
        "add-0-CastToFp32-TfMpt", f"x-0-CastTo{tag}-TfMpt"]


def test_loop_invariant_is_cast_once_before_the_loop_and_read_unrounded_after(half_dtype):
    """A loop variable the body returns as it is (while_v2 carries captured weights so) and
    only casts to half, at every iteration, is cast once before the loop; a float32 reader of
    the loop's output gets the float32 value the loop was given, not a rounded one."""
    spec = tf.TensorSpec([4, 4], tf.float32)

    @tf.function(input_signature=[spec, spec])
    def f(x, w):
        _, h, w_out = tf.while_loop(lambda i, h, w: i < 3,
                                    lambda i, h, w: (i + 1, tf.tanh(tf.matmul(h, w)), w),
                                    [0, x, w])
        return h, tf.exp(w_out, name="exp")  # Exp is a deny op: float32

    cf = f.get_concrete_function()
    result = tf_mpt.rewrite_graph_def(cf.graph.as_graph_def(), dtype=half_dtype, strict=True,
                                      fetches=[t.op.name for t in cf.outputs])
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert result.report.loop_variables_kept_half == 2
    loop = [n for n in gd.node if n.op in ("While", "StatelessWhile")][0]
    body = [fdef for fdef in gd.library.function
            if fdef.signature.name == loop.attr["body"].func.name][0]
    assert [n.name for n in body.node_def if n.op == "Cast"] == []  # no Cast per iteration
    assert list(loop.input)[3:5] == [f"x-0-CastTo{tag}-TfMpt", f"w-0-CastTo{tag}-TfMpt"]
    assert list(next(n for n in gd.node if n.name == "exp").input) == ["w"]
    rng = np.random.RandomState(5)
    x, w = (rng.uniform(-1, 1, [4, 4]).astype(np.float32) for _ in range(2))
    (h32, e32), (h, e) = cf(x, w), tf_mpt.rewrite_function(cf, dtype=half_dtype)(x, w)
    np.testing.assert_allclose(h, h32, **TOLERANCES[half_dtype])
    np.testing.assert_array_equal(e, e32)  # exp of the exact float32 w


def test_loop_kept_half_feeds_the_next_loop_kept_half_without_a_round_trip(half_dtype):
    """Regression (fuzz): a loop's half output went through Casts to float32 and back."""
    @tf.function(input_signature=[tf.TensorSpec([4, 4], tf.float32, name="x")])
    def f(x):
        return _matmul_loop(_matmul_loop(x, x), x)

    result = _rewrite_and_check_numbers(f, half_dtype)
    gd, tag = result.graph_def, half_tag(half_dtype)
    assert result.report.loop_variables_kept_half == 4  # h and the invariant w, per loop
    first, second = [n for n in gd.node if n.op in ("While", "StatelessWhile")]
    assert list(second.input)[3] == f"{first.name}:3"
    assert sorted(n.name for n in gd.node if n.op == "Cast") == [
        f"{second.name}-3-CastToFp32-TfMpt", f"x-0-CastTo{tag}-TfMpt"]


def test_loop_kept_half_reads_a_half_value_before_the_graphs_own_cast_to_float32(half_dtype):
    """Regression (fuzz): x -> Cast(half) -> Cast(float32) -> loop kept half got a third Cast,
    back to half, instead of reading the half value."""
    half = tf.as_dtype(half_dtype)

    @tf.function(input_signature=[tf.TensorSpec([4, 4], tf.float32, name="x")])
    def f(x):
        return _matmul_loop(tf.cast(tf.cast(x, half, name="to_half"), tf.float32,
                                    name="to_float"), x)

    result = _rewrite_and_check_numbers(f, half_dtype)
    gd = result.graph_def
    assert result.report.loop_variables_kept_half == 2  # h and the invariant x
    loop = [n for n in gd.node if n.op in ("While", "StatelessWhile")][0]
    assert list(loop.input)[3] == "to_half"
    assert not [n.name for n in gd.node if n.op == "Cast" and n.input[0] == "to_float"]


def _half_value_into_a_looping_function():
    """x -> [MatMul allow1] -> call { h -> loop of MatMuls over h } -> out. Returns the graph
    and the call's name."""
    @tf.function
    def looped(h):
        return _matmul_loop(h, tf.eye(4) * 0.5)

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        call = looped(tf.matmul(x, x, name="allow1"))
        tf.identity(call, name="out")
    return graph, call.op.name


def test_half_argument_of_a_function_that_loops_over_it_crosses_in_one_rewrite(half_dtype):
    """Regression (fuzz): the loop variable inside the called function was kept half after
    the call's arguments were decided, so only a second rewrite let the argument cross in
    half (the rewrite was not idempotent)."""
    graph, call_name = _half_value_into_a_looping_function()
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype, fetches=["out"],
                                      strict=True)
    again = tf_mpt.rewrite_graph_def(result.graph_def, dtype=half_dtype, fetches=["out"],
                                     strict=True)
    assert not again.modified, again.report.summary()
    assert again.graph_def == result.graph_def
    assert result.report.loop_variables_kept_half == 2  # h and the invariant 0.5 * eye
    assert result.report.call_values_kept_half == 1
    call = [n for n in result.graph_def.node if n.name == call_name][0]
    assert list(call.input) == ["allow1"]  # the half MatMul output, no Cast on either side
    feeds = {"x:0": np.random.RandomState(0).uniform(-1, 1, [4, 4]).astype(np.float32)}
    np.testing.assert_allclose(run(result.graph_def, "out:0", feeds),
                               run(graph.as_graph_def(), "out:0", feeds), **TOLERANCES[half_dtype])


def test_rewrite_whose_only_change_is_at_a_call_boundary_reports_modified(half_dtype):
    """Regression (fuzz): when only the boundary passes changed the graph, the result said
    modified=False. Here the second rewrite no longer fetches the call, so its argument and
    result may cross in half, and nothing else changes."""
    graph, call_name = _half_value_into_a_looping_function()
    first = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=half_dtype,
                                     fetches=["out", call_name], strict=True)
    second = tf_mpt.rewrite_graph_def(first.graph_def, dtype=half_dtype, fetches=["out"],
                                      strict=True)
    assert first.report.call_values_kept_half == 0
    assert second.report.call_values_kept_half == 1
    assert second.modified and second.graph_def != first.graph_def


@pytest.mark.parametrize("kept", ["fetched", "opted_out"])
def test_fetched_or_opted_out_loop_keeps_its_loop_variables_float32(kept, half_dtype):
    """Regression (fuzz): a fetched While output, or an opted-out While, was switched to half."""
    def loop_graph(opted_out):
        @tf.function(input_signature=[tf.TensorSpec([4, 4], tf.float32, name="x")])
        def f(x):
            with tf_mpt.keep_fp32() if opted_out else contextlib.nullcontext():
                return _matmul_loop(x, x) * 2.0
        cf = f.get_concrete_function()
        return cf.graph.as_graph_def(), [t.op.name for t in cf.outputs]

    graph_def, fetches = loop_graph(opted_out=False)
    plain = tf_mpt.rewrite_graph_def(graph_def, dtype=half_dtype, fetches=fetches, strict=True)
    assert plain.report.loop_variables_kept_half == 2  # h, invariant x: what `kept` prevents
    if kept == "opted_out":
        graph_def, fetches = loop_graph(opted_out=True)
    loop = [n for n in graph_def.node if n.op in ("While", "StatelessWhile")][0]
    if kept == "fetched":
        fetches.append(f"{loop.name}:3")
    result = tf_mpt.rewrite_graph_def(graph_def, dtype=half_dtype, fetches=fetches, strict=True)
    assert result.report.loop_variables_kept_half == 0
    assert [n for n in result.graph_def.node if n.name == loop.name][0].attr == loop.attr


def test_gradient_tape_around_a_tf_mpt_function_reaches_the_variables_it_reads(half_dtype):
    """A forward pass in tf_mpt.function, the tape outside it (eagerly, or in another
    tf.function called after the rewrite was built): the gradients are float32's, not None
    (the rebuilt function reads the variables, so calls record the access)."""
    w = tf.Variable(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3))
    forward = tf_mpt.function(lambda x: tf.tanh(tf.matmul(x, w)), dtype=half_dtype)
    x = tf.constant(np.linspace(0.0, 1.0, 8, dtype=np.float32).reshape(2, 4))
    forward(x)  # built eagerly, before either tape

    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(forward(x))
    eager_grad = tape.gradient(loss, w)

    @tf.function
    def graph_grad(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(forward(x))
        return tape.gradient(loss, w)

    with tf.GradientTape() as tape:
        expected = tape.gradient(tf.reduce_sum(tf.tanh(tf.matmul(x, w))), w)
    assert eager_grad is not None and eager_grad.dtype == tf.float32
    np.testing.assert_allclose(eager_grad.numpy(), expected.numpy(), **TOLERANCES[half_dtype])
    np.testing.assert_allclose(graph_grad(x).numpy(), expected.numpy(),
                               **TOLERANCES[half_dtype])


def test_tf_keras_lstm_runs_its_rewritten_implementation(half_dtype):
    """tf_keras's LSTM calls gpu_lstm_with_fallback and TensorFlow's implementation selector
    swaps in the function with the same `api_implements` preferred on this device
    (standard_lstm on a CPU). The rewritten copies carry their own `api_implements`, so the
    selector picks the rewritten standard_lstm, not the float32 original (which ran before:
    the rewrite converted the loop and none of its Casts ran)."""
    tf_keras = pytest.importorskip("tf_keras")
    tf_keras.utils.set_random_seed(0)
    tokens = tf_keras.Input((12,), dtype="int32")
    hidden = tf_keras.layers.LSTM(32)(tf_keras.layers.Embedding(50, 16)(tokens))
    model = tf_keras.Model(tokens, tf_keras.layers.Dense(4)(hidden))
    x = tf.constant(np.random.RandomState(0).randint(0, 50, size=(8, 12)), tf.int32)
    expected = model(x, training=False).numpy()
    step = tf_mpt.function(lambda t: model(t, training=False), dtype=half_dtype,
                           target="rules")
    step(x)  # traced and rewritten
    got = []
    ran = executed_ops(lambda: got.append(step(x)))
    assert got[0].dtype == tf.float32
    loop_casts = [name for name, op, _ in ran if op == "Cast" and "while" in name
                  and name.endswith("-TfMpt")]
    assert loop_casts, sorted({op for _, op, _ in ran})  # the rewritten cell ran
    np.testing.assert_allclose(got[0].numpy(), expected, **TOLERANCES[half_dtype])
