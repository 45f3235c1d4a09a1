"""Rewrite time: tf_mpt against Grappler's auto mixed precision pass alone.

Graphs: generated layered networks of about 1k, 10k and 100k nodes (built directly as
NodeDefs: towers of conv + fused batch norm blocks, residual MLP blocks with
Relu/Tanh/Sigmoid/Elu, layer-norm-like Mean/Rsqrt blocks, attention-like
MatMul/Softmax/MatMul blocks, Exp gates, and a sparse softmax cross-entropy head per tower),
the conv-net training graph of examples/rewrite_conv_net.py, and graphs with many function
calls (--calls: a chain of tf.function blocks, each a call of its own function that calls an
inner MatMul + BiasAdd + Relu function, as Keras builds layers inside a model function and
grouped convolutions): there the boundary phase runs on the main graph and on every function
body, and its time must grow linearly with the number of calls.

Timing: tf_mpt is `tf_mpt.rewrite_graph_def` in this process; Grappler is one
`tf_optimizer.OptimizeGraph` call with only the AMP optimizer, in a subprocess (see
tests/support/grappler_oracle.py), after a warm-up on a tiny graph, with a pre-built cluster. Both are
wall times from time.perf_counter, median of --repeats runs, and both include the protobuf
copy / (de)serialisation their API needs. A second table splits the times: OptimizeGraph with
a no-op optimizer (Grappler's MetaGraphDef import and proto conversion, paid by any pass) and
tf_mpt with Python's garbage collector paused. Grappler runs in bfloat16
(auto_mixed_precision_onednn_bfloat16) when this CPU computes bfloat16 natively, else float16
(auto_mixed_precision with SIMULATE_GPU=1, or with --fp16-mode cpu auto_mixed_precision_cpu
with EMULATE_FP16=0, which checks CPU kernels like tf_mpt does: on a CPU-only TensorFlow the
simulated GPU has no kernels for clear ops such as Relu, so Grappler leaves them float32);
tf_mpt uses the same dtype.

Usage: python benchmarks/rewrite_speed.py [--quick] [--repeats N] [--fp16-mode M] [--profile]
                                         [--calls 100,400]
"""

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_REPO, "tests"))
sys.path.insert(0, os.path.join(_REPO, "tests", "support"))
sys.path.insert(0, os.path.join(_REPO, "examples"))

import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import graph_pb2  # noqa: E402

import grappler_oracle  # noqa: E402
import rewrite_conv_net  # noqa: E402
import tf_mpt  # noqa: E402

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)
DEFAULT_REPEATS = 5
GRAPPLER_TIMEOUT_S = 1800.0
# tf_mpt slower than this factor times Grappler at the largest size triggers a profile.
PROFILE_RATIO = 1.5
PROFILE_TOP = 15
MAX_LISTED = 10
CONV_NET_FETCHES = ("loss", "accuracy", "train", "init")
CALLS = (100, 400)
CALL_WIDTH = 32
FP16_MODE_WITHOUT_BF16 = "simulate_gpu"

# Shapes of the generated towers (no graph is run; shapes only keep the graph valid).
BATCH = 8
SIDE = 8
CHANNELS = 4
FEATURES = SIDE * SIDE * CHANNELS
CLASSES = 10
CONV_BLOCKS = 2
MLP_BLOCKS = 12
LAYER_NORM_EVERY = 4
ATTENTION_EVERY = 3
EXP_GATE_EVERY = 5
ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "Elu")
EPSILON = 1e-3

DT_FLOAT = tf.float32.as_datatype_enum
DT_INT32 = tf.int32.as_datatype_enum


