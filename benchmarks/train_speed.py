"""Training-step time, peak memory and accuracy: float32 against tf_mpt and Grappler's AMP.

Models (TF1 graphs built with tf.compat.v1, MomentumOptimizer, inputs fed as numpy arrays):

* conv: 3x [conv3x3 (32, 64 stride 2, 128 stride 2) + fused batch norm (training) + relu]
  + dense(10), sparse softmax cross-entropy; batch 64, 32x32x3; ref variables.
* mlp: 784-2048-2048-10 with relu, sparse softmax cross-entropy; batch 256; resource variables.
* transformer: one encoder block (multi-head self-attention, FFN 4x, residuals, layer norm
  from tf.nn.moments), mean squared error against a random target; batch 32, sequence 128,
  d_model 256, 4 heads; ref variables.
* lstm: an LSTM over tf.compat.v1.while_loop (control flow v1) reading its inputs from a
  TensorArray and writing its outputs to another, mean over time + dense(10), sparse softmax
  cross-entropy; sequence 32, batch 64, hidden 512; resource variables.

Variants (the timing runs each in its own Session on the same process):

* fp32: the graph as built.
* tf_mpt: `tf_mpt.rewrite_graph(graph, dtype=..., fetches=[loss, train, init])`, in bfloat16
  when the CPU computes it natively (avx512_bf16 / amx_bf16), else float16.
* Grappler: the float32 graph in a Session whose config turns on
  `auto_mixed_precision_onednn_bfloat16`. TensorFlow runs that pass only with AVX512F or
  AVX_NE_CONVERT (and oneDNN on); elsewhere it is a silent no-op, which the header says.

Timing: every variant first runs warm-up steps; then, for each of `rounds` rounds, each
variant runs `steps` consecutive steps (the order of the variants rotates every round), and
the per-step time of a round is its wall time (time.perf_counter) divided by `steps`. The
table shows the median over rounds. Speed-up = fp32 ms / variant ms.

Casts: tf_mpt's are `casts_added` of the rewrite report; Grappler's are the Cast nodes named
'...AutoMixedPrecision' in the partition graphs of one run with output_partition_graphs, i.e.
after the Session's later Grappler passes (constant folding folds Casts of constants). For a
like-for-like count the details also give tf_mpt's Casts ('...-TfMpt') left in its Session's
partition graphs.
Half FLOPs: MatMul / BatchMatMul / Conv2D (and their gradients) FLOPs from static shapes in
the tf_mpt graph, counted as half when the op's T is the half type; ops inside the LSTM's
while loops are weighted by the trip count. Grappler's: its AMP pass alone on the float32
graph in a child process (tests/support/grappler_oracle.py), the ops it converts counted on the
float32 graph's shapes (n/a when the pass does not run on this CPU).

Peak memory (section 'memory'): every measurement of a (model, variant) runs in a child process
of its own (this script with a hidden flag), so one variant's memory never counts for another.
Before them, one tf_mpt child per model runs unmeasured in the table: tf_mpt's first run on
the machine decides by graph timing (its sandboxes hold copies of the variables and inputs)
and caches its verdicts; its figures are given apart ("first run").
The peak varies from run to run, so there are `memory_repeats` children per (model, variant),
the variants interleaved, and the table shows medians; beside a half variant's median ratio,
the ratio of the highest peaks (what decides whether a batch fits). A step's peak takes one of
a few values by the order its kernels run in: the MLP's float32 step holds 93.1 or 102.0-102.4
MiB in children of one build (Sapphire Rapids), so a median of few children reads +-10% there
however the graph is coloured. Each child builds the float32 graph and
its feeds, takes that point as the baseline, then prepares the variant (tf_mpt: the rewrite;
Grappler: its pass runs at the Session's first step), opens the Session, initialises and runs
MEMORY_STEPS training steps. Two numbers per variant:
* RSS: the process's peak resident set size from the baseline to the end minus its resident
  size at the baseline (Linux: the peak mark VmHWM of /proc/self/status, reset to the current
  size at the baseline through /proc/self/clear_refs). It holds everything the variant adds:
  the rewritten graph, the Session, TensorFlow's tensors, oneDNN's buffers and code pages
  touched for the first time. Not getrusage's ru_maxrss: a child started by subprocess
  inherits its parent's peak in it, and it cannot be reset.
* tensors: the peak bytes in use of TensorFlow's CPU allocator over the same span
  (tf.config.experimental.get_memory_info('CPU:0')['peak'] after reset_memory_stats at the
  baseline): the buffers TensorFlow allocates for variables, optimizer slots, activations and
  gradients. Shown as n/a when the allocator keeps no statistics (reset_memory_stats raises
  ValueError, as with TF_ENABLE_ONEDNN_OPTS=0).

Accuracy (section 'accuracy'): the training-parity tasks of tests/support/digits.py (an MLP
and a conv net on the examples' 8x8 digits), trained with the same seed
and minibatches for the same number of epochs by each variant: fp32 is the float32 graph;
tf_mpt its rewrite (with tf_mpt.LossScaleOptimizer when the dtype is float16); Grappler the
float32 graph in the timing's Session config. The table gives test accuracy (389 images, so
one image is 0.26 points), its difference to fp32 in points, and the Casts in one training
step's partition graphs (checking that each mixed variant did run in half).

Usage: python benchmarks/train_speed.py [--quick] [--models conv,mlp,transformer,lstm]
       [--sections timing,memory,accuracy] [--rounds N] [--steps N] [--warmup N]
       [--intra-threads N] [--plot PATH]
"""

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_REPO, "tests"))
sys.path.insert(0, os.path.join(_REPO, "tests", "integration"))
sys.path.insert(0, os.path.join(_REPO, "tests", "support"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import rewriter_config_pb2  # noqa: E402

import digits  # noqa: E402
import grappler_oracle  # noqa: E402
import tf_mpt  # noqa: E402
from tf_mpt.costs import flops as _flops  # noqa: E402

tf1 = tf.compat.v1

MODELS = ("conv", "mlp", "transformer", "lstm", "small")
VARIANTS = ("fp32", "tf_mpt", "grappler")
# Timing also runs tf_mpt with its cost model off (TF_MPT_TARGET=rules): where the model
# changes nothing the two graphs are the same and the column shows the noise.
TIMING_VARIANTS = ("fp32", "tf_mpt", "tf_mpt_no_cost", "grappler")
SECTIONS = ("timing", "memory", "accuracy")
LOSS, TRAIN, INIT = "loss", "train", "init"
SEED = 0
LEARNING_RATE = 0.01
MOMENTUM = 0.9
CLASSES = 10
BN_EPSILON = 1e-3
LN_EPSILON = 1e-5
GRAPPLER_CAST_MARK = "AutoMixedPrecision"
TF_MPT_CAST_MARK = grappler_oracle.TF_MPT_CAST_SUFFIX
CAST_MARKS = {"tf_mpt": TF_MPT_CAST_MARK, "grappler": GRAPPLER_CAST_MARK}
DEFAULT_PLOT = "train_speed.png"
MEMORY_STEPS = 3
MEMORY_CHILD_FLAG = "--memory-child"
MEMORY_TIMEOUT_S = 600
STDERR_TAIL_CHARS = 2000
CPU_DEVICE = "CPU:0"
PROC_STATUS = "/proc/self/status"
PEAK_RSS_FIELD = "VmHWM:"
PROC_CLEAR_REFS = "/proc/self/clear_refs"
RESET_PEAK_RSS = "5"  # what clear_refs takes to reset the peak RSS mark
MIB = 2 ** 20
DIGITS_TASKS = ("mlp", "conv")  # the kinds of digits.build
COST_MODEL_VAR = "TF_MPT_TARGET"  # (the cost model off: rules)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Run lengths and model sizes of one benchmark mode."""
    warmup: int
    rounds: int
    steps: int
    conv_batch: int
    conv_side: int
    mlp_batch: int
    mlp_hidden: int
    tf_batch: int
    tf_seq: int
    tf_model: int
    tf_heads: int
    lstm_seq: int
    lstm_batch: int
    lstm_hidden: int
    small_batch: int
    small_width: int
    small_depth: int
    memory_repeats: int
    accuracy_epochs: int


# The full run trains the digits tasks for as many epochs as test_training_parity.py.
FULL = Settings(warmup=3, rounds=9, steps=5, conv_batch=64, conv_side=32, mlp_batch=256,
                mlp_hidden=2048, tf_batch=32, tf_seq=128, tf_model=256, tf_heads=4,
                lstm_seq=32, lstm_batch=64, lstm_hidden=512, small_batch=32,
                small_width=64, small_depth=16, memory_repeats=5,
                accuracy_epochs=6)
QUICK = Settings(warmup=2, rounds=5, steps=3, conv_batch=32, conv_side=32, mlp_batch=128,
                 mlp_hidden=1024, tf_batch=8, tf_seq=64, tf_model=128, tf_heads=4,
                 lstm_seq=16, lstm_batch=32, lstm_hidden=256, small_batch=32,
                 small_width=64, small_depth=8, memory_repeats=1,
                 accuracy_epochs=2)

MLP_INPUT = 784
CONV_CHANNELS = ((32, 1), (64, 2), (128, 2))
FFN_FACTOR = 4
LSTM_GATES = 4
# The LSTM's while_loop name; its body ops are named '<LOOP_NAME>/...' and those of its
# gradient loop 'gradients/<LOOP_NAME>/...'.
LOOP_NAME = "rnn"
LOOP_SCOPE = f"{LOOP_NAME}/"


@dataclasses.dataclass
class Model:
    """A training graph, its feeds and how often its loop bodies run per step.

    Attributes:
        name: the model's key in MODELS.
        graph: the float32 tf.Graph with nodes LOSS, TRAIN and INIT.
        feeds: {tensor name: numpy array} fed at every step.
        loop_weights: {name fragment: runs per step} for FLOP counting of loop bodies.
    """
    name: str
    graph: tf.Graph
    feeds: dict
    loop_weights: dict = dataclasses.field(default_factory=dict)


# --- models ------------------------------------------------------------------------------------


def _variable(name, shape, resource, initializer=None):
    return tf1.get_variable(name, shape, initializer=initializer, use_resource=resource)


def _dense(x, units, name, resource):
    """x @ W + b for a 2-D x."""
    w = _variable(f"{name}/kernel", [x.shape[-1], units], resource)
    b = _variable(f"{name}/bias", [units], resource, tf1.zeros_initializer())
    return tf.nn.bias_add(tf.matmul(x, w), b)


def _classifier_loss(logits, labels):
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(xent, name=LOSS)


def _finish(loss):
    """Adds the Momentum train op and the initializer under the standard names."""
    tf1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM).minimize(loss, name=TRAIN)
    tf1.global_variables_initializer()


def _labels(rng, batch):
    return rng.randint(0, CLASSES, batch).astype(np.int32)


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def build_conv(s, rng):
    """The conv net of tf_on_this_cpu.md §4c (fused batch norm in training mode)."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(SEED)
        x = tf1.placeholder(tf.float32, [s.conv_batch, s.conv_side, s.conv_side, 3], "images")
        labels = tf1.placeholder(tf.int32, [s.conv_batch], "labels")
        for k, (channels, stride) in enumerate(CONV_CHANNELS):
            kernel = _variable(f"conv{k}/kernel", [3, 3, x.shape[-1], channels], False)
            x = tf.nn.conv2d(x, kernel, stride, "SAME")
            gamma = _variable(f"bn{k}/gamma", [channels], False, tf1.ones_initializer())
            beta = _variable(f"bn{k}/beta", [channels], False, tf1.zeros_initializer())
            x, _, _ = tf1.nn.fused_batch_norm(x, gamma, beta, epsilon=BN_EPSILON,
                                              is_training=True)
            x = tf.nn.relu(x)
        x = tf.reshape(x, [s.conv_batch, -1])
        _finish(_classifier_loss(_dense(x, CLASSES, "fc", False), labels))
    feeds = {"images:0": _normal(rng, [s.conv_batch, s.conv_side, s.conv_side, 3]),
             "labels:0": _labels(rng, s.conv_batch)}
    return Model("conv", graph, feeds)


def build_mlp(s, rng):
    """784 -> hidden -> hidden -> 10 with relu."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(SEED)
        x = tf1.placeholder(tf.float32, [s.mlp_batch, MLP_INPUT], "inputs")
        labels = tf1.placeholder(tf.int32, [s.mlp_batch], "labels")
        for k in range(2):
            x = tf.nn.relu(_dense(x, s.mlp_hidden, f"fc{k}", True))
        _finish(_classifier_loss(_dense(x, CLASSES, "logits", True), labels))
    feeds = {"inputs:0": _normal(rng, [s.mlp_batch, MLP_INPUT]),
             "labels:0": _labels(rng, s.mlp_batch)}
    return Model("mlp", graph, feeds)


def build_small(s, rng):
    """Many small layers: depth x (width -> width, relu), then 10 classes. Each MatMul is too
    small for half precision to pay for its Casts on a CPU: where the cost model acts."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(SEED)
        x = tf1.placeholder(tf.float32, [s.small_batch, s.small_width], "inputs")
        labels = tf1.placeholder(tf.int32, [s.small_batch], "labels")
        for k in range(s.small_depth):
            x = tf.nn.relu(_dense(x, s.small_width, f"fc{k}", True))
        _finish(_classifier_loss(_dense(x, CLASSES, "logits", True), labels))
    feeds = {"inputs:0": _normal(rng, [s.small_batch, s.small_width]),
             "labels:0": _labels(rng, s.small_batch)}
    return Model("small", graph, feeds)


def _layer_norm(x, name):
    """Layer norm over the last axis from tf.nn.moments."""
    depth = x.shape[-1]
    gamma = _variable(f"{name}/gamma", [depth], False, tf1.ones_initializer())
    beta = _variable(f"{name}/beta", [depth], False, tf1.zeros_initializer())
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + LN_EPSILON) * gamma + beta


def _split_heads(x, s):
    """[batch*seq, d_model] -> [batch, heads, seq, d_model // heads]."""
    x = tf.reshape(x, [s.tf_batch, s.tf_seq, s.tf_heads, s.tf_model // s.tf_heads])
    return tf.transpose(x, [0, 2, 1, 3])


def _self_attention(h, s):
    q, k, v = (_split_heads(_dense(h, s.tf_model, name, False), s) for name in "qkv")
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(s.tf_model // s.tf_heads))
    context = tf.matmul(tf.nn.softmax(scores), v)
    context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, s.tf_model])
    return _dense(context, s.tf_model, "attention_out", False)


def build_transformer(s, rng):
    """One post-norm Transformer encoder block with a mean squared error loss."""
    shape = [s.tf_batch, s.tf_seq, s.tf_model]
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(SEED)
        x = tf1.placeholder(tf.float32, shape, "inputs")
        target = tf1.placeholder(tf.float32, shape, "target")
        h = tf.reshape(x, [-1, s.tf_model])
        h = _layer_norm(h + _self_attention(h, s), "ln1")
        ffn = tf.nn.relu(_dense(h, FFN_FACTOR * s.tf_model, "ffn_in", False))
        h = _layer_norm(h + _dense(ffn, s.tf_model, "ffn_out", False), "ln2")
        error = h - tf.reshape(target, [-1, s.tf_model])
        _finish(tf.reduce_mean(tf.square(error), name=LOSS))
    feeds = {"inputs:0": _normal(rng, shape), "target:0": _normal(rng, shape)}
    return Model("transformer", graph, feeds)


def _lstm_cell(x, c, h, kernel, bias):
    z = tf.nn.bias_add(tf.matmul(tf.concat([x, h], 1), kernel), bias)
    i, f, g, o = tf.split(z, LSTM_GATES, axis=1)
    c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
    return c, tf.sigmoid(o) * tf.tanh(c)


def _lstm_outputs(inputs, s):
    """Runs the LSTM over `inputs` [seq, batch, hidden]; returns the stacked outputs."""
    hidden = s.lstm_hidden
    kernel = _variable("lstm/kernel", [2 * hidden, LSTM_GATES * hidden], True)
    bias = _variable("lstm/bias", [LSTM_GATES * hidden], True, tf1.zeros_initializer())
    steps_in = tf1.TensorArray(tf.float32, size=s.lstm_seq).unstack(inputs)
    steps_out = tf1.TensorArray(tf.float32, size=s.lstm_seq)
    zeros = tf.zeros([s.lstm_batch, hidden])

    def body(t, c, h, out):
        c, h = _lstm_cell(steps_in.read(t), c, h, kernel, bias)
        return t + 1, c, h, out.write(t, h)

    _, _, _, steps_out = tf1.while_loop(lambda t, *_: t < s.lstm_seq, body,
                                        [tf.constant(0), zeros, zeros, steps_out], name=LOOP_NAME)
    return steps_out.stack()


def build_lstm(s, rng):
    """An LSTM in a control-flow-v1 while_loop; control flow v2 is restored afterwards."""
    shape = [s.lstm_seq, s.lstm_batch, s.lstm_hidden]
    graph = tf.Graph()
    tf1.disable_control_flow_v2()
    try:
        with graph.as_default():
            tf1.set_random_seed(SEED)
            inputs = tf1.placeholder(tf.float32, shape, "inputs")
            labels = tf1.placeholder(tf.int32, [s.lstm_batch], "labels")
            pooled = tf.reduce_mean(_lstm_outputs(inputs, s), axis=0)
            _finish(_classifier_loss(_dense(pooled, CLASSES, "logits", True), labels))
    finally:
        tf1.enable_control_flow_v2()
    feeds = {"inputs:0": _normal(rng, shape), "labels:0": _labels(rng, s.lstm_batch)}
    return Model("lstm", graph, feeds, loop_weights={LOOP_SCOPE: s.lstm_seq})


BUILDERS = {"conv": build_conv, "mlp": build_mlp, "transformer": build_transformer,
            "lstm": build_lstm, "small": build_small}


# --- sessions and timing -----------------------------------------------------------------------


def session_config(intra_threads, grappler_amp):
    """A ConfigProto.

    Args:
        intra_threads: intra-op threads (0: TensorFlow's default, one per core).
        grappler_amp: turn on Grappler's oneDNN bfloat16 auto mixed precision.
    """
    config = tf1.ConfigProto(intra_op_parallelism_threads=intra_threads)
    if grappler_amp:
        config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = (
            rewriter_config_pb2.RewriterConfig.ON)
    return config


class Runner:
    """One variant of one model: a Session and a callable running one training step."""

    def __init__(self, name, graph, feeds, config):
        self.name = name
        self.session = tf1.Session(graph=graph, config=config)
        self.session.run(INIT)
        names = list(feeds)
        self._feed_values = [feeds[n] for n in names]
        self._step = self.session.make_callable([f"{LOSS}:0", TRAIN],
                                                feed_list=[graph.get_tensor_by_name(n)
                                                           for n in names])
        self.first_loss = None
        self.round_ms = []

    def step(self):
        """Runs one training step; returns the loss."""
        loss, _ = self._step(*self._feed_values)
        if self.first_loss is None:
            self.first_loss = float(loss)
        return loss

    def timed_round(self, steps):
        """Runs `steps` steps and records the mean milliseconds per step."""
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.round_ms.append((time.perf_counter() - start) * 1e3 / steps)

    def partition_casts(self, feeds, mark):
        """Cast nodes whose names contain `mark` in the partition graphs of one step."""
        options = tf1.RunOptions(output_partition_graphs=True)
        metadata = tf1.RunMetadata()
        self.session.run([f"{LOSS}:0", TRAIN], feeds, options=options, run_metadata=metadata)
        return sum(1 for partition in metadata.partition_graphs for node in partition.node
                   if node.op == "Cast" and mark in node.name)

    def close(self):
        self.session.close()


def interleaved_timing(runners, settings):
    """Warm-up, then `rounds` rounds of `steps` steps per runner, rotating the order."""
    for runner in runners:
        for _ in range(settings.warmup):
            runner.step()
    for r in range(settings.rounds):
        shift = r % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            runner.timed_round(settings.steps)


def rewrite_with_tf_mpt(model, dtype, cost_model=None):
    """Returns (rewritten tf.Graph, RewriteReport) for the model's training graph.

    cost_model: a TF_MPT_TARGET value for this rewrite ('rules': the cost model off), or None
    for the environment's.
    """
    fetches = [LOSS, TRAIN, INIT]
    saved = os.environ.get(COST_MODEL_VAR)
    if cost_model is not None:
        os.environ[COST_MODEL_VAR] = cost_model
    try:
        graph = tf_mpt.rewrite_graph(model.graph, dtype=dtype, fetches=fetches)
        # The report of the same rewrite: the GraphDef carries the shapes the cost model uses.
        report = tf_mpt.rewrite_graph_def(model.graph.as_graph_def(add_shapes=True),
                                          dtype=dtype, fetches=fetches).report
    finally:
        if saved is None:
            os.environ.pop(COST_MODEL_VAR, None)
        else:
            os.environ[COST_MODEL_VAR] = saved
    return graph, report


def grappler_half_flop_share(model, dtype):
    """Grappler's share of FLOPs in half: its AMP pass alone on the float32 graph (in a child
    process, grappler_oracle), the nodes it converts counted on the float32 graph's shapes.
    None when the pass did not run (a crash, or a no-op on this CPU)."""
    _, info = grappler_oracle.run_grappler_amp(model.graph.as_graph_def(),
                                               [LOSS, TRAIN, INIT], dtype)
    if info["skip_reason"]:
        return None
    share, _ = _flops.half_flop_share(model.graph, dtype, model.loop_weights,
                                      half_names=set(info["converted_nodes"]))
    return share


def measure(model, dtype, settings, intra_threads):
    """Times fp32, tf_mpt and Grappler on `model`; returns a row dict for the table."""
    mixed_graph, report = rewrite_with_tf_mpt(model, dtype)
    no_cost_graph, no_cost_report = rewrite_with_tf_mpt(model, dtype, cost_model="rules")
    plain = session_config(intra_threads, grappler_amp=False)
    runners = [Runner("fp32", model.graph, model.feeds, plain),
               Runner("tf_mpt", mixed_graph, model.feeds, plain),
               Runner("tf_mpt_no_cost", no_cost_graph, model.feeds, plain),
               Runner("grappler", model.graph, model.feeds,
                      session_config(intra_threads, grappler_amp=True))]
    try:
        interleaved_timing(runners, settings)
        grappler_casts = runners[3].partition_casts(model.feeds, GRAPPLER_CAST_MARK)
        tf_mpt_run_casts = runners[1].partition_casts(model.feeds, TF_MPT_CAST_MARK)
    finally:
        for runner in runners:
            runner.close()
    share, skipped = _flops.half_flop_share(mixed_graph, dtype, model.loop_weights)
    grappler_share = grappler_half_flop_share(model, dtype)
    kept = sum(1 for d in report.decisions.values() if d.reason.startswith("cost model"))
    row = {"model": model.name, "tf_mpt_casts": report.casts_added,
           "no_cost_casts": no_cost_report.casts_added, "cost_model_kept": kept,
           "tf_mpt_summary": report.summary(), "grappler_casts": grappler_casts,
           "tf_mpt_run_casts": tf_mpt_run_casts,
           "half_flops": share, "flop_ops_skipped": skipped,
           "grappler_half_flops": grappler_share}
    for runner in runners:
        row[f"{runner.name}_ms"] = statistics.median(runner.round_ms)
        row[f"{runner.name}_spread"] = (min(runner.round_ms), max(runner.round_ms))
        row[f"{runner.name}_loss"] = runner.first_loss
    return row


def variant_graph_and_config(variant, graph, dtype, fetches, intra_threads):
    """(graph, ConfigProto) with which `variant` trains the float32 `graph`.

    fp32 and Grappler run `graph` itself, Grappler with its pass on in the config; tf_mpt runs
    its rewrite in `dtype`, with `fetches` keeping their dtypes.
    """
    if variant == "tf_mpt":
        graph = tf_mpt.rewrite_graph(graph, dtype=dtype, fetches=fetches)
    return graph, session_config(intra_threads, grappler_amp=variant == "grappler")


# --- peak memory -------------------------------------------------------------------------------


def _peak_rss_mib():
    """This process's peak resident set size (VmHWM of /proc/self/status, in kB) in MiB."""
    with open(PROC_STATUS) as f:
        for line in f:
            if line.startswith(PEAK_RSS_FIELD):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {PEAK_RSS_FIELD} line in {PROC_STATUS}")


def _reset_peak_rss():
    """Lowers this process's peak RSS mark to its current RSS (Linux 4.0+, see proc(5))."""
    with open(PROC_CLEAR_REFS, "w") as f:
        f.write(RESET_PEAK_RSS)


def _reset_allocator_peak():
    """Resets the peak of TensorFlow's CPU allocator; False if it keeps no statistics."""
    try:
        tf.config.experimental.reset_memory_stats(CPU_DEVICE)
    except ValueError:  # "Cannot reset memory stats for device 'CPU:0'"
        return False
    return True


def memory_in_this_process(model_name, variant, settings, dtype, intra_threads):
    """The child's side: builds the model, then trains `variant` for MEMORY_STEPS steps.

    Returns:
        {'baseline': RSS in MiB once the float32 graph and feeds are built,
         'peak': peak RSS in MiB from then to the end of the steps,
         'tensors': peak MiB in use by TensorFlow's CPU allocator over the same span, or None
         if it keeps no statistics}.
    """
    model = BUILDERS[model_name](settings, np.random.RandomState(SEED))
    allocator_tracked = _reset_allocator_peak()
    _reset_peak_rss()
    baseline = _peak_rss_mib()
    graph, config = variant_graph_and_config(variant, model.graph, dtype, [LOSS, TRAIN, INIT],
                                             intra_threads)
    runner = Runner(variant, graph, model.feeds, config)
    try:
        for _ in range(MEMORY_STEPS):
            runner.step()
        tensors = (tf.config.experimental.get_memory_info(CPU_DEVICE)["peak"] / MIB
                   if allocator_tracked else None)
        return {"baseline": baseline, "peak": _peak_rss_mib(), "tensors": tensors}
    finally:
        runner.close()


def measure_memory(model_name, variant, args):
    """Runs `memory_in_this_process` in a child process (this script, MEMORY_CHILD_FLAG).

    Returns:
        The child's dict, or {'error': its exit status} if it failed (negative: killed by that
        signal); the tail of its stderr then goes to stderr.
    """
    command = [sys.executable, os.path.abspath(__file__), MEMORY_CHILD_FLAG,
               f"{model_name},{variant}", "--intra-threads", str(args.intra_threads)]
    if args.quick:
        command.append("--quick")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=MEMORY_TIMEOUT_S,
                          check=False)
    if proc.returncode != 0:
        print(proc.stderr[-STDERR_TAIL_CHARS:], file=sys.stderr)
        return {"error": f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.splitlines()[-1])


# --- accuracy ----------------------------------------------------------------------------------


def _casts_in_a_step(graph, config, feeds, mark):
    """Cast nodes named with `mark` in the partition graphs of one training step."""
    runner = Runner("casts", graph, feeds, config)
    try:
        return runner.partition_casts(feeds, mark)
    finally:
        runner.close()


def measure_accuracy(kind, data, dtype, epochs, intra_threads):
    """Trains the digits task `kind` with every variant; returns a row dict for the table.

    The digits graphs name their nodes as the benchmark models do (loss, train, init), so
    Runner counts their Casts.
    """
    x_train, y_train, _, _ = data
    first_batch = {"images:0": x_train[:digits.BATCH], "labels:0": y_train[:digits.BATCH]}
    row = {"task": f"digits {kind}",
           "steps": epochs * len(range(0, digits.TRAIN, digits.BATCH))}
    for variant in VARIANTS:
        scaled = variant == "tf_mpt" and dtype == "float16"
        graph, config = variant_graph_and_config(
            variant, digits.build(kind, loss_scale="dynamic" if scaled else None), dtype,
            digits.FETCHES, intra_threads)
        _, row[f"{variant}_loss"], row[f"{variant}_accuracy"] = digits.train_and_evaluate(
            graph, data, epochs, config)
        if variant in CAST_MARKS:
            row[f"{variant}_casts"] = _casts_in_a_step(graph, config, first_batch,
                                                       CAST_MARKS[variant])
    return row


# --- output ------------------------------------------------------------------------------------


def _speedup(row, variant):
    return row["fp32_ms"] / row[f"{variant}_ms"]


def markdown_table(rows):
    lines = ["| model | fp32 ms | tf_mpt ms | Grappler ms | tf_mpt speed-up | "
             "tf_mpt, cost model off | Grappler speed-up | tf_mpt Casts (off) | "
             "Grappler Casts | nodes kept fp32 by the cost model | tf_mpt half FLOPs | "
             "Grappler half FLOPs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        share, grappler_share = ("n/a" if r[k] is None else f"{r[k]:.1%}"
                                 for k in ("half_flops", "grappler_half_flops"))
        lines.append(f"| {r['model']} | {r['fp32_ms']:.2f} | {r['tf_mpt_ms']:.2f} | "
                     f"{r['grappler_ms']:.2f} | {_speedup(r, 'tf_mpt'):.2f}x | "
                     f"{_speedup(r, 'tf_mpt_no_cost'):.2f}x | {_speedup(r, 'grappler'):.2f}x | "
                     f"{r['tf_mpt_casts']} ({r['no_cost_casts']}) | {r['grappler_casts']} | "
                     f"{r['cost_model_kept']} | {share} | {grappler_share} |")
    return "\n".join(lines)


def details(rows):
    """Per model: round-time ranges, first-step losses and the rewrite summary."""
    lines = []
    for r in rows:
        spreads = ", ".join(f"{v} {r[f'{v}_spread'][0]:.2f}-{r[f'{v}_spread'][1]:.2f}"
                            for v in TIMING_VARIANTS)
        losses = ", ".join(f"{v} {r[f'{v}_loss']:.4f}" for v in TIMING_VARIANTS)
        skipped = (f"; {r['flop_ops_skipped']} MatMul/Conv op(s) with unknown shapes not "
                   "counted" if r["flop_ops_skipped"] else "")
        lines.append(f"- {r['model']}: round ms/step min-max: {spreads}. First-step loss: "
                     f"{losses}. tf_mpt: {r['tf_mpt_summary']}{skipped}; "
                     f"{r['tf_mpt_run_casts']} of its Casts left in the partition graphs.")
    return "\n".join(lines)


def summarize_memory(records):
    """Medians and ranges over one variant's child records, or {'error': the first failure}."""
    failures = [r["error"] for r in records if "error" in r]
    if failures:
        return {"error": failures[0]}
    rises = [r["peak"] - r["baseline"] for r in records]
    summary = {"baseline": statistics.median(r["baseline"] for r in records),
               "rss": statistics.median(rises), "rss_range": (min(rises), max(rises))}
    if records[0]["tensors"] is not None:  # the same TensorFlow build in every child
        tensors = [r["tensors"] for r in records]
        summary.update(tensors=statistics.median(tensors),
                       tensors_range=(min(tensors), max(tensors)))
    return summary


def _memory_cells(summary):
    """(RSS rise, allocator peak) cells of one variant's summary."""
    if "error" in summary:
        return summary["error"], summary["error"]
    tensors = f"{summary['tensors']:.1f}" if "tensors" in summary else "n/a"
    return f"{summary['rss']:.1f}", tensors


def memory_table(rows):
    lines = ["| model | fp32 RSS MiB | tf_mpt RSS MiB | Grappler RSS MiB | fp32 tensors MiB | "
             "tf_mpt tensors MiB | Grappler tensors MiB |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rss, tensors = zip(*(_memory_cells(r[v]) for v in VARIANTS))
        base = r[VARIANTS[0]].get("tensors")
        highest = r[VARIANTS[0]].get("tensors_range", (0, 0))[1]
        tensors = [cell if k == 0 or not base or "tensors" not in r[v] else
                   f"{cell} ({r[v]['tensors'] / base:.2f}x; highest "
                   f"{r[v]['tensors_range'][1] / highest:.2f}x)"
                   for k, (v, cell) in enumerate(zip(VARIANTS, tensors))]
        lines.append(f"| {r['model']} | {' | '.join(rss)} | {' | '.join(tensors)} |")
    return "\n".join(lines)


def memory_details(rows):
    """Per model: the RSS at the baseline and the min-max of both measures over the children."""
    lines = []
    for r in rows:
        parts = []
        for what, key, form in (("RSS at the baseline", "baseline", "{:.0f}"),
                                ("RSS min-max", "rss_range", "{0[0]:.1f}-{0[1]:.1f}"),
                                ("tensors min-max", "tensors_range", "{0[0]:.1f}-{0[1]:.1f}")):
            values = ", ".join(f"{v} {form.format(r[v][key])}" for v in VARIANTS if key in r[v])
            if values:
                parts.append(f"{what}: {values}")
        first = r.get("first", {})
        if "peak" in first:
            tensors = f"{first['tensors']:.1f}" if first.get("tensors") is not None else "n/a"
            parts.append(f"tf_mpt's first run (deciding, graph timing's sandboxes; not in the "
                         f"medians): RSS {first['peak'] - first['baseline']:.1f}, tensors "
                         f"{tensors}")
        lines.append(f"- {r['model']} (MiB): {'; '.join(parts)}.")
    return "\n".join(lines)


def _points(row, variant):
    return 100 * (row[f"{variant}_accuracy"] - row["fp32_accuracy"])


def accuracy_table(rows):
    lines = ["| task | steps | fp32 accuracy | tf_mpt accuracy | Grappler accuracy | "
             "tf_mpt - fp32 (points) | Grappler - fp32 (points) | tf_mpt Casts | "
             "Grappler Casts |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        accuracies = " | ".join(f"{100 * r[f'{v}_accuracy']:.2f}%" for v in VARIANTS)
        lines.append(f"| {r['task']} | {r['steps']} | {accuracies} | "
                     f"{_points(r, 'tf_mpt'):+.2f} | {_points(r, 'grappler'):+.2f} | "
                     f"{r['tf_mpt_casts']} | {r['grappler_casts']} |")
    return "\n".join(lines)


def accuracy_details(rows):
    """Per task: each variant's loss on the last training batch."""
    return "\n".join(f"- {r['task']}: last-batch loss: "
                     + ", ".join(f"{v} {r[f'{v}_loss']:.4f}" for v in VARIANTS) + "."
                     for r in rows)


def header(dtype):
    """CPU, bfloat16 support, TF version, tf_mpt's dtype and whether Grappler's pass runs."""
    support = grappler_oracle.native_bf16()
    if dtype == "bfloat16":
        dtype_text = "tf_mpt dtype: bfloat16 (native on this CPU)"
    else:
        dtype_text = (f"tf_mpt dtype: {dtype}, because this CPU does not compute bfloat16 "
                      "natively (no avx512_bf16 / amx_bf16)")
    state = "runs" if support.grappler_bf16_works else "NO-OP (Grappler column = float32 graph)"
    return (f"CPU: {support.cpu_model} ({os.cpu_count()} logical cores); native bfloat16: "
            f"{support.native}; TensorFlow {tf.__version__}.\n{dtype_text}.\n"
            f"Grappler {grappler_oracle.BF16_MODE}: {state}; {support.reason}.")


def plot(rows, path, dtype):
    """Writes a bar chart of the measured speed-ups to `path` (needs matplotlib)."""
    try:
        import matplotlib  # pylint: disable=g-import-not-at-top
        matplotlib.use("Agg")
        from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
    except ImportError:
        return "matplotlib is not installed; no plot written"
    positions = np.arange(len(rows))
    width = 0.38
    figure, axes = pyplot.subplots(figsize=(1.6 * len(rows) + 2, 4))
    for offset, variant, label in ((-width / 2, "tf_mpt", f"tf_mpt ({dtype})"),
                                   (width / 2, "grappler", "Grappler AMP (bfloat16)")):
        axes.bar(positions + offset, [_speedup(r, variant) for r in rows], width, label=label)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(positions, [r["model"] for r in rows])
    axes.set_ylabel("speed-up over float32 (median step time)")
    axes.set_title(f"Training step, {grappler_oracle.native_bf16().cpu_model}, "
                   f"TensorFlow {tf.__version__}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return f"plot written to {path}"


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller models, fewer steps and epochs")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated subset of {','.join(MODELS)} (timing, memory)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--rounds", type=int, help="timed rounds per variant")
    parser.add_argument("--steps", type=int, help="steps per round")
    parser.add_argument("--warmup", type=int, help="untimed steps per variant")
    parser.add_argument("--intra-threads", type=int, default=0,
                        help="intra-op threads of every Session (0: TensorFlow's default)")
    parser.add_argument("--plot", default=DEFAULT_PLOT,
                        help="PNG path for the speed-up chart ('' for none)")
    parser.add_argument(MEMORY_CHILD_FLAG, metavar="MODEL,VARIANT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for flag, names, known in (("model", args.models, MODELS),
                               ("section", args.sections, SECTIONS)):
        unknown = set(names.split(",")) - set(known)
        if unknown:
            parser.error(f"unknown {flag}(s) {sorted(unknown)}; choose from {known}")
    return args


def _settings(args):
    settings = QUICK if args.quick else FULL
    overrides = {key: getattr(args, key) for key in ("rounds", "steps", "warmup")
                 if getattr(args, key) is not None}
    return dataclasses.replace(settings, **overrides)


def _progress(what, start):
    print(f"  measured {what} in {time.perf_counter() - start:.0f} s", file=sys.stderr,
          flush=True)


def timing_section(args, settings, dtype):
    print(f"\nTiming: {settings.warmup} warm-up steps per variant, then {settings.rounds} "
          f"interleaved rounds x {settings.steps} steps; median of the rounds' ms/step; "
          f"intra-op threads: {args.intra_threads or 'default'}.",
          flush=True)
    rng = np.random.RandomState(SEED)
    rows = []
    for name in args.models.split(","):
        start = time.perf_counter()
        rows.append(measure(BUILDERS[name](settings, rng), dtype, settings, args.intra_threads))
        _progress(name, start)
    print()
    print(markdown_table(rows))
    print()
    print(details(rows))
    if args.plot:
        print(plot(rows, args.plot, dtype))


def memory_section(args, settings):
    print(f"\nPeak memory: {settings.memory_repeats} child process(es) per model and variant, "
          f"{MEMORY_STEPS} training steps each; medians over the children. RSS = the process's "
          "peak resident set size from the point where the float32 graph is built to the end, "
          "minus its resident size at that point; tensors = peak in use by TensorFlow's CPU "
          "allocator over the same span; (Nx; highest Mx): the medians' ratio to float32's, "
          "and the highest child's to float32's highest.", flush=True)
    rows = []
    for name in args.models.split(","):
        start = time.perf_counter()
        records = {v: [] for v in VARIANTS}
        # tf_mpt's first run on this machine decides (graph timing's sandboxes hold copies of
        # the variables) and caches its verdicts; the children measured after it read them
        first = measure_memory(name, "tf_mpt", args)
        for _ in range(settings.memory_repeats):
            for variant in VARIANTS:
                records[variant].append(measure_memory(name, variant, args))
        rows.append({"model": name, **{v: summarize_memory(records[v]) for v in VARIANTS},
                     "first": first})
        _progress(f"the memory of {name}", start)
    print()
    print(memory_table(rows))
    print()
    print(memory_details(rows))


def accuracy_section(args, settings, dtype):
    data = digits.load()
    print(f"\nAccuracy: scikit-learn digits, {settings.accuracy_epochs} epochs of batch "
          f"{digits.BATCH}, seed 0, the same minibatches for every variant; tf_mpt in {dtype}"
          f"{' with tf_mpt.LossScaleOptimizer' if dtype == 'float16' else ''}; test accuracy "
          f"on {len(data[3])} images.", flush=True)
    rows = []
    for kind in DIGITS_TASKS:
        start = time.perf_counter()
        rows.append(measure_accuracy(kind, data, dtype, settings.accuracy_epochs,
                                     args.intra_threads))
        _progress(f"the accuracy on digits {kind}", start)
    print()
    print(accuracy_table(rows))
    print()
    print(accuracy_details(rows))


def main():
    args = _parse_args()
    settings = _settings(args)
    dtype = "bfloat16" if grappler_oracle.native_bf16().native else "float16"
    if args.memory_child:
        model_name, variant = args.memory_child.split(",")
        print(json.dumps(memory_in_this_process(model_name, variant, settings, dtype,
                                                args.intra_threads)))
        return
    sections = args.sections.split(",")
    print(header(dtype))
    if "timing" in sections:
        timing_section(args, settings, dtype)
    if "memory" in sections:
        memory_section(args, settings)
    if "accuracy" in sections:
        accuracy_section(args, settings, dtype)


if __name__ == "__main__":
    main()
