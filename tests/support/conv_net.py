"""A small TF1 conv net training graph used by tests, examples and benchmarks.

conv 3x3 -> fused batch norm (training) -> relu -> max pool -> conv 3x3 -> relu -> dense
-> sparse softmax cross-entropy, with tf.gradients and a Momentum update (tf.compat.v1).
"""

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

IMAGE = (8, 8, 1)
CLASSES = 10


def build(batch=32, use_resource=False, seed=0, optimizer="momentum", lr=0.05):
    """Returns (graph, names) with names of feeds, loss, logits, train op and init op."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, (batch,) + IMAGE, name="images")
        labels = tf1.placeholder(tf.int32, (batch,), name="labels")
        init = tf1.glorot_uniform_initializer(seed=seed)

        def var(name, shape, initializer=init):
            return tf1.get_variable(name, shape, initializer=initializer,
                                    use_resource=use_resource)

        k1 = var("conv1/kernel", [3, 3, IMAGE[2], 16])
        x = tf.nn.conv2d(images, k1, 1, "SAME", name="conv1/Conv2D")
        gamma = var("bn1/gamma", [16], tf1.ones_initializer())
        beta = var("bn1/beta", [16], tf1.zeros_initializer())
        x, _, _ = tf1.nn.fused_batch_norm(x, gamma, beta, is_training=True, name="bn1")
        x = tf.nn.relu(x, name="relu1")
        x = tf.nn.max_pool2d(x, 2, 2, "VALID", name="pool1")
        k2 = var("conv2/kernel", [3, 3, 16, 32])
        b2 = var("conv2/bias", [32], tf1.zeros_initializer())
        x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, k2, 1, "SAME"), b2), name="relu2")
        x = tf.reshape(x, [batch, -1], name="flatten")
        w3 = var("dense/kernel", [x.shape[1], CLASSES])
        b3 = var("dense/bias", [CLASSES], tf1.zeros_initializer())
        logits = tf.nn.bias_add(tf.matmul(x, w3), b3, name="logits")
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        loss = tf.reduce_mean(xent, name="loss")
        tf.reduce_mean(  # fetched by name
            tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float32),
            name="accuracy")
        if optimizer == "momentum":
            opt = tf1.train.MomentumOptimizer(lr, 0.9)
        else:
            opt = tf1.train.GradientDescentOptimizer(lr)
        global_step = tf1.train.get_or_create_global_step()
        train = opt.minimize(loss, global_step=global_step, name="train")
        tf1.global_variables_initializer()
    names = dict(images="images:0", labels="labels:0", loss="loss:0", logits="logits:0",
                 accuracy="accuracy:0", train=train.name, init="init")
    return graph, names


def batch(batch=32, seed=0):
    """A deterministic batch of images and labels."""
    rng = np.random.RandomState(seed)
    images = rng.uniform(0, 1, (batch,) + IMAGE).astype(np.float32)
    labels = rng.randint(0, CLASSES, batch).astype(np.int32)
    return images, labels


def train_losses(graph, names, steps, batch_size=32, seed=0):
    """Runs `steps` training steps in a Session; returns per-step losses and final variables."""
    images, labels = batch(batch_size, seed)
    feeds = {names["images"]: images, names["labels"]: labels}
    losses = []
    with tf1.Session(graph=graph) as sess:
        sess.run(names["init"])
        for _ in range(steps):
            loss, _ = sess.run([names["loss"], names["train"]], feeds)
            losses.append(loss)
        logits = sess.run(names["logits"], feeds)
        with graph.as_default():
            variables = {v.op.name: sess.run(v) for v in tf1.global_variables()}
    return np.array(losses), logits, variables
