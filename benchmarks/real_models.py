"""Real models, bfloat16 on CPU: float32 vs Grappler's oneDNN bfloat16 AMP vs tf_mpt, for
inference and for one training step, interleaved in one process.

    python benchmarks/real_models.py [--models ResNet50 LSTM ...] [--sessions 3] [--rounds 5]
    python benchmarks/real_models.py --profile Transformer      # ms per op type, one step
    python benchmarks/real_models.py --quick                    # smoke run: small models

Models (tf_keras, weights=None: nothing downloaded; batch 16): Keras applications ResNet50,
MobileNetV2, EfficientNetB0, DenseNet121, ConvNeXtTiny at 128x128x3 with 10 classes; a
Transformer encoder (2 blocks, d_model 128, 4 heads, FFN 512 with gelu, sequence 32); an LSTM
text classifier (embedding 64, 128 units, sequence 32). Each is built as a TF1 graph
(tf.compat.v1, tf_keras layers): inference = the model's output with its variables frozen
into constants (biases, norm offsets / scales and moving statistics set to seeded values of a
trained model's kind first, not the initial zeros and ones Grappler would simplify away); training = sparse softmax cross-entropy and a Momentum step.

Variants, each in its own Session of this process: float32 (the graph as built); Grappler
(the same graph, `auto_mixed_precision_onednn_bfloat16` on in the Session's config: a silent
no-op on CPUs without AVX512F); tf_mpt (`tf_mpt.rewrite_graph(graph, dtype="bfloat16")`);
and where tf_mpt folds inference batch norms into their convolutions, that fold alone in
float32 (the part of tf_mpt's gain that is not precision).
Timing: `sessions` times (default 3) a fresh Session per variant, opened in a rotated order;
each: warm-up (two steps, and one untimed round where a step is shorter than --round-ms),
then `rounds` rounds of `steps` steps per variant (more where a step is short, so that
float32's round lasts at least --round-ms), the order rotating every round. Speed-up = the
median over rounds of float32's ms / the variant's ms in the same round, over the rounds of
all Sessions (paired: a slow period of a shared machine slows both sides of a ratio; fresh
Sessions: one Session can run its graph slower than another of the same graph for its whole
life); ms = the median over rounds. "float32 again" is a second Session of the float32
graph timed like the others: its speed-up is 1.00x but for noise, the noise of the run. The
CPU and whether it computes bfloat16 natively are printed first; on a CPU without native
bfloat16 the speed columns are not measurable and the full run says so and stops. --quick
runs two small models once (structure, no timing claims).
"""

import argparse
import collections
import dataclasses
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from tf_mpt import _cpu  # noqa: E402  (no TensorFlow import)
from tf_mpt.rewrite import fold_batch_norms as _fold  # noqa: E402

BATCH, SIZE, CLASSES, TOKENS, WIDTH, VOCAB = 16, 128, 10, 32, 128, 5000
APPLICATIONS = ("ResNet50", "MobileNetV2", "EfficientNetB0", "DenseNet121", "ConvNeXtTiny")
MODELS = APPLICATIONS + ("Transformer", "LSTM")
VARIANTS = ("float32", "grappler", "tf_mpt")


def _tf():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf


def _keras():
    import tf_keras  # pylint: disable=import-outside-toplevel
    return tf_keras


def _model(name, quick):
    """(tf_keras model, input placeholder) in the current graph."""
    tf, keras = _tf(), _keras()
    tf1 = tf.compat.v1
    keras.utils.set_random_seed(0)
    if name in APPLICATIONS:
        size = 32 if quick else SIZE
        kwargs = {"alpha": 0.35} if quick and name == "MobileNetV2" else {}
        x = tf1.placeholder(tf.float32, [BATCH, size, size, 3], name="input")
        model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3),
                                                  classes=CLASSES, **kwargs)
        return model, x
    tokens, width = (8, 32) if quick else (TOKENS, WIDTH)
    if name == "Transformer":
        x = tf1.placeholder(tf.float32, [BATCH, tokens, width], name="input")
        inputs = keras.Input((tokens, width))
        h = inputs
        for _ in range(2):
            attention = keras.layers.MultiHeadAttention(4, width // 4)(h, h)
            h = keras.layers.LayerNormalization()(h + attention)
            ffn = keras.layers.Dense(4 * width, activation="gelu")(h)
            h = keras.layers.LayerNormalization()(h + keras.layers.Dense(width)(ffn))
        logits = keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling1D()(h))
        return keras.Model(inputs, logits), x
    x = tf1.placeholder(tf.int32, [BATCH, tokens], name="input")
    model = keras.Sequential([keras.Input((tokens,), dtype="int32"),
                              keras.layers.Embedding(VOCAB, 64),
                              keras.layers.LSTM(width),
                              keras.layers.Dense(CLASSES)])
    return model, x


