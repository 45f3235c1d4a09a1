"""A plain TF1 Session script: an LSTM over a tf.compat.v1.while_loop on the 8x8 digits.

Each 8x8 digit is read as a sequence of 8 rows; the LSTM (hand-written, its states carried by
a v1 while loop, its outputs collected in a TensorArray) feeds a dense classifier trained with
Adam. Nothing here mentions tf_mpt. Run it in mixed precision with
`TF_MPT_ENABLE=1 python examples/tf1_lstm_digits.py`.
Prints the final test accuracy and the median step time.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

from digits_data import load_digits

tf1 = tf.compat.v1
tf1.disable_v2_behavior()
HIDDEN, STEPS, FEATURES = 64, 8, 8


def lstm(rows, wx, wh, b):
    """rows: [STEPS, batch, FEATURES] -> the last hidden state."""
    batch = tf.shape(rows)[1]
    outputs = tf1.TensorArray(tf.float32, size=STEPS)

    def body(t, h, c, outputs):
        z = tf.matmul(rows[t], wx) + tf.matmul(h, wh) + b
        i, f, g, o = tf.split(z, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
        return t + 1, h, c, outputs.write(t, h)

    zeros = tf.zeros(tf.stack([batch, HIDDEN]))
    _, h, _, outputs = tf1.while_loop(lambda t, *_: t < STEPS, body,
                                      [tf.constant(0), zeros, zeros, outputs])
    return h


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=15)  # converged: accuracy is stable
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    x_all = (digits.images[order] / 16.0).astype(np.float32)
    y_all = digits.target[order].astype(np.int32)
    x_train, y_train, x_test, y_test = x_all[:1408], y_all[:1408], x_all[1408:], y_all[1408:]

    tf1.set_random_seed(0)
    images = tf1.placeholder(tf.float32, [None, STEPS, FEATURES], name="images")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    init = tf1.glorot_uniform_initializer(seed=0)
    wx = tf1.get_variable("lstm/wx", [FEATURES, 4 * HIDDEN], initializer=init)
    wh = tf1.get_variable("lstm/wh", [HIDDEN, 4 * HIDDEN], initializer=init)
    b = tf1.get_variable("lstm/b", [4 * HIDDEN], initializer=tf1.zeros_initializer())
    w = tf1.get_variable("dense/kernel", [HIDDEN, 10], initializer=init)
    h = lstm(tf.transpose(images, [1, 0, 2]), wx, wh, b)
    logits = tf.matmul(h, w)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                        logits=logits))
    train = tf1.train.AdamOptimizer(0.01).minimize(loss)
    accuracy = tf.reduce_mean(tf.cast(
        tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float32))
    times, losses = [], []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(args.epochs):
            for start in range(0, len(y_train), args.batch):
                feed = {images: x_train[start:start + args.batch],
                        labels: y_train[start:start + args.batch]}
                began = time.perf_counter()
                value, _ = sess.run([loss, train], feed)
                times.append(time.perf_counter() - began)
                losses.append(value)
        test_accuracy = sess.run(accuracy, {images: x_test, labels: y_test})
    print(f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}")
    print(f"accuracy={test_accuracy:.4f} step_ms={np.median(times[10:]) * 1e3:.3f}")


if __name__ == "__main__":
    main()
