"""TF2: rewrite_function and tf_mpt.function on tf.function graphs."""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from conftest import TOLERANCES
import digits

ACCURACY_POINTS = 0.01


MATRIX_OPS = ("MatMul", "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")


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
