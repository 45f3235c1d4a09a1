"""Rewrite a TF1 conv-net training graph with tf_mpt and train it in float32 and mixed precision.

The graph: three blocks of conv 3x3 -> fused batch norm -> relu -> max pool, then dense ->
sparse softmax cross-entropy, Momentum; images of 10 classes, each class a fixed random
pattern plus noise. Prints the rewrite summary and what happened per op type, then trains
float32 and the rewritten graph from the same seeds (a seed draws the initial weights and the
training batches) and prints, each way, the accuracy on the same held-out images as mean and
spread over the seeds, and the difference of the two means with its uncertainty: the
standard error of a difference of means over independent runs, so it counts the run-to-run
spread of float32 itself (a short training run is chaotic: rounding the initial weights
by 0.4%, bfloat16's step, moves float32's own accuracy by several points). Then the ops each
executed in half precision in a training step (counted in the graphs TensorFlow ran) and the
step times measured interleaved (rounds alternating the two Sessions), with the speed-up.

--dtype auto (default) picks as TF_MPT_DTYPE=auto does: bfloat16 on a CPU with native
bfloat16 (avx512_bf16 / amx_bf16); on any other CPU it says so and trains float32 only (half
would be slower there); --dtype bfloat16 or float16 forces one. --quick trains a smaller
net on smaller images (the tests' run; the figures in README are the full run's).

Usage: python examples/rewrite_conv_net.py [--dtype auto|float16|bfloat16] [--steps N]
           [--seeds N] [--quick]
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
CHANNELS, CLASSES = 3, 10
# batch, image side, the three blocks' widths, held-out images, Momentum's learning rate,
# default steps (past the chaotic start: the seeds' accuracies agree within a point)
Size = collections.namedtuple("Size", "batch side widths held_out learning_rate steps")
FULL = Size(batch=64, side=32, widths=(32, 64, 128), held_out=4096, learning_rate=0.005,
            steps=60)
QUICK = Size(batch=32, side=16, widths=(16, 32, 64), held_out=2048, learning_rate=0.02,
             steps=120)
TIMING_ROUNDS, TIMING_STEPS = 7, 5


def native_bfloat16():
    """True if the CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16); TF_MPT_CPU_FLAGS
    decides instead when set, as it does for TF_MPT_DTYPE=auto."""
    return _cpu.has_native_bfloat16(_cpu.cpu_flags(tf_mpt.Config.from_env(os.environ)))


def build_graph(size=FULL, gradient_scale=1.0):
    """The training graph; each kernel's initial value is fed (`<kernel>/initial:0`), so one
    graph (and one rewrite) serves every seed. `gradient_scale` multiplies the loss the
    optimizer minimizes (1: as written; the tests make a really worse run with another)."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [size.batch, size.side, size.side, CHANNELS],
                                 name="images")
        labels = tf1.placeholder(tf.int32, [size.batch], name="labels")
        x, depth = images, CHANNELS
        for i, width in enumerate(size.widths):
            initial = tf1.placeholder(tf.float32, [3, 3, depth, width], f"conv{i}/initial")
            k = tf1.get_variable(f"conv{i}/kernel", initializer=initial, use_resource=False)
            x = tf.nn.conv2d(x, k, 1, "SAME")
            gamma = tf1.get_variable(f"bn{i}/gamma", [width], initializer=tf1.ones_initializer())
            beta = tf1.get_variable(f"bn{i}/beta", [width], initializer=tf1.zeros_initializer())
            x, _, _ = tf1.nn.fused_batch_norm(x, gamma, beta, is_training=True)
            x = tf.nn.max_pool2d(tf.nn.relu(x), 2, 2, "VALID")
            depth = width
        x = tf.reshape(x, [size.batch, -1])
        initial = tf1.placeholder(tf.float32, [x.shape[1], CLASSES], "dense/initial")
        w = tf1.get_variable("dense/kernel", initializer=initial, use_resource=False)
        logits = tf.matmul(x, w, name="logits")
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
            name="loss")
        correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels, name="correct")
        tf.reduce_mean(tf.cast(correct, tf.float32), name="accuracy")
        tf1.train.MomentumOptimizer(size.learning_rate, 0.9).minimize(loss * gradient_scale,
                                                                name="train")
        tf1.global_variables_initializer()
    return graph


def initial_values(graph, seed):
    """{`<kernel>/initial:0`: values}: Glorot-uniform kernels drawn from `seed`."""
    rng = np.random.RandomState(seed)
    feeds = {}
    for op in graph.get_operations():
        if op.type == "Placeholder" and op.name.endswith("/initial"):
            shape = op.outputs[0].shape.as_list()
            fan_in = int(np.prod(shape[:-1]))
            fan_out = int(np.prod(shape[:-2])) * shape[-1] if len(shape) > 2 else shape[-1]
            limit = np.sqrt(6.0 / (fan_in + fan_out))
            feeds[op.outputs[0].name] = rng.uniform(-limit, limit, shape).astype(np.float32)
    return feeds


def make_batches(size, count, seed):
    """`count` batches (images, labels): the class patterns are the same for every seed (the
    task), the labels and noise are the seed's."""
    patterns = np.random.RandomState(0).uniform(
        0, 1, (CLASSES, size.side, size.side, CHANNELS)).astype(np.float32)
    rng = np.random.RandomState(seed)
    batches = []
    for _ in range(count):
        labels = rng.randint(0, CLASSES, size.batch).astype(np.int32)
        noise = rng.normal(0, 0.6, (size.batch, size.side, size.side, CHANNELS))
        batches.append((patterns[labels] + noise.astype(np.float32), labels))
    return batches