def _feed(x):
    rng = np.random.RandomState(0)
    shape = x.shape.as_list()
    if x.dtype.name == "int32":
        return rng.randint(0, VOCAB, size=shape).astype(np.int32)
    return rng.uniform(0, 1, size=shape).astype(np.float32)


def _as_if_trained(session, model):
    """Gives the weights a fresh model holds at exact zeros or ones (biases, batch-norm and
    layer-norm offsets and scales, moving means and variances) seeded values of a trained
    model's kind. Frozen at their initial values they are constants that Grappler simplifies
    away (a BiasAdd of zeros is removed, and the convolution + bias + activation fusion a
    trained model gets goes with it), which no trained model's graph shows."""
    tf1 = _tf().compat.v1
    rng = np.random.RandomState(1)
    assigns = []
    for weight in model.weights:
        name = weight.name.split("/")[-1].split(":")[0]
        shape = weight.shape.as_list()
        if name in ("gamma", "moving_variance"):
            value = rng.uniform(0.5, 1.5, size=shape)
        elif name in ("bias", "beta", "moving_mean"):
            value = rng.normal(0.0, 0.1, size=shape)
        else:
            continue
        assigns.append(tf1.assign(weight, value.astype(weight.dtype.as_numpy_dtype)))
    session.run(assigns)


class Graphs:
    """The float32 inference and training graphs of one model, their fetches and feeds."""

    def __init__(self, name, quick):
        tf = _tf()
        tf1 = tf.compat.v1
        self.name = name
        self.train_graph = tf.Graph()
        with self.train_graph.as_default():
            model, x = _model(name, quick)
            labels = tf.constant(np.arange(BATCH) % CLASSES, name="labels")
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=tf.cast(logits, tf.float32)), name="loss")
            tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, name="train")
            init = tf1.global_variables_initializer()
            self.init = init.name
            self.feed_name = x.name
            self.feed_value = _feed(x)
            self.train_fetches = ["loss:0", "train"]
        self.infer_graph, self.infer_fetches = self._frozen_inference(quick)

    def _frozen_inference(self, quick):
        tf = _tf()
        tf1 = tf.compat.v1
        graph = tf.Graph()
        with graph.as_default():
            model, x = _model(self.name, quick)
            tf.identity(model(x, training=False), name="output")
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                _as_if_trained(session, model)
                frozen = tf1.graph_util.convert_variables_to_constants(
                    session, graph.as_graph_def(), ["output"])
        inference = tf.Graph()
        with inference.as_default():
            tf.graph_util.import_graph_def(frozen, name="")
        return inference, ["output:0"]


class Runner:
    """One variant of one graph: a Session and a callable running one step."""

    def __init__(self, name, graph, fetches, feed_name, feed_value, config, init=None):
        tf1 = _tf().compat.v1
        self.name = name
        self.session = tf1.Session(graph=graph, config=config)
        if init is not None:
            self.session.run(init)
        self._run = self.session.make_callable(fetches, feed_list=[
            graph.get_tensor_by_name(feed_name)])
        self._feed, self._feed_name = feed_value, feed_name
        self.round_ms = []

    def step(self):
        return self._run(self._feed)

    def timed_round(self, steps):
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.round_ms.append((time.perf_counter() - start) * 1e3 / steps)

    def profile(self, fetches):
        """{op type: ms} summed over the nodes of one step (RunMetadata step stats)."""
        tf1 = _tf().compat.v1
        options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
        metadata = tf1.RunMetadata()
        self.session.run(fetches, {self.session.graph.get_tensor_by_name(self._feed_name):
                                   self._feed}, options=options, run_metadata=metadata)
        totals = collections.Counter()
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                label = node.timeline_label
                op = label.split("(")[0].split(" = ")[-1].strip() if " = " in label else \
                    node.node_name.split(":")[0]
                totals[op] += (node.op_end_rel_micros - node.op_start_rel_micros) / 1e3
        return totals


def _config(grappler):
    tf = _tf()
    from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=C0415
    config = tf.compat.v1.ConfigProto()
    if grappler:
        config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = (
            rewriter_config_pb2.RewriterConfig.ON)
    return config


