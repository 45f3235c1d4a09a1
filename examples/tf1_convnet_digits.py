"""A plain TF1 Session script: a conv net with batch norm on the 8x8 digits.

conv 3x3 -> fused batch norm -> relu -> max pool -> conv -> relu -> dense, trained with
tf.compat.v1.train.MomentumOptimizer. Nothing here mentions tf_mpt. Run it in mixed
precision with `TF_MPT_ENABLE=1 python examples/tf1_convnet_digits.py`.
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
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    x_all = (digits.images[order] / 16.0).astype(np.float32)[..., None]
    y_all = digits.target[order].astype(np.int32)
    x_train, y_train, x_test, y_test = x_all[:1408], y_all[:1408], x_all[1408:], y_all[1408:]

    tf1.set_random_seed(0)
    images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    init = tf1.glorot_uniform_initializer(seed=0)
    k1 = tf1.get_variable("conv1/kernel", [3, 3, 1, 32], initializer=init)
    gamma = tf1.get_variable("bn1/gamma", [32], initializer=tf1.ones_initializer())
    beta = tf1.get_variable("bn1/beta", [32], initializer=tf1.zeros_initializer())
    h = tf.nn.conv2d(images, k1, 1, "SAME")
    mean, variance = tf.nn.moments(h, [0, 1, 2])
    h = tf.nn.batch_normalization(h, mean, variance, beta, gamma, 1e-3)
    h = tf.nn.max_pool2d(tf.nn.relu(h), 2, 2, "VALID")
    k2 = tf1.get_variable("conv2/kernel", [3, 3, 32, 64], initializer=init)
    h = tf.nn.relu(tf.nn.conv2d(h, k2, 1, "SAME"))
    h = tf.reshape(h, [-1, 4 * 4 * 64])
    w = tf1.get_variable("dense/kernel", [4 * 4 * 64, 10], initializer=init)
    logits = tf.matmul(h, w)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                        logits=logits))
    step = tf1.train.get_or_create_global_step()
    train = tf1.train.MomentumOptimizer(0.02, 0.9).minimize(loss, global_step=step)
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
