"""A word2vec-style training step: what casting the gathered rows instead of the whole
embedding table saves.

    python benchmarks/embedding_step.py [--vocab 9008 50000] [--dtype float16] [--steps 50]

The model is TF1 skip-gram with NCE loss (ref variables, as the public word2vec scripts build
it): `embedding_lookup` of a batch of 128 ids in a vocab x 200 table, `tf.nn.nce_loss` with 64
sampled classes, SGD. Three graphs are timed in one process, alternating, median ms/step:

* float32;
* tf_mpt with its selection pass switched off (the rewrite before this pass existed: the
  whole table is cast to half every step for the GatherV2 that reads it);
* tf_mpt (the gather stays float32 and its 128 x 200 rows are cast).

The table Casts of each rewrite are listed with their element counts. Ratios, not absolute
times, carry from machine to machine; the CPU and its bfloat16 support are printed first.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tf_mpt  # noqa: E402
from tf_mpt import _cpu  # noqa: E402
from tf_mpt.rewrite.paint import rules as _paint  # noqa: E402
from tf_mpt.rewrite import painting as _painting  # noqa: E402

tf1 = tf.compat.v1
BATCH, EMBED, SAMPLED = 128, 200, 64
FETCHES = ["loss", "train", "init"]
WARMUP = 5


def build(vocab, seed=0):
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        inputs = tf1.placeholder(tf.int32, [BATCH], name="inputs")
        labels = tf1.placeholder(tf.int64, [BATCH, 1], name="labels")
        embeddings = tf1.get_variable(
            "embeddings", [vocab, EMBED], use_resource=False,
            initializer=tf1.random_uniform_initializer(-1.0, 1.0))
        nce_weights = tf1.get_variable(
            "nce_weights", [vocab, EMBED], use_resource=False,
            initializer=tf1.truncated_normal_initializer(stddev=EMBED ** -0.5))
        nce_biases = tf1.get_variable("nce_biases", [vocab], use_resource=False,
                                      initializer=tf1.zeros_initializer())
        embed = tf.nn.embedding_lookup(embeddings, inputs)
        loss = tf.reduce_mean(tf.nn.nce_loss(nce_weights, nce_biases, labels, embed,
                                             num_sampled=SAMPLED, num_classes=vocab),
                              name="loss")
        tf1.train.GradientDescentOptimizer(1.0).minimize(loss, name="train")
        tf1.global_variables_initializer()
    return graph


def rewrite(graph, dtype, selection_pass):
    passes = _painting.PASSES
    if not selection_pass:
        _painting.PASSES = tuple(p for p in passes
                                 if p[1] is not _paint.cast_the_selected_part_not_the_whole)
    try:
        return tf_mpt.rewrite_graph(graph, dtype=dtype, fetches=FETCHES)
    finally:
        _painting.PASSES = passes


def table_casts(graph, vocab):
    """(Cast name, elements cast) for the Casts tf_mpt added."""
    out = []
    for op in graph.get_operations():
        if op.type == "Cast" and op.name.endswith("-TfMpt"):
            shape = op.inputs[0].shape
            count = int(np.prod(shape.as_list())) if shape.is_fully_defined() else None
            out.append((op.name, count))
    return sorted(out, key=lambda c: -(c[1] or 0))


def time_steps(graphs, steps, vocab):
    rng = np.random.RandomState(0)
    feeds = {"inputs:0": rng.randint(0, vocab, BATCH),
             "labels:0": rng.randint(0, vocab, (BATCH, 1))}
    sessions = []
    for graph in graphs:
        sess = tf1.Session(graph=graph)
        sess.run("init")
        for _ in range(WARMUP):
            sess.run(["loss:0", "train"], feeds)
        sessions.append(sess)
    times = [[] for _ in graphs]
    for _ in range(steps):
        for k, sess in enumerate(sessions):  # alternating: drift hits all alike
            start = time.perf_counter()
            sess.run(["loss:0", "train"], feeds)
            times[k].append(time.perf_counter() - start)
    for sess in sessions:
        sess.close()
    return [statistics.median(t) * 1e3 for t in times]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[9008, 50000])
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    print("; ".join(_cpu.facts()[:2]) + f"; TensorFlow {tf.__version__}; dtype {args.dtype}")
    print("| vocab | float32 ms | tf_mpt, table cast ms | tf_mpt, rows cast ms | "
          "rows vs table | elements cast per step (table / rows) |")
    print("|---|---|---|---|---|---|")
    for vocab in args.vocab:
        graph = build(vocab)
        before = rewrite(graph, args.dtype, selection_pass=False)
        after = rewrite(graph, args.dtype, selection_pass=True)
        cast_before = sum(c or 0 for _, c in table_casts(before, vocab))
        cast_after = sum(c or 0 for _, c in table_casts(after, vocab))
        fp32, t_before, t_after = time_steps([graph, before, after], args.steps, vocab)
        print(f"| {vocab} | {fp32:.2f} | {t_before:.2f} | {t_after:.2f} | "
              f"{t_before / t_after:.2f}x | {cast_before:,} / {cast_after:,} |")


if __name__ == "__main__":
    main()
