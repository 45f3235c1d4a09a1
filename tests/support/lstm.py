"""A hand-written LSTM over a TensorArray in a while loop: TF1 (control flow v1) and TF2."""

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
T, B, D, H = 6, 4, 8, 16


def weights(seed=0):
    rng = np.random.RandomState(seed)
    return (rng.uniform(-0.3, 0.3, (D, 4 * H)).astype(np.float32),
            rng.uniform(-0.3, 0.3, (H, 4 * H)).astype(np.float32),
            np.zeros(4 * H, np.float32))


def inputs(seed=1):
    return np.random.RandomState(seed).uniform(-1, 1, (T, B, D)).astype(np.float32)


def lstm_loss(xs, wx, wh, b):
    """Mean square of all hidden states of an LSTM run with tf.while_loop + TensorArray."""
    ta = tf.TensorArray(tf.float32, size=T)

    def body(t, h, c, ta):
        z = tf.matmul(xs[t], wx) + tf.matmul(h, wh) + b
        i, f, g, o = tf.split(z, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
        return t + 1, h, c, ta.write(t, h)

    _, _, _, ta = tf.while_loop(lambda t, *_: t < T, body,
                                [tf.constant(0), tf.zeros([B, H]), tf.zeros([B, H]), ta])
    return tf.reduce_mean(tf.square(ta.stack()), name="loss")


def tf2_loss_and_grads(nested=False):
    """A ConcreteFunction xs -> (loss, [d loss / d wx, wh, b]) over fresh tf.Variables (TF2:
    functional While, TensorLists). nested: the LSTM and its gradient run in an inner
    tf.function the outer one calls (a StatefulPartitionedCall), so its lists are made inside
    a library function. Returns (the ConcreteFunction, the variables it captures)."""
    variables = [tf.Variable(v) for v in weights()]

    def loss_and_grads(xs):
        with tf.GradientTape() as tape:
            loss = lstm_loss(xs, *variables)
        return loss, tape.gradient(loss, variables)

    spec = tf.TensorSpec([T, B, D], tf.float32)
    if nested:
        inner = tf.function(loss_and_grads)
        outer = tf.function(lambda xs: inner(xs * 1.0), input_signature=[spec])
    else:
        outer = tf.function(loss_and_grads, input_signature=[spec])
    return outer.get_concrete_function(), variables


def build_v1_graph():
    """TF1 graph, control flow v1: loss and gradients w.r.t. the three ref variables."""
    tf1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            xs = tf1.placeholder(tf.float32, [T, B, D], name="xs")
            wx0, wh0, b0 = weights()
            variables = [tf1.get_variable(n, initializer=v, use_resource=False)
                         for n, v in (("wx", wx0), ("wh", wh0), ("b", b0))]
            loss = lstm_loss(xs, *variables)
            grads = tf.gradients(loss, variables)
            for k, g in enumerate(grads):
                tf.identity(g, name=f"grad{k}")
            tf1.global_variables_initializer()
    finally:
        tf1.enable_control_flow_v2()
    return graph