def variants_for(graphs, phase):
    """([(variant, graph, Session config)], tf_mpt's report) of float32 / Grappler / tf_mpt /
    float32 again (/ the fold alone) for 'inference' or 'training'."""
    import tf_mpt  # pylint: disable=import-outside-toplevel
    if phase == "inference":
        graph, keep = graphs.infer_graph, [f.split(":")[0] for f in graphs.infer_fetches]
    else:
        graph, keep = graphs.train_graph, ["loss", "train", graphs.init]
    # one rewrite: with target here (auto on a CPU with native bfloat16) it times its
    # candidate colourings of the graph (float32, rules, cost model, contractions only) and
    # keeps the fastest; its report holds each candidate's time and the pick
    result = tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype="bfloat16", fetches=keep)
    report = result.report
    mixed = _tf().Graph()
    with mixed.as_default():
        _tf().graph_util.import_graph_def(result.graph_def, name="")
    variants = [("float32", graph, _config(False)), ("grappler", graph, _config(True)),
                ("tf_mpt", mixed, _config(False)), ("float32 again", graph, _config(False))]
    folded_def, folded = _fold.fold_batch_norms(graph.as_graph_def(), set(keep))
    if folded:  # tf_mpt's batch-norm fold alone, float32: the part of its gain that is not
        folded_graph = _tf().Graph()  # precision
        with folded_graph.as_default():
            _tf().graph_util.import_graph_def(folded_def, name="")
        variants.append(("folded", folded_graph, _config(False)))
    return variants, report


def open_runners(graphs, phase, variants, first=0):
    """A Runner per variant (Sessions opened from the `first`-th variant on, round the list;
    the list's order is kept)."""
    if phase == "inference":
        fetches, init = graphs.infer_fetches, None
    else:
        fetches, init = graphs.train_fetches, graphs.init
    order = list(range(len(variants)))
    runners = {}
    for k in order[first:] + order[:first]:
        name, graph, config = variants[k]
        runners[k] = Runner(name, graph, fetches, graphs.feed_name, graphs.feed_value,
                            config, init)
    return [runners[k] for k in order]


def time_runners(runners, rounds, steps, warmup=2, round_ms=0.0):
    """Times `rounds` interleaved rounds into each runner's round_ms. A round runs `steps`
    steps per variant, or more where a step is short: enough for float32's round to last
    `round_ms` (a 2 ms step timed twice moves by ~20% between rounds; timed over 100 steps it
    does not)."""
    for runner in runners:
        for _ in range(warmup):
            runner.step()
    if round_ms > 0:
        start = time.perf_counter()
        runners[0].step()
        step_ms = (time.perf_counter() - start) * 1e3
        steps = max(steps, min(500, math.ceil(round_ms / max(step_ms, 1e-3))))
        for runner in runners if steps > 1 else ():  # one untimed round each: a short
            for _ in range(steps):  # step's first hundred runs are slower (allocator,
                runner.step()  # oneDNN primitive caches)
    for r in range(rounds):
        shift = r % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            runner.timed_round(steps)


def paired_ratios(runners):
    """{variant: [float32's ms / the variant's ms in each round]} (runners[0] is float32)."""
    base = runners[0].round_ms
    return {runner.name: [b / r for b, r in zip(base, runner.round_ms)]
            for runner in runners[1:]}


def measure(graphs, phase, sessions, rounds, steps, warmup, round_ms):
    """({variant: median ms}, {variant: speed-up}, tf_mpt's report): `sessions` times a
    fresh Session per variant (opened in a rotated order), `rounds` rounds each; the
    speed-up is the median of every round's paired ratio. Fresh Sessions, because a Session
    of this machine can run its graph ~15% slower than another Session of the very same
    graph for as long as it lives (the LSTM's training step, four float32 Sessions
    interleaved over 110 rounds: one at 0.83x of the first throughout, the others 1.02-1.04x)."""
    variants, report = variants_for(graphs, phase)
    ratios, ms = collections.defaultdict(list), collections.defaultdict(list)
    for k in range(sessions):
        runners = open_runners(graphs, phase, variants, first=k % len(variants))
        try:
            time_runners(runners, rounds, steps, warmup=warmup, round_ms=round_ms)
        finally:
            for runner in runners:
                runner.session.close()
        for name, found in paired_ratios(runners).items():
            ratios[name].extend(found)
        for runner in runners:
            ms[runner.name].extend(runner.round_ms)
    return ({name: statistics.median(t) for name, t in ms.items()},
            {name: statistics.median(r) for name, r in ratios.items()}, report)


