"""The examples' digits (examples/digits.npz: 1797 8x8 images, UCI's set as scikit-learn ships
it) and TF1 models on them."""

import os
import types

import numpy as np
import tensorflow as tf

import tf_mpt

tf1 = tf.compat.v1
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                    "digits.npz")

BATCH = 64
TRAIN = 1408  # 22 batches; the remaining 389 images are the test set


def load():
    """(x_train, y_train, x_test, y_test), images scaled to [0, 1], shuffled with a fixed seed."""
    with np.load(DATA) as stored:
        digits = types.SimpleNamespace(images=stored["images"].astype(np.float64),
                                       target=stored["target"].astype(np.int64))
    order = np.random.RandomState(0).permutation(len(digits.target))
    x = (digits.images[order] / 16.0).astype(np.float32)[..., None]
    y = digits.target[order].astype(np.int32)
    return x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:]


def build(kind, compute_dtype=tf.float32, loss_scale=None, seed=0):
    """A TF1 training graph: kind 'mlp' or 'conv'.

    compute_dtype: a half dtype builds the model in that dtype with float32 master weights
        (tf_mpt.mixed_precision_scope); float32 builds the plain model.
    loss_scale: None, or a loss scale for tf_mpt.LossScaleOptimizer.
    """
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
        labels = tf1.placeholder(tf.int32, [None], name="labels")
        init = tf1.glorot_uniform_initializer(seed=seed)
        half = compute_dtype != tf.float32
        scope = tf_mpt.mixed_precision_scope(compute_dtype) if half else tf1.variable_scope("")
        with scope:
            x = tf.cast(images, compute_dtype)
            if kind == "conv":
                k = tf1.get_variable("conv/kernel", [3, 3, 1, 16], compute_dtype, init)
                x = tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(x, k, 1, "SAME")), 2, 2, "VALID")
                x = tf.reshape(x, [-1, 4 * 4 * 16])
            else:
                x = tf.reshape(x, [-1, 64])
            w1 = tf1.get_variable("fc1/kernel", [x.shape[1], 64], compute_dtype, init)
            b1 = tf1.get_variable("fc1/bias", [64], compute_dtype, tf1.zeros_initializer())
            x = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w1), b1))
            w2 = tf1.get_variable("fc2/kernel", [64, 10], compute_dtype, init)
            logits = tf.cast(tf.matmul(x, w2), tf.float32, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits), name="loss")
        correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
        tf.reduce_mean(tf.cast(correct, tf.float32), name="accuracy")
        opt = tf1.train.MomentumOptimizer(0.05, 0.9)
        if loss_scale is not None:
            opt = tf_mpt.LossScaleOptimizer(opt, loss_scale)
        opt.minimize(loss, global_step=tf1.train.get_or_create_global_step(), name="train")
        tf1.global_variables_initializer()
    return graph


FETCHES = ["loss", "accuracy", "train", "init"]


def train_and_evaluate(graph, data, epochs, config=None, average_last=1):
    """Trains with fixed minibatches; returns (first loss, last loss, test accuracy).

    config: the Session's ConfigProto (None: TensorFlow's default).
    average_last: the test accuracy is the mean over the last this many epochs (evaluated
        after each). With Momentum 0.9 a single epoch's accuracy swings by 2 points from
        epoch to epoch (float32 itself: 97.4% after 6 epochs, 95.4% after 8), more than the
        1 point a half-precision run is allowed to differ by.
    """
    x_train, y_train, x_test, y_test = data
    losses, accuracies = [], []
    with tf1.Session(graph=graph, config=config) as sess:
        sess.run("init")
        for epoch in range(epochs):
            for start in range(0, TRAIN, BATCH):
                feeds = {"images:0": x_train[start:start + BATCH],
                         "labels:0": y_train[start:start + BATCH]}
                losses.append(sess.run(["loss:0", "train"], feeds)[0])
            if epoch >= epochs - average_last:
                accuracies.append(
                    sess.run("accuracy:0", {"images:0": x_test, "labels:0": y_test}))
    return losses[0], losses[-1], float(np.mean(accuracies))