class GraphBuilder:
    """Appends NodeDefs to a GraphDef; every method returns the name of the node it adds."""

    def __init__(self):
        self.graph_def = graph_pb2.GraphDef()
        self.graph_def.versions.producer = tf.version.GRAPH_DEF_VERSION

    def node(self, op, name, inputs=(), T=DT_FLOAT, **attrs):  # pylint: disable=invalid-name
        """Adds `op` named `name`; T=None leaves out the T attr."""
        node = self.graph_def.node.add(name=name, op=op, input=list(inputs))
        if T is not None:
            node.attr["T"].type = T
        for key, value in attrs.items():
            _set_attr(node.attr[key], value)
        return name

    def placeholder(self, name, shape, dtype=DT_FLOAT):
        return self.node("Placeholder", name, T=None, dtype=_Type(dtype),
                         shape=tf.TensorShape(shape).as_proto())

    def constant(self, name, value, dtype):
        tensor = tf.make_tensor_proto(value, dtype=tf.as_dtype(dtype))
        return self.node("Const", name, T=None, dtype=_Type(dtype), value=tensor)

    def variable(self, name, shape):
        """A resource variable and its read: VarHandleOp -> ReadVariableOp."""
        handle = self.node("VarHandleOp", name, T=None, dtype=_Type(DT_FLOAT),
                           shape=tf.TensorShape(shape).as_proto(), shared_name=name.encode())
        return self.node("ReadVariableOp", f"{name}/read", [handle], T=None,
                         dtype=_Type(DT_FLOAT))


class _Type(int):
    """Marks an int attr value as a dtype (attr.type, not attr.i)."""


def _set_attr(attr, value):
    if isinstance(value, _Type):
        attr.type = int(value)
    elif isinstance(value, bool):
        attr.b = value
    elif isinstance(value, int):
        attr.i = value
    elif isinstance(value, float):
        attr.f = value
    elif isinstance(value, bytes):
        attr.s = value
    elif isinstance(value, list):
        attr.list.i.extend(value)
    elif hasattr(value, "dim") or hasattr(value, "unknown_rank"):
        attr.shape.CopyFrom(value)
    else:
        attr.tensor.CopyFrom(value)


def _conv_block(b, scope, x, residual):
    """Conv2D -> FusedBatchNormV3 -> Relu (-> AddV2 residual)."""
    kernel = b.variable(f"{scope}/kernel", [3, 3, CHANNELS, CHANNELS])
    conv = b.node("Conv2D", f"{scope}/Conv2D", [x, kernel], strides=[1, 1, 1, 1],
                  padding=b"SAME")
    stats = [b.variable(f"{scope}/bn/{what}", [CHANNELS])
             for what in ("gamma", "beta", "moving_mean", "moving_variance")]
    bn = b.node("FusedBatchNormV3", f"{scope}/bn", [conv, *stats], U=_Type(DT_FLOAT),
                is_training=False, epsilon=EPSILON)
    out = b.node("Relu", f"{scope}/Relu", [bn])
    return b.node("AddV2", f"{scope}/add", [out, x]) if residual else out


def _layer_norm(b, scope, x, axes, eps):
    mean = b.node("Mean", f"{scope}/mean", [x, axes], Tidx=_Type(DT_INT32), keep_dims=True)
    var = b.node("Mean", f"{scope}/var",
                 [b.node("SquaredDifference", f"{scope}/sqdiff", [x, mean]), axes],
                 Tidx=_Type(DT_INT32), keep_dims=True)
    inv = b.node("Rsqrt", f"{scope}/rsqrt", [b.node("AddV2", f"{scope}/add_eps", [var, eps])])
    return b.node("Mul", f"{scope}/scale", [b.node("Sub", f"{scope}/center", [x, mean]), inv])


def _attention(b, scope, x):
    scores = b.node("MatMul", f"{scope}/scores", [x, x], transpose_b=True)
    probs = b.node("Softmax", f"{scope}/softmax", [scores])
    return b.node("MatMul", f"{scope}/context", [probs, x])


def _mlp_block(b, scope, x, k, axes, eps):
    """MatMul -> BiasAdd -> activation -> AddV2 residual, with periodic extra sub-blocks."""
    w = b.variable(f"{scope}/w", [FEATURES, FEATURES])
    bias = b.variable(f"{scope}/b", [FEATURES])
    pre = b.node("BiasAdd", f"{scope}/BiasAdd", [b.node("MatMul", f"{scope}/MatMul", [x, w]),
                                                 bias])
    act = b.node(ACTIVATIONS[k % len(ACTIVATIONS)], f"{scope}/act", [pre])
    if k % EXP_GATE_EVERY == EXP_GATE_EVERY - 1:
        act = b.node("Mul", f"{scope}/gated", [act, b.node("Exp", f"{scope}/gate", [pre])])
    if k % ATTENTION_EVERY == ATTENTION_EVERY - 1:
        act = b.node("AddV2", f"{scope}/attend", [act, _attention(b, f"{scope}/attn", act)])
    out = b.node("AddV2", f"{scope}/residual", [act, x])
    if k % LAYER_NORM_EVERY == LAYER_NORM_EVERY - 1:
        out = _layer_norm(b, f"{scope}/ln", out, axes, eps)
    return out


