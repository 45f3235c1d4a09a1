"""Rewrite a TF1 conv-net training graph with tf_mpt and train it in float32 and mixed precision.

The graph: conv 3x3 -> fused batch norm -> relu -> max pool -> conv -> relu -> dense ->
sparse softmax cross-entropy, Momentum. The data: 8x8 images of 10 classes, each class a
fixed random pattern plus noise. Prints the rewrite summary, what happened per op type, and
the float32 and mixed losses, accuracies and step times side by side.

Usage: python examples/rewrite_conv_net.py [--dtype float16|bfloat16] [--steps N]
"""

import argparse
import collections
import time

import numpy as np
import tensorflow as tf

import tf_mpt

tf1 = tf.compat.v1
BATCH, SIDE, CLASSES = 64, 8, 10


def native_bfloat16():
    """True if the CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def build_graph():
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        images = tf1.placeholder(tf.float32, [BATCH, SIDE, SIDE, 1], name="images")
        labels = tf1.placeholder(tf.int32, [BATCH], name="labels")
        k1 = tf1.get_variable("conv1/kernel", [3, 3, 1, 32], use_resource=False)
        x = tf.nn.conv2d(images, k1, 1, "SAME")
        gamma = tf1.get_variable("bn1/gamma", [32], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("bn1/beta", [32], initializer=tf1.zeros_initializer())
        x, _, _ = tf1.nn.fused_batch_norm(x, gamma, beta, is_training=True)
        x = tf.nn.max_pool2d(tf.nn.relu(x), 2, 2, "VALID")
        k2 = tf1.get_variable("conv2/kernel", [3, 3, 32, 64], use_resource=False)
        x = tf.nn.relu(tf.nn.conv2d(x, k2, 1, "SAME"))
        x = tf.reshape(x, [BATCH, -1])
        w = tf1.get_variable("dense/kernel", [x.shape[1], CLASSES], use_resource=False)
        logits = tf.matmul(x, w, name="logits")
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
            name="loss")
        correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
        tf.reduce_mean(tf.cast(correct, tf.float32), name="accuracy")
        tf1.train.MomentumOptimizer(0.02, 0.9).minimize(loss, name="train")
        tf1.global_variables_initializer()
    return graph


def make_data(steps):
    rng = np.random.RandomState(0)
    patterns = rng.uniform(0, 1, (CLASSES, SIDE, SIDE, 1)).astype(np.float32)
    batches = []
    for _ in range(steps + 1):
        labels = rng.randint(0, CLASSES, BATCH).astype(np.int32)
        noise = rng.normal(0, 0.6, (BATCH, SIDE, SIDE, 1)).astype(np.float32)
        batches.append((patterns[labels] + noise, labels))
    return batches


def train(graph, batches):
    losses, times = [], []
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        for images, labels in batches[:-1]:
            start = time.perf_counter()
            loss, _ = sess.run(["loss:0", "train"], {"images:0": images, "labels:0": labels})
            times.append(time.perf_counter() - start)
            losses.append(loss)
        images, labels = batches[-1]
        accuracy = sess.run("accuracy:0", {"images:0": images, "labels:0": labels})
    return losses, accuracy, float(np.median(times[len(times) // 4:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float16", "bfloat16"],
                        default="bfloat16" if native_bfloat16() else "float16")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    graph = build_graph()
    fetches = ["loss", "accuracy", "train", "init"]
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=args.dtype, fetches=fetches)
    print(result.report.summary())
    per_op = collections.defaultdict(collections.Counter)
    for decision in result.report.decisions.values():
        per_op[decision.op][decision.colour] += 1
    print(f"{'op':36} " + " ".join(f"{c:>6}" for c in ("allow", "deny", "fp32")))
    for op, counts in sorted(per_op.items()):
        if counts["allow"] or counts["deny"]:
            print(f"{op:36} " + " ".join(f"{counts[c]:6d}" for c in ("allow", "deny", "fp32")))

    mixed = tf_mpt.rewrite_graph(graph, dtype=args.dtype, fetches=fetches)
    batches = make_data(args.steps)
    print(f"\nCPU native bfloat16: {native_bfloat16()}; training {args.steps} steps")
    rows = []
    for label, g in (("float32", graph), (f"tf_mpt {args.dtype}", mixed)):
        losses, accuracy, step = train(g, batches)
        rows.append((label, losses[0], losses[-1], accuracy, step))
    print(f"{'variant':18} {'first loss':>10} {'last loss':>10} {'accuracy':>9} {'ms/step':>8}")
    for label, first, last, accuracy, step in rows:
        print(f"{label:18} {first:10.4f} {last:10.4f} {accuracy:9.3f} {step * 1e3:8.2f}")


if __name__ == "__main__":
    main()
