"""A tf_cnn_benchmarks-style TF1 training script: ResNet-20 (CIFAR layout: 3 stages of 3
basic blocks, 16/32/64 channels, fused batch norm) on synthetic 32x32x3 images, Momentum with
a global step, a Saver checkpoint at the end. Nothing here mentions tf_mpt.

    python benchmarks/tf1_resnet_cifar.py [--steps 40] [--batch 64]

Prints `first_loss=... last_loss=...` and `step_ms=...` (median of the steps after the first
10), the format benchmarks/session_paths.py reads.
"""

import argparse
import os
import tempfile
import time

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_v2_behavior()


def conv_bn(x, channels, stride, name, training, relu=True):
    with tf1.variable_scope(name):
        kernel = tf1.get_variable("kernel", [3, 3, x.shape[-1], channels],
                                  initializer=tf1.variance_scaling_initializer(seed=1))
        y = tf.nn.conv2d(x, kernel, stride, "SAME")
        scale = tf1.get_variable("gamma", [channels], initializer=tf1.ones_initializer())
        offset = tf1.get_variable("beta", [channels], initializer=tf1.zeros_initializer())
        y, _, _ = tf1.nn.fused_batch_norm(y, scale, offset, is_training=training)
        return tf.nn.relu(y) if relu else y


def resnet20(images, classes=10, training=True):
    x = conv_bn(images, 16, 1, "stem", training)
    for stage, channels in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"stage{stage}/block{block}"
            shortcut = x
            if stride != 1 or x.shape[-1] != channels:
                shortcut = conv_bn(x, channels, stride, name + "/shortcut", training, False)
            y = conv_bn(x, channels, stride, name + "/a", training)
            y = conv_bn(y, channels, 1, name + "/b", training, relu=False)
            x = tf.nn.relu(y + shortcut)
    pooled = tf.reduce_mean(x, axis=[1, 2])
    weights = tf1.get_variable("fc/kernel", [64, classes],
                               initializer=tf1.glorot_uniform_initializer(seed=2))
    return tf.matmul(pooled, weights) + tf1.get_variable("fc/bias", [classes],
                                                         initializer=tf1.zeros_initializer())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    rng = np.random.RandomState(0)
    images_np = rng.rand(args.batch * 4, 32, 32, 3).astype(np.float32)
    labels_np = rng.randint(0, 10, args.batch * 4).astype(np.int32)
    images = tf1.placeholder(tf.float32, [args.batch, 32, 32, 3], name="images")
    labels = tf1.placeholder(tf.int32, [args.batch], name="labels")
    logits = resnet20(images)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                        logits=logits))
    step = tf1.train.get_or_create_global_step()
    train = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=step)
    saver = tf1.train.Saver()
    times, losses = [], []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for i in range(args.steps):
            rows = slice((i % 4) * args.batch, (i % 4 + 1) * args.batch)
            began = time.perf_counter()
            value, _ = sess.run([loss, train], {images: images_np[rows],
                                                labels: labels_np[rows]})
            times.append(time.perf_counter() - began)
            losses.append(value)
        with tempfile.TemporaryDirectory() as directory:
            saver.save(sess, os.path.join(directory, "model"), global_step=step)
    print(f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}")
    print(f"step_ms={np.median(times[10:]) * 1e3:.3f}")


if __name__ == "__main__":
    main()
