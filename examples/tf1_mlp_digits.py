"""A plain TF1 Session script: an MLP on the 8x8 digits, trained with Momentum.

Nothing here mentions tf_mpt. Run it in mixed precision with
`TF_MPT_ENABLE=1 python examples/tf1_mlp_digits.py` or `python -m tf_mpt examples/...`.
Prints the final test accuracy and the median step time.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

from digits_data import load_digits

tf1 = tf.compat.v1
tf1.disable_v2_behavior()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    x_all = (digits.data[order] / 16.0).astype(np.float32)
    y_all = digits.target[order].astype(np.int32)
    x_train, y_train, x_test, y_test = x_all[:1408], y_all[:1408], x_all[1408:], y_all[1408:]

    tf1.set_random_seed(0)
    x = tf1.placeholder(tf.float32, [None, 64], name="x")
    y = tf1.placeholder(tf.int32, [None], name="y")
    init = tf1.glorot_uniform_initializer(seed=0)
    w1 = tf1.get_variable("fc1/kernel", [64, 128], initializer=init)
    b1 = tf1.get_variable("fc1/bias", [128], initializer=tf1.zeros_initializer())
    w2 = tf1.get_variable("fc2/kernel", [128, 10], initializer=init)
    hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
    logits = tf.matmul(hidden, w2)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                        logits=logits))
    step = tf1.train.get_or_create_global_step()
    train = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=step)
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y),
                                      tf.float32))
    times, losses = [], []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(args.epochs):
            for start in range(0, len(y_train), args.batch):
                feed = {x: x_train[start:start + args.batch], y: y_train[start:start + args.batch]}
                began = time.perf_counter()
                value, _ = sess.run([loss, train], feed)
                times.append(time.perf_counter() - began)
                losses.append(value)
        test_accuracy = sess.run(accuracy, {x: x_test, y: y_test})
    print(f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}")
    print(f"accuracy={test_accuracy:.4f} step_ms={np.median(times[10:]) * 1e3:.3f}")


if __name__ == "__main__":
    main()
