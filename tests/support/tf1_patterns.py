"""Real TF1 patterns as small unmodified scripts: `python tf1_patterns.py PATTERN [WORKDIR]`.

Each trains (or evaluates) a small model the way TF1 scripts do and prints one JSON line:
{"losses": [...], "half_ops": N, "peak_rss_mb": M}. `half_ops` counts MatMul/Conv2D nodes
that ran in float16 or bfloat16, read from the partition graphs of RunMetadata (what the
runtime executed, not what a rewrite claims). Run under TF_MPT_ENABLE=1 by
test_session_patterns.py, and without it for the float32 reference.
"""

import functools
import json
import os
import resource
import sys

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_v2_behavior()

FEATURES, CLASSES, BATCH = 32, 4, 32
HALF = (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum)
COMPUTE_OPS = ("MatMul", "Conv2D", "_FusedMatMul", "_FusedConv2D")


def _data(n=512, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, FEATURES).astype(np.float32)
    w = rng.randn(FEATURES, CLASSES).astype(np.float32)
    return x, np.argmax(x @ w, axis=1).astype(np.int64)


def _mlp(x, hidden=64):
    w1 = tf1.get_variable("w1", [FEATURES, hidden],
                          initializer=tf1.glorot_uniform_initializer(seed=1))
    b1 = tf1.get_variable("b1", [hidden], initializer=tf1.zeros_initializer())
    w2 = tf1.get_variable("w2", [hidden, CLASSES],
                          initializer=tf1.glorot_uniform_initializer(seed=2))
    h = tf.nn.relu(tf.matmul(x, w1) + b1)
    return tf.matmul(h, w2, name="logits")


def _fed_classifier():
    """Placeholders x and y, the MLP's logits and its loss."""
    x = tf1.placeholder(tf.float32, [None, FEATURES], name="x")
    y = tf1.placeholder(tf.int64, [None], name="y")
    logits = _mlp(x)
    return x, y, logits, _loss(logits, y)


def _rows(step):
    """The minibatch of a step, cycling through the 512 examples."""
    start = (step * BATCH) % 512
    return slice(start, start + BATCH)


def _loss(logits, labels):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits), name="loss")


class _Steps:
    """Runs training steps: keeps their losses and counts the compute ops that ran in a half
    type, from the partition graphs in RunMetadata."""

    def __init__(self):
        self.losses, self.half_ops = [], 0

    def run(self, step):
        """`step(options=, run_metadata=)` runs one step and returns [loss, ...]."""
        metadata = tf1.RunMetadata()
        self.losses.append(step(options=tf1.RunOptions(output_partition_graphs=True),
                                run_metadata=metadata)[0])
        for graph in metadata.partition_graphs:
            for node in graph.node:
                if (any(node.op.endswith(op) for op in COMPUTE_OPS)
                        and node.attr["T"].type in HALF):
                    self.half_ops += 1

    def report(self):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"losses": [float(v) for v in self.losses],
                          "half_ops": self.half_ops, "peak_rss_mb": peak}), flush=True)


def queue_runners(workdir):
    """tf.train.shuffle_batch fed by queue runners, MonitoredTrainingSession with hooks and
    checkpoints, then a second MonitoredTrainingSession that resumes from the checkpoint."""
    x_np, y_np = _data()
    steps = _Steps()
    for last_step in (60, 90):
        graph = tf.Graph()
        with graph.as_default():
            x_one, y_one = tf1.train.slice_input_producer([x_np, y_np], shuffle=True, seed=3)
            x, y = tf1.train.shuffle_batch([x_one, y_one], BATCH, capacity=256,
                                           min_after_dequeue=64, seed=4, num_threads=2)
            loss = _loss(_mlp(x), y)
            step = tf1.train.get_or_create_global_step()
            train = tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=step)
            hooks = [tf1.train.StopAtStepHook(last_step=last_step),
                     tf1.train.NanTensorHook(loss)]
            with tf1.train.MonitoredTrainingSession(
                    checkpoint_dir=workdir, save_checkpoint_steps=30, save_summaries_steps=None,
                    log_step_count_steps=None, hooks=hooks) as sess:
                while not sess.should_stop():
                    steps.run(functools.partial(sess.run, [loss, train]))
    assert tf.train.latest_checkpoint(workdir).endswith("model.ckpt-90")
    steps.report()


def initializable_iterator(workdir):
    """An initializable iterator initialised before the training op exists (the graph grows
    after the first Session.run), then a re-initialisation for a second epoch."""
    x_np, y_np = _data()
    steps = _Steps()
    x_in = tf1.placeholder(tf.float32, [None, FEATURES], name="x_in")
    y_in = tf1.placeholder(tf.int64, [None], name="y_in")
    dataset = tf.data.Dataset.from_tensor_slices((x_in, y_in)).batch(BATCH)
    iterator = tf1.data.make_initializable_iterator(dataset)
    with tf1.Session() as sess:
        sess.run(iterator.initializer, {x_in: x_np, y_in: y_np})
        x, y = iterator.get_next()
        loss = _loss(_mlp(x), y)
        train = tf1.train.AdamOptimizer(0.01).minimize(loss)
        sess.run(tf1.global_variables_initializer())
        for _ in range(2):
            while True:
                try:
                    steps.run(functools.partial(sess.run, [loss, train]))
                except tf.errors.OutOfRangeError:
                    break
            sess.run(iterator.initializer, {x_in: x_np, y_in: y_np})
    steps.report()


