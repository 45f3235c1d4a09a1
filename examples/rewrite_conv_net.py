"""Rewrite a TF1 conv-net training graph with tf_mpt and train it in float32 and mixed precision.

The graph: three blocks of conv 3x3 (32, 64, 128 channels) -> fused batch norm -> relu ->
max pool, then dense -> sparse softmax cross-entropy, Momentum; batch 64 of 32x32x3 images
of 10 classes, each class a fixed random pattern plus noise. Prints the rewrite summary, what
happened per op type, the float32 and mixed losses, both models' accuracy on the same
held-out images (4096, not seen in training) and the difference with its standard error,
the ops each executed in half precision in a training step (counted in the graphs
TensorFlow ran), and the step times of both measured interleaved (rounds alternating the two
Sessions), with the speed-up.

--dtype auto (default) picks as TF_MPT_DTYPE=auto does: bfloat16 on a CPU with native
bfloat16 (avx512_bf16 / amx_bf16); on any other CPU it says so and trains float32 only (half
would be slower there); --dtype bfloat16 or float16 forces one.

Usage: python examples/rewrite_conv_net.py [--dtype auto|float16|bfloat16] [--steps N]
"""

import argparse
import collections
import os
import time

import numpy as np
import tensorflow as tf

import tf_mpt

from tf_mpt import _cpu

tf1 = tf.compat.v1
BATCH, SIDE, CHANNELS, CLASSES = 64, 32, 3, 10
WIDTHS = (32, 64, 128)
TIMING_ROUNDS, TIMING_STEPS = 7, 5
HELD_OUT_BATCHES = 64  # 4096 images: a difference of 1 point is ~40 images


def native_bfloat16():
    """True if the CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16); TF_MPT_CPU_FLAGS
    decides instead when set, as it does for TF_MPT_DTYPE=auto."""
    return _cpu.has_native_bfloat16(_cpu.cpu_flags(tf_mpt.Config.from_env(os.environ)))


def build_graph():
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        images = tf1.placeholder(tf.float32, [BATCH, SIDE, SIDE, CHANNELS], name="images")
        labels = tf1.placeholder(tf.int32, [BATCH], name="labels")
        x, depth = images, CHANNELS
        for i, width in enumerate(WIDTHS):
            k = tf1.get_variable(f"conv{i}/kernel", [3, 3, depth, width], use_resource=False)
            x = tf.nn.conv2d(x, k, 1, "SAME")
            gamma = tf1.get_variable(f"bn{i}/gamma", [width], initializer=tf1.ones_initializer())
            beta = tf1.get_variable(f"bn{i}/beta", [width], initializer=tf1.zeros_initializer())
            x, _, _ = tf1.nn.fused_batch_norm(x, gamma, beta, is_training=True)
            x = tf.nn.max_pool2d(tf.nn.relu(x), 2, 2, "VALID")
            depth = width
        x = tf.reshape(x, [BATCH, -1])
        w = tf1.get_variable("dense/kernel", [x.shape[1], CLASSES], use_resource=False)
        logits = tf.matmul(x, w, name="logits")
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
            name="loss")
        correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels, name="correct")
        tf.reduce_mean(tf.cast(correct, tf.float32), name="accuracy")
        tf1.train.MomentumOptimizer(0.02, 0.9).minimize(loss, name="train")
        tf1.global_variables_initializer()
    return graph


def make_data(steps, held_out=HELD_OUT_BATCHES):
    """(training batches, held-out batches): the same class patterns, independent noise."""
    rng = np.random.RandomState(0)
    patterns = rng.uniform(0, 1, (CLASSES, SIDE, SIDE, CHANNELS)).astype(np.float32)
    batches = []
    for _ in range(steps + held_out):
        labels = rng.randint(0, CLASSES, BATCH).astype(np.int32)
        noise = rng.normal(0, 0.6, (BATCH, SIDE, SIDE, CHANNELS)).astype(np.float32)
        batches.append((patterns[labels] + noise, labels))
    return batches[:steps], batches[steps:]


def train(graph, batches, held_out):
    """Trains on `batches`; returns (losses, per-image correctness on `held_out`, Session)."""
    losses = []
    sess = tf1.Session(graph=graph)
    sess.run("init")
    for images, labels in batches:
        loss, _ = sess.run(["loss:0", "train"], {"images:0": images, "labels:0": labels})
        losses.append(loss)
    correct = np.concatenate([sess.run("correct:0", {"images:0": images, "labels:0": labels})
                              for images, labels in held_out])
    return losses, correct, sess