def _candidates(report):
    """Graph timing's candidates and pick, as the rewrite's report gives them."""
    verdict = report.verdict
    if verdict is None:
        return "not timed (target not here, or TF_MPT_TIMING_BUDGET=0)"
    if not verdict.timed:
        return f"not timed: {verdict.why}"
    times = ", ".join(f"{name} {verdict.median(name) * 1e3:.1f}" + (
        f" ({verdict.peaks[name] / 2**20:.0f} MiB)" if name in verdict.peaks else "")
        for name in verdict.times)
    same = "".join(f", {name} = {other}" for name, other in verdict.same_as.items())
    return f"{times}{same}; pick: {verdict.pick}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--sessions", type=int, default=3,
                        help="fresh Sessions per variant, one after another (default 3)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds per Session (default 5)")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--round-ms", type=float, default=500.0,
                        help="more steps per round where a step is short: float32's round "
                             "lasts at least this long (default 500)")
    parser.add_argument("--phases", nargs="+", default=["inference", "training"],
                        choices=["inference", "training"])
    parser.add_argument("--profile", choices=MODELS)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    native = _cpu.has_native_bfloat16(_cpu.cpu_flags())
    print(f"CPU: {_cpu.cpu_model()}; native bfloat16: {'yes' if native else 'no'}; "
          f"{os.cpu_count()} logical cores; batch {BATCH}")
    if args.quick:
        args.models, args.sessions, args.rounds, args.steps = ["MobileNetV2", "LSTM"], 1, 1, 1
    elif not native:
        print("bfloat16 speed: not measurable here (no native bfloat16 on this CPU; "
              "Grappler's bfloat16 pass is a no-op without AVX512F).")
        return 0
    if args.profile:
        return profile(args.profile, args.phases[0])
    print("| model | step | float32 ms | Grappler / float32 | tf_mpt / float32 | "
          "batch norms folded, float32 / float32 | float32 again / float32 (noise) | "
          "tf_mpt Casts | tf_mpt's candidates (sandbox ms; step peak MiB) and pick | "
          "tf_mpt summary |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    speedups = collections.defaultdict(list)
    for name in args.models:
        graphs = Graphs(name, args.quick)
        for phase in args.phases:
            ms, up, report = measure(graphs, phase, args.sessions, args.rounds, args.steps,
                                     warmup=1 if args.quick else 2,
                                     round_ms=0.0 if args.quick else args.round_ms)
            for variant in ("grappler", "tf_mpt"):
                speedups[phase, variant].append(up[variant])
            folded = f"{up['folded']:.2f}x" if "folded" in up else "-"
            print(f"| {name} | {phase} | {ms['float32']:.1f} | {up['grappler']:.2f}x | "
                  f"{up['tf_mpt']:.2f}x | {folded} | {up['float32 again']:.2f}x | "
                  f"{report.casts_added} | {_candidates(report)} | "
                  f"{dataclasses.replace(report, verdict=None).summary()} |", flush=True)
    for phase in args.phases:
        means = {v: math.exp(statistics.mean(math.log(s) for s in speedups[phase, v]))
                 for v in ("grappler", "tf_mpt")}
        print(f"| geometric mean | {phase} | | {means['grappler']:.2f}x | "
              f"{means['tf_mpt']:.2f}x | | | | |")
    return 0


def profile(name, phase):
    """ms per op type for one step of float32 and tf_mpt (after warm-up)."""
    graphs = Graphs(name, quick=False)
    variants, _ = variants_for(graphs, phase)
    runners = open_runners(graphs, phase, [v for v in variants if v[0] in VARIANTS])
    fetches = graphs.infer_fetches if phase == "inference" else graphs.train_fetches
    totals = {}
    for runner in runners:
        for _ in range(3):
            runner.step()
        totals[runner.name] = runner.profile(fetches)
        runner.session.close()
    print(f"| op type ({name}, {phase}) | float32 ms | Grappler ms | tf_mpt ms |")
    print("|---|---|---|---|")
    ops = sorted(set().union(*totals.values()), key=lambda op: -max(t.get(op, 0)
                                                                    for t in totals.values()))
    for op in ops[:25]:
        print(f"| {op} | {totals['float32'].get(op, 0):.2f} | "
              f"{totals['grappler'].get(op, 0):.2f} | {totals['tf_mpt'].get(op, 0):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