def train(graph, initial, batches, held_out):
    """Trains from `initial` on `batches`; returns (losses, held-out accuracy, Session)."""
    losses = []
    sess = tf1.Session(graph=graph)
    sess.run("init", initial)
    for images, labels in batches:
        loss, _ = sess.run(["loss:0", "train"], {"images:0": images, "labels:0": labels})
        losses.append(loss)
    correct = np.concatenate([sess.run("correct:0", {"images:0": images, "labels:0": labels})
                              for images, labels in held_out])
    return losses, float(correct.mean()), sess


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


def difference_of_means(mixed, float32):
    """(mean(mixed) - mean(float32), its standard error), in points: the runs of each way are
    independent samples of a chaotic training run, so the error counts both ways' run-to-run
    spread (sample standard deviations over the seeds)."""
    mixed, float32 = 100 * np.asarray(mixed), 100 * np.asarray(float32)
    error = np.sqrt(mixed.var(ddof=1) / len(mixed) + float32.var(ddof=1) / len(float32))
    return float(mixed.mean() - float32.mean()), float(error)


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


Runs = collections.namedtuple("Runs", "first last accuracies session")


def run_seeds(graphs, size, steps, seeds):
    """Trains each graph from each seed; returns a Runs per graph: first losses, last losses
    and accuracies per seed, and the last seed's Session, still open."""
    held_out = make_batches(size, size.held_out // size.batch, seed=10_000)
    runs = [Runs([], [], [], None) for _ in graphs]
    for seed in range(seeds):
        initial = initial_values(graphs[0], seed)
        batches = make_batches(size, steps, seed=1 + seed)
        for k, graph in enumerate(graphs):
            losses, accuracy, sess = train(graph, initial, batches, held_out)
            runs[k].first.append(losses[0])
            runs[k].last.append(losses[-1])
            runs[k].accuracies.append(accuracy)
            if runs[k].session is not None:
                runs[k].session.close()
            runs[k] = runs[k]._replace(session=sess)
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["auto", "float16", "bfloat16"], default="auto")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps per run (default {FULL.steps}; {QUICK.steps} "
                        "with --quick)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="runs each way, from seeds 0..N-1 (default 3; at least 2)")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller net on 16x16 images, 2048 held out (the tests' run)")
    args = parser.parse_args()
    size = QUICK if args.quick else FULL
    args.steps = size.steps if args.steps is None else args.steps
    if args.seeds < 2 or args.steps < 1:
        parser.error(f"--seeds must be at least 2 and --steps at least 1 (a spread needs two "
                     f"runs). Received: --seeds {args.seeds} --steps {args.steps}")
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

    graph = build_graph(size)
    shape = f"batch {size.batch} ({size.side}x{size.side}x{CHANNELS})"
    step_batch = make_batches(size, 1, seed=1)[0]  # (the batch a step is counted and timed on)
    if dtype is None:
        ((first, last, accuracies, sess),) = run_seeds([graph], size, args.steps, args.seeds)
        (ms,) = interleaved_ms([sess], step_batch)
        sess.close()
        print(f"float32, {args.steps} steps of {shape} from {args.seeds} seeds: first loss "
              f"{np.mean(first):.4f}, last loss {np.mean(last):.4f}, accuracy "
              f"{np.mean(accuracies):.3f} sd {np.std(accuracies, ddof=1):.3f} on "
              f"{size.held_out} held-out images, {ms:.2f} ms/step")
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
    print(f"\ntraining {args.steps} steps of {shape} each way from each of {args.seeds} "
          f"seeds; accuracy on {size.held_out} held-out images, mean and sd over the seeds")
    labels = ("float32", f"tf_mpt {dtype}")
    runs = run_seeds([graph, mixed], size, args.steps, args.seeds)
    sessions = [run.session for run in runs]
    halves = [half_ops_per_step(sess, step_batch) for sess in sessions]
    times = interleaved_ms(sessions, step_batch)
    for sess in sessions:
        sess.close()
    print(f"{'variant':18} {'first loss':>10} {'last loss':>10} {'accuracy':>9} {'sd':>6} "
          f"{'half ops':>8} {'ms/step':>8}")
    for label, run, half, ms in zip(labels, runs, halves, times):
        print(f"{label:18} {np.mean(run.first):10.4f} {np.mean(run.last):10.4f} "
              f"{np.mean(run.accuracies):9.3f} {np.std(run.accuracies, ddof=1):6.3f} "
              f"{half:8d} {ms:8.2f}")
    for label, run in zip(labels, runs):
        print(f"{label} accuracy per seed: " + " ".join(f"{a:.3f}" for a in run.accuracies))
    points, error = difference_of_means(runs[1].accuracies, runs[0].accuracies)
    print(f"accuracy of tf_mpt {dtype} minus float32: {points:+.2f} points, standard error "
          f"{error:.2f} (difference of means over {args.seeds} seeds each way, counting "
          f"float32's own run-to-run spread)")
    speedup = times[0] / times[1]
    note = "" if dtype == "bfloat16" and native else (
        " (no native kernels for it on this CPU: expected slower)")
    print(f"speed-up of tf_mpt {dtype} over float32: {speedup:.2f}x, measured above{note}")


if __name__ == "__main__":
    main()