def half_ops_per_step(sess, batch):
    """The ops a training step executed in half precision (type attr T float16 or bfloat16
    in the partition graphs TensorFlow ran): 0 means the step ran float32."""
    images, labels = batch
    metadata = tf1.RunMetadata()
    sess.run(["loss:0", "train"], {"images:0": images, "labels:0": labels},
             options=tf1.RunOptions(output_partition_graphs=True), run_metadata=metadata)
    half = (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum)
    return sum(node.attr["T"].type in half for graph in metadata.partition_graphs
               for node in graph.node if "T" in node.attr)


def accuracy_difference(mixed, float32):
    """(difference of accuracy in points, its standard error): paired on the same images."""
    d = mixed.astype(np.float64) - float32.astype(np.float64)
    return 100 * d.mean(), 100 * d.std(ddof=1) / np.sqrt(len(d))


def interleaved_ms(sessions, batch):
    """Median ms per training step of each Session, rounds alternating between them."""
    images, labels = batch
    runs = [s.make_callable(["loss:0", "train"], feed_list=["images:0", "labels:0"])
            for s in sessions]
    times = [[] for _ in sessions]
    for r in range(TIMING_ROUNDS):
        for k in (range(len(runs)) if r % 2 == 0 else reversed(range(len(runs)))):
            start = time.perf_counter()
            for _ in range(TIMING_STEPS):
                runs[k](images, labels)
            times[k].append((time.perf_counter() - start) * 1e3 / TIMING_STEPS)
    return [float(np.median(t)) for t in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["auto", "float16", "bfloat16"], default="auto")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    native = native_bfloat16()
    print("; ".join(_cpu.facts(tf_mpt.Config.from_env(os.environ))[:2]))
    dtype = args.dtype
    if dtype == "auto":
        if not native:
            print("This CPU has no native bfloat16 (it needs avx512_bf16 or amx_bf16): half "
                  "precision would run slower than float32 here, so tf_mpt's auto choice "
                  "keeps this script in float32. --dtype bfloat16 or float16 shows the "
                  "rewrite anyway.")
        dtype = "bfloat16" if native else None

    graph = build_graph()
    batches, held_out = make_data(args.steps)
    if dtype is None:
        losses, correct, sess = train(graph, batches, held_out)
        (ms,) = interleaved_ms([sess], batches[0])
        sess.close()
        print(f"float32: first loss {losses[0]:.4f}, last loss {losses[-1]:.4f}, "
              f"accuracy {correct.mean():.3f} on {len(correct)} held-out images, "
              f"{ms:.2f} ms/step")
        return

    fetches = ["loss", "accuracy", "correct", "train", "init"]
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(add_shapes=True), dtype=dtype,
                                      fetches=fetches)
    print(result.report.summary())
    per_op = collections.defaultdict(collections.Counter)
    for decision in result.report.decisions.values():
        per_op[decision.op][decision.colour] += 1
    print(f"{'op':36} " + " ".join(f"{c:>6}" for c in ("allow", "deny", "fp32")))
    for op, counts in sorted(per_op.items()):
        if counts["allow"] or counts["deny"]:
            print(f"{op:36} " + " ".join(f"{counts[c]:6d}" for c in ("allow", "deny", "fp32")))

    mixed = tf_mpt.rewrite_graph(graph, dtype=dtype, fetches=fetches)
    print(f"\ntraining {args.steps} steps of batch {BATCH} ({SIDE}x{SIDE}x{CHANNELS}) each way; "
          f"accuracy on {HELD_OUT_BATCHES * BATCH} held-out images")
    rows, sessions, corrects = [], [], []
    for label, g in (("float32", graph), (f"tf_mpt {dtype}", mixed)):
        losses, correct, sess = train(g, batches, held_out)
        rows.append((label, losses[0], losses[-1], correct.mean(),
                     half_ops_per_step(sess, batches[0])))
        sessions.append(sess)
        corrects.append(correct)
    times = interleaved_ms(sessions, batches[0])
    for sess in sessions:
        sess.close()
    print(f"{'variant':18} {'first loss':>10} {'last loss':>10} {'accuracy':>9} "
          f"{'half ops':>8} {'ms/step':>8}")
    for (label, first, last, accuracy, half), ms in zip(rows, times):
        print(f"{label:18} {first:10.4f} {last:10.4f} {accuracy:9.3f} {half:8d} {ms:8.2f}")
    points, error = accuracy_difference(corrects[1], corrects[0])
    print(f"accuracy of tf_mpt {dtype} minus float32: {points:+.2f} points, standard error "
          f"{error:.2f} (paired, {len(corrects[0])} held-out images)")
    speedup = times[0] / times[1]
    note = "" if dtype == "bfloat16" and native else (
        " (no native kernels for it on this CPU: expected slower)")
    print(f"speed-up of tf_mpt {dtype} over float32: {speedup:.2f}x, measured above{note}")


if __name__ == "__main__":
    main()