def callables(workdir):
    """Session.make_callable for the training step, Session.partial_run for evaluation."""
    x_np, y_np = _data()
    steps = _Steps()
    x, y, logits, loss = _fed_classifier()
    train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss)
    hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        step = sess.make_callable([loss, train], [x, y], accept_options=True)
        for i in range(60):
            rows = _rows(i)
            steps.run(functools.partial(step, x_np[rows], y_np[rows]))
        handle = sess.partial_run_setup([logits, hits], [x, y])
        first = sess.partial_run(handle, logits, {x: x_np})
        accuracy = sess.partial_run(handle, hits, {y: y_np}) / len(y_np)
    assert first.dtype == np.float32 and first.shape == (512, CLASSES)
    steps.losses.append(1.0 - accuracy)
    steps.report()


def lookup_table(workdir):
    """A tf.lookup.StaticHashTable (tables_initializer) maps string tokens to ids for an
    embedding bag classifier."""
    vocabulary = [f"t{i}" for i in range(50)]
    rng = np.random.RandomState(5)
    tokens = rng.randint(0, 50, size=(512, 6))
    labels = (tokens % CLASSES)[:, 0].astype(np.int64)
    strings = np.array(vocabulary, dtype=object)[tokens]
    steps = _Steps()
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(vocabulary),
                                            tf.range(50, dtype=tf.int64)), default_value=0)
    words = tf1.placeholder(tf.string, [None, 6], name="words")
    y = tf1.placeholder(tf.int64, [None], name="y")
    embedding = tf1.get_variable("embedding", [50, FEATURES],
                                 initializer=tf1.random_normal_initializer(seed=6))
    features = tf.reduce_mean(tf.nn.embedding_lookup(embedding, table.lookup(words)), axis=1)
    loss = _loss(_mlp(features), y)
    train = tf1.train.AdamOptimizer(0.02).minimize(loss)
    with tf1.Session() as sess:
        sess.run([tf1.global_variables_initializer(), tf1.tables_initializer()])
        for i in range(80):
            rows = _rows(i)
            steps.run(functools.partial(sess.run, [loss, train],
                                        {words: strings[rows], y: labels[rows]}))
    steps.report()


def graph_growth(workdir):
    """Training, then an evaluation op built after the first runs, then more training; a
    second Session on the same graph; a Session on the default graph closed and reopened
    (Saver checkpoint in between)."""
    x_np, y_np = _data()
    steps = _Steps()
    x, y, logits, loss = _fed_classifier()
    train = tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    saver = tf1.train.Saver()
    path = os.path.join(workdir, "model")

    def train_steps(sess, count):
        for i in range(count):
            rows = _rows(i)
            steps.run(functools.partial(sess.run, [loss, train], {x: x_np[rows], y: y_np[rows]}))

    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        train_steps(sess, 30)
        error = tf.reduce_mean(tf.cast(tf.not_equal(tf.argmax(logits, 1), y), tf.float32))
        steps.losses.append(sess.run(error, {x: x_np, y: y_np}))
        train_steps(sess, 30)
        saver.save(sess, path)
        with tf1.Session() as other:  # a second Session on the same graph: its own state
            other.run(tf1.global_variables_initializer())
            fresh = other.run(loss, {x: x_np, y: y_np})
    with tf1.Session() as sess:  # reopened
        saver.restore(sess, path)
        restored = sess.run(loss, {x: x_np, y: y_np})
        train_steps(sess, 20)
    steps.losses += [fresh, restored]
    steps.report()


def large_weights(workdir):
    """A 2-layer MLP with 2 x 4096 x 4096 float32 weights (128 MiB): peak memory."""
    steps = _Steps()
    rng = np.random.RandomState(7)
    x_np = rng.randn(64, 4096).astype(np.float32)
    x = tf1.placeholder(tf.float32, [None, 4096], name="x")
    w1 = tf1.get_variable("w1", [4096, 4096], initializer=tf1.random_normal_initializer(
        stddev=0.015, seed=8))
    w2 = tf1.get_variable("w2", [4096, 4096], initializer=tf1.random_normal_initializer(
        stddev=0.015, seed=9))
    out = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
    loss = tf.reduce_mean(tf.square(out - 0.1), name="loss")
    train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss)
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for _ in range(5):
            steps.run(functools.partial(sess.run, [loss, train], {x: x_np}))
    steps.report()


PATTERNS = {f.__name__: f for f in (queue_runners, initializable_iterator, callables,
                                    lookup_table, graph_growth, large_weights)}

if __name__ == "__main__":
    PATTERNS[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else os.getcwd())