def _tower(b, t, images, labels):
    """One tower: conv blocks, flatten, MLP blocks, cross-entropy head; returns its mean loss."""
    scope = f"tower{t}"
    x = images
    for k in range(CONV_BLOCKS):
        x = _conv_block(b, f"{scope}/conv{k}", x, residual=k > 0)
    shape = b.constant(f"{scope}/flat/shape", [BATCH, FEATURES], DT_INT32)
    x = b.node("Reshape", f"{scope}/flat", [x, shape], Tshape=_Type(DT_INT32))
    axes = b.constant(f"{scope}/axes", [1], DT_INT32)
    eps = b.constant(f"{scope}/eps", EPSILON, DT_FLOAT)
    for k in range(MLP_BLOCKS):
        x = _mlp_block(b, f"{scope}/mlp{k}", x, k, axes, eps)
    w = b.variable(f"{scope}/head/w", [FEATURES, CLASSES])
    bias = b.variable(f"{scope}/head/b", [CLASSES])
    logits = b.node("BiasAdd", f"{scope}/logits",
                    [b.node("MatMul", f"{scope}/head/MatMul", [x, w]), bias])
    xent = b.node("SparseSoftmaxCrossEntropyWithLogits", f"{scope}/xent", [logits, labels],
                  Tlabels=_Type(DT_INT32))
    batch_axis = b.constant(f"{scope}/batch_axis", [0], DT_INT32)
    return b.node("Mean", f"{scope}/loss", [xent, batch_axis], Tidx=_Type(DT_INT32))


def _tower_size():
    """Nodes in one tower (measured by building one)."""
    b = GraphBuilder()
    _tower(b, 0, "images", "labels")
    return len(b.graph_def.node)


def generate_graph(target_nodes):
    """A layered graph of about `target_nodes` nodes.

    Returns:
        (GraphDef, fetches): the fetch is the AddN of every tower's loss.
    """
    towers = max(1, round(target_nodes / _tower_size()))
    b = GraphBuilder()
    images = b.placeholder("images", [BATCH, SIDE, SIDE, CHANNELS])
    labels = b.placeholder("labels", [BATCH], DT_INT32)
    losses = [_tower(b, t, images, labels) for t in range(towers)]
    b.node("AddN", "total_loss", losses, N=len(losses))
    return b.graph_def, ("total_loss",)


