"""A TF1 script built with tf.compat.v1.layers, as most TF1 model code is: conv2d, batch
normalization (its moving averages updated through UPDATE_OPS), max pooling, flatten,
dropout and dense layers, MomentumOptimizer, a Saver checkpoint. Nothing here mentions
tf_mpt. Run it in mixed precision with `TF_MPT_ENABLE=1 python examples/tf1_layers_digits.py`.

On TensorFlow 2.16+ tf.compat.v1.layers come from tf_keras and need TF_USE_LEGACY_KERAS=1
before their first use (set below, as such scripts do); install tf_keras with
`python -m pip install --no-deps "tf_keras==2.21.*"` (its metadata asks for the full
`tensorflow` wheel, which must not go beside tensorflow-cpu).
Prints the first and last training loss, the final test accuracy and the median step time.
"""

import argparse
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from digits_data import load_digits  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_v2_behavior()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--checkpoint", help="save the trained variables with a Saver here")
    args = parser.parse_args()

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    x_all = (digits.images[order] / 16.0).astype(np.float32)[..., None]
    y_all = digits.target[order].astype(np.int32)
    x_train, y_train, x_test, y_test = x_all[:1408], y_all[:1408], x_all[1408:], y_all[1408:]

    tf1.set_random_seed(0)
    images = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="images")
    labels = tf1.placeholder(tf.int32, [None], name="labels")
    training = tf1.placeholder_with_default(False, [], name="training")
    init = tf1.glorot_uniform_initializer(seed=0)
    h = tf1.layers.conv2d(images, 32, 3, padding="same", use_bias=False,
                          kernel_initializer=init, name="conv1")
    h = tf1.layers.batch_normalization(h, momentum=0.9, training=training, name="bn1")
    h = tf1.layers.max_pooling2d(tf.nn.relu(h), 2, 2, name="pool1")
    h = tf1.layers.conv2d(h, 64, 3, padding="same", activation=tf.nn.relu,
                          kernel_initializer=init, name="conv2")
    h = tf1.layers.flatten(h, name="flatten")
    h = tf1.layers.dropout(h, 0.1, training=training, seed=0, name="dropout")
    h = tf1.layers.dense(h, 64, activation=tf.nn.relu, kernel_initializer=init, name="fc1")
    logits = tf1.layers.dense(h, 10, kernel_initializer=init, name="logits")
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf1.train.get_or_create_global_step()
    with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
        train = tf1.train.MomentumOptimizer(0.02, 0.9).minimize(loss, global_step=step)
    accuracy = tf.reduce_mean(tf.cast(
        tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float32))
    saver = tf1.train.Saver()
    times, losses = [], []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(args.epochs):
            for start in range(0, len(y_train), args.batch):
                feed = {images: x_train[start:start + args.batch],
                        labels: y_train[start:start + args.batch], training: True}
                began = time.perf_counter()
                value, _ = sess.run([loss, train], feed)
                times.append(time.perf_counter() - began)
                losses.append(value)
        test_accuracy = sess.run(accuracy, {images: x_test, labels: y_test})
        if args.checkpoint:
            saver.save(sess, args.checkpoint)
    print(f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}")
    print(f"accuracy={test_accuracy:.4f} step_ms={np.median(times[10:]) * 1e3:.3f}")


if __name__ == "__main__":
    main()