def many_calls_graph(calls):
    """A chain of `calls` function calls, each of its own outer function, which adds 1 to
    what its own inner function (MatMul + BiasAdd + Relu, weights passed in) returns; then a
    softmax. Returns (GraphDef, fetches): 2 x `calls` library functions."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [BATCH, CALL_WIDTH], name="x")
        for i in range(calls):
            # new Python functions per call: one pair of library functions per call site
            def inner(value, weights, bias):
                return tf.nn.relu(tf.nn.bias_add(tf.matmul(value, weights), bias))

            def outer(value, weights, bias, inner=inner):
                return tf.function(inner, autograph=False)(value, weights, bias) + 1.0
            w = tf.constant(0.01, tf.float32, [CALL_WIDTH, CALL_WIDTH], name=f"w{i}")
            b = tf.constant(0.0, tf.float32, [CALL_WIDTH], name=f"b{i}")
            x = tf.function(outer, autograph=False)(x, w, b)
        tf.nn.softmax(x, name="probs")
    return graph.as_graph_def(), ("probs",)


def check_importable(graph_def):
    """Raises if TensorFlow rejects the generated GraphDef (wrong attrs or dtypes)."""
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")


def conv_net_graph():
    """The TF1 conv-net training graph of examples/rewrite_conv_net.py and its fetches."""
    return rewrite_conv_net.build_graph().as_graph_def(), CONV_NET_FETCHES


def time_tf_mpt(graph_def, fetches, dtype, repeats, pause_gc=False):
    """Returns (median seconds, last RewriteResult) of tf_mpt.rewrite_graph_def.

    Args:
        pause_gc: run with Python's cyclic garbage collector disabled (a diagnostic: how much
            of the time is collection of the many small objects a rewrite allocates).
    """
    seconds, result = [], None
    for _ in range(repeats):
        if pause_gc:
            gc.disable()
        try:
            start = time.perf_counter()
            result = tf_mpt.rewrite_graph_def(graph_def, dtype=dtype, fetches=fetches,
                                              strict=True)
            seconds.append(time.perf_counter() - start)
        finally:
            gc.enable()
    return statistics.median(seconds), result


def warm_up_tf_mpt(dtype):
    """One untimed rewrite of a small graph (first-call costs: kernel registry, OpDefs)."""
    graph_def, fetches = generate_graph(1)
    tf_mpt.rewrite_graph_def(graph_def, dtype=dtype, fetches=fetches, strict=True)


class _GcTimer:
    """Adds up the wall time of Python's cyclic garbage collections (via gc.callbacks)."""

    def __init__(self):
        self.seconds, self._start = 0.0, None

    def __call__(self, phase, _info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def profile_tf_mpt(graph_def, fetches, dtype):
    """cProfile of one rewrite with the collector paused, and the collector's share without.

    Collections are charged by cProfile to whichever function happens to allocate, so the
    profile is taken with the collector paused and the collection time is reported apart.

    Returns:
        The report text: collection time, then the top functions by cumulative and own time.
    """
    with _GcTimer() as timer:
        start = time.perf_counter()
        tf_mpt.rewrite_graph_def(graph_def, dtype=dtype, fetches=fetches, strict=True)
        total = time.perf_counter() - start
    profiler = cProfile.Profile()
    gc.disable()
    try:
        profiler.enable()
        tf_mpt.rewrite_graph_def(graph_def, dtype=dtype, fetches=fetches, strict=True)
        profiler.disable()
    finally:
        gc.enable()
    out = io.StringIO()
    out.write(f"One rewrite: {total:.3f} s, of which cyclic garbage collection "
              f"{timer.seconds:.3f} s ({timer.seconds / total:.0%}).\n"
              "Profile with the collector paused:\n")
    for key in ("cumulative", "tottime"):
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(PROFILE_TOP)
    return out.getvalue()


def measure(label, graph_def, fetches, dtype, fp16_mode, repeats):
    """Times both tools on one graph; returns a row dict for the table."""
    ours_s, result = time_tf_mpt(graph_def, fetches, dtype, repeats)
    ours_no_gc_s, _ = time_tf_mpt(graph_def, fetches, dtype, repeats, pause_gc=True)
    _, info = grappler_oracle.run_grappler_amp(graph_def, fetches, dtype, fp16_mode=fp16_mode,
                                               repeats=repeats, timeout=GRAPPLER_TIMEOUT_S,
                                               baseline=True)
    ours = grappler_oracle.converted_nodes(graph_def, result.graph_def, dtype)
    theirs = set(info["converted_nodes"])
    return {
        "graph": label, "nodes": len(graph_def.node), "ours_s": ours_s,
        "ours_no_gc_s": ours_no_gc_s, "grappler_s": info["seconds"],
        "grappler_baseline_s": info["baseline_seconds"], "ours_casts": result.report.casts_added,
        "grappler_casts": info["casts_added"], "ours_converted": len(ours),
        "grappler_converted": len(theirs), "missed": sorted(theirs - ours),
        "extra": sorted(ours - theirs), "skip": info["skip_reason"],
    }


def _fmt_seconds(value):
    return "n/a" if value is None else f"{value:.4f}"


def markdown_table(rows):
    lines = ["| graph | nodes | tf_mpt s | Grappler s | tf_mpt / Grappler | tf_mpt Casts | "
             "Grappler Casts | tf_mpt converted | Grappler converted |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = "n/a" if not r["grappler_s"] else f"{r['ours_s'] / r['grappler_s']:.2f}x"
        grappler_casts = r["grappler_casts"] if r["skip"] is None else "n/a"
        lines.append(f"| {r['graph']} | {r['nodes']:,} | {_fmt_seconds(r['ours_s'])} | "
                     f"{_fmt_seconds(r['grappler_s'])} | {ratio} | {r['ours_casts']} | "
                     f"{grappler_casts} | {r['ours_converted']} | {r['grappler_converted']} |")
    return "\n".join(lines)


def diagnostics_table(rows):
    """Where the time goes: Grappler's framework cost, tf_mpt without garbage collection."""
    lines = ["| graph | nodes | Grappler s | of which OptimizeGraph framework s "
             f"({grappler_oracle.BASELINE_OPTIMIZER} alone) | tf_mpt s | tf_mpt s, GC paused |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['nodes']:,} | {_fmt_seconds(r['grappler_s'])} | "
                     f"{_fmt_seconds(r['grappler_baseline_s'])} | {_fmt_seconds(r['ours_s'])} | "
                     f"{_fmt_seconds(r['ours_no_gc_s'])} |")
    return "\n".join(lines)


def _header(dtype, fp16_mode):
    support = grappler_oracle.native_bf16()
    mode, env = grappler_oracle.mode_and_env(dtype, fp16_mode)
    env_text = " ".join(f"{k}={v}" for k, v in env.items()) or "no env vars"
    return (f"CPU: {support.cpu_model} ({os.cpu_count()} logical cores); "
            f"native bfloat16: {support.native}; Grappler bf16 pass works: "
            f"{support.grappler_bf16_works} ({support.reason}).\n"
            f"dtype: {dtype}; Grappler mode: {mode} ({env_text}); TensorFlow {tf.__version__}.")


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 100k-node graph")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--fp16-mode", choices=grappler_oracle.FP16_MODES,
                        default=FP16_MODE_WITHOUT_BF16,
                        help="Grappler float16 mode when bfloat16 is not native here")
    parser.add_argument("--calls", default=",".join(map(str, CALLS)),
                        help="sizes of the many-calls graphs, comma-separated (default "
                             "%(default)s; empty: none)")
    parser.add_argument("--profile", action="store_true",
                        help="profile tf_mpt on the largest graph whatever the ratio")
    return parser.parse_args()


def main():
    args = _parse_args()
    dtype = grappler_oracle.grappler_dtype()
    fp16_mode = args.fp16_mode
    print(_header(dtype, fp16_mode), flush=True)
    warm_up_tf_mpt(dtype)
    sizes = QUICK_SIZES if args.quick else SIZES
    graphs = [("conv net (example, training)", *conv_net_graph())]
    for size in sizes:
        graph_def, fetches = generate_graph(size)
        if size == sizes[0]:
            check_importable(graph_def)
        graphs.append((f"generated ~{size // 1000}k", graph_def, fetches))
    for calls in [int(c) for c in args.calls.split(",") if c.strip()]:
        graphs.append((f"{calls} function calls", *many_calls_graph(calls)))
    rows = []
    for label, graph_def, fetches in graphs:
        rows.append(measure(label, graph_def, fetches, dtype, fp16_mode, args.repeats))
        print(f"  measured {label}: {rows[-1]['nodes']} nodes, tf_mpt {rows[-1]['ours_s']:.3f} s, "
              f"Grappler {_fmt_seconds(rows[-1]['grappler_s'])} s", file=sys.stderr, flush=True)
    print()
    print(markdown_table(rows))
    print()
    print(diagnostics_table(rows))
    for r in rows:
        if r["skip"]:
            print(f"\nNo Grappler result for {r['graph']}: {r['skip']}")
        elif r["missed"] or r["extra"]:
            print(f"\n{r['graph']}: converted by Grappler only: {r['missed'][:MAX_LISTED]}; "
                  f"by tf_mpt only: {r['extra'][:MAX_LISTED]}")
    print("\nConverted = original nodes with a type attr changed from float32 to the half type "
          "(tf_mpt also stores float32 Consts read only by half ops in half).")
    calls = [r for r in rows if r["graph"].endswith("function calls")]
    if len(calls) > 1:
        per_call = ", ".join(
            f"{r['graph']}: {1e3 * r['ours_s'] / int(r['graph'].split()[0]):.2f} ms"
            for r in calls)
        print(f"\ntf_mpt time per call (constant when the boundary phase is linear): {per_call}")
    generated = [(r, g) for r, g in zip(rows, graphs) if r["graph"].startswith("generated")]
    largest, largest_graph = generated[-1] if generated else (rows[-1], graphs[-1])
    ratio = largest["ours_s"] / largest["grappler_s"] if largest["grappler_s"] else None
    if args.profile or (ratio is not None and ratio > PROFILE_RATIO and not args.quick):
        print(f"\ntf_mpt profile on {largest['graph']} ({largest['nodes']:,} nodes):")
        print(profile_tf_mpt(largest_graph[1], largest_graph[2], dtype))


if __name__ == "__main__":
    main()
