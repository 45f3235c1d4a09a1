"""The probes behind op_costs: float32 and half kernel times of this CPU, run in a child
process (`python -m tf_mpt.costs.probes`) so TensorFlow's trace output and the probe
Sessions stay out of the caller's process.

Two kinds:
* per op type (`measure`): each elementwise op, reduction, pooling, batch norm, ... at four
  sizes (ELEMENTS), each matrix product and convolution at three problem sizes, and the
  Casts: the points op_costs.OpCosts interpolates between.
* per node (`time_nodes`): a matrix product or convolution at its own shapes and attrs
  (a NodeSpec): their half kernels are fast or 80x slow by shape (a bfloat16
  DepthwiseConv2dNativeBackpropInput with stride 2 on Zen 4), which no line captures.

Every time is a kernel's own (RunMetadata step stats, the fastest of RUNS traced runs after
a warm-up, one op at a time: inter-op parallelism 1, intra-op as TensorFlow's default). The
fastest, not the median: on a shared machine interference only adds time, and a median of
runs taken while a neighbour was busy measured float32 Mul over 4096 elements at 6.1 us one
time and 3.2 us the next, enough to flip the model's decisions.

    python -m tf_mpt.costs.probes [--dtype bfloat16]          # print the table
    python -m tf_mpt.costs.probes --out FILE                  # write it (JSON)
    python -m tf_mpt.costs.probes --nodes SPECS --out FILE    # time NodeSpecs
    python -m tf_mpt.costs.probes --serve                     # op_costs.ProbeServer
"""

import base64
import json
import logging
import os
import statistics

from tf_mpt import _cpu
from tf_mpt.costs import contractions as _contractions
from tf_mpt.costs import flops as _flops_module
from tf_mpt.costs import op_costs as _op_costs
from tf_mpt.costs import probe_ops as _ops

_log = logging.getLogger("tf_mpt")

ROWS = 128  # elementwise probes are [n / ROWS, ROWS]
ELEMENTS = (4096, 32768, 262144, 1048576)  # the sizes of an elementwise probe
RUNS = 9
NODE_RUNS = 7
CHAIN = 4  # copies of a node probe run in a chain (see _node_graph)
# Matrix products whose runs go round each other (see time_nodes), SPREAD_CHUNK at a time
# (each holds two Sessions).
SPREAD_CHUNK = 64

# Matrix products and convolutions: (small, middle, large) problems, timed per FLOP (the
# depthwise convolutions, memory-bound, per output element).
MATMUL_SHAPES = (((16, 128), (128, 128)), ((64, 256), (256, 256)), ((256, 512), (512, 512)))
BATCH_MATMUL_SHAPES = (((16, 32, 32), (16, 32, 32)), ((32, 64, 64), (32, 64, 64)),
                       ((64, 128, 64), (64, 64, 128)))
EINSUM_SHAPES = (((16, 32, 64), (64, 64)), ((16, 64, 128), (128, 128)),
                 ((16, 128, 256), (256, 256)))
CONV_SHAPES = (((4, 16, 16, 16), (3, 3, 16, 16)), ((8, 32, 32, 16), (3, 3, 16, 32)),
               ((16, 32, 32, 32), (3, 3, 32, 32)))
DEPTHWISE_SHAPES = (((4, 16, 16, 32), (3, 3, 32, 1)), ((8, 32, 32, 32), (3, 3, 32, 1)),
                    ((16, 32, 32, 64), (3, 3, 64, 1)))





def _probes(tf, dtype, size):
    """{op type: (tensor or op, units)} of one probe graph: elementwise ops at ELEMENTS[size],
    matrix products and convolutions at their size-th problem (if there is one)."""
    tf1 = tf.compat.v1
    raw = tf.raw_ops
    n = ELEMENTS[size]
    shape = [n // ROWS, ROWS]

    def ph(shp=None, dt=dtype):
        return tf1.placeholder(dt, shp or shape)

    probes = {}
    for op, arg in _ops.UNARY.items():
        probes[op] = (getattr(raw, op)(**{arg: ph()}), n)
    for op, (a, b) in _ops.BINARY.items():
        probes[op] = (getattr(raw, op)(**{a: ph(), b: ph()}), n)
    x = ph()
    probes["Swish"] = (raw.Mul(x=x, y=raw.Sigmoid(x=x)), n)  # the remapper's _MklSwish
    probes["BiasAdd"] = (raw.BiasAdd(value=ph(), bias=ph([ROWS])), n)
    probes["BiasAddGrad"] = (raw.BiasAddGrad(out_backprop=ph()), n)
    probes["Softmax"] = (raw.Softmax(logits=ph()), n)
    probes["ConcatV2"] = (raw.ConcatV2(values=[ph(), ph()], axis=1), 2 * n)
    probes["Pad"] = (raw.Pad(input=ph(), paddings=[[1, 1], [1, 1]]), n)
    for op in ("Sum", "Mean", "Max", "Prod"):
        probes[op] = (getattr(raw, op)(input=ph(), axis=[1]), n)
    probes["Transpose"] = (raw.Transpose(x=ph([16, n // (16 * ROWS), ROWS]), perm=[1, 0, 2]), n)
    side = max(2, int((n // (16 * 32)) ** 0.5))
    images = [16, side, side, 32]
    count = images[0] * images[1] * images[2] * images[3]
    for op in ("MaxPool", "AvgPool"):
        argument = "input" if op == "MaxPool" else "value"
        probes[op] = (getattr(raw, op)(**{argument: ph(images)}, ksize=[1, 2, 2, 1],
                                       strides=[1, 2, 2, 1], padding="VALID"), count)
    channels = [images[-1]]
    stats = [ph(channels, tf.float32) for _ in range(4)]
    for training in (True, False):
        outputs = raw.FusedBatchNormV3(x=ph(images), scale=stats[0], offset=stats[1],
                                       mean=stats[2], variance=stats[3],
                                       is_training=training)
        probes["FusedBatchNormV3" + ("" if training else ":inference")] = (outputs[0], count)
    grad = raw.FusedBatchNormGradV3(y_backprop=ph(images), x=ph(images), scale=stats[0],
                                    reserve_space_1=stats[1], reserve_space_2=stats[2],
                                    reserve_space_3=stats[3])
    probes["FusedBatchNormGradV3"] = (grad[0], count)

    if dtype != tf.float32:
        probes["Cast:to"] = (tf.cast(ph(dt=tf.float32), dtype), n)
        probes["Cast:from"] = (tf.cast(ph(), tf.float32), n)
    if size < len(MATMUL_SHAPES):
        probes.update(_contraction_probes(tf, ph, size))
    return probes


def _flops(op, inputs, output, equation=None):
    """FLOPs of a probe, counted as the cost model counts a graph's (flops_from_shapes):
    `inputs`, the static shape per input port; `output`, its first output's."""
    return _flops_module.flops_from_shapes(
        op, False, lambda port: list(inputs[port]), lambda port: list(output),
        equation=equation)


def _contraction_probes(tf, ph, size):
    raw = tf.raw_ops
    probes = {}
    (a, b) = MATMUL_SHAPES[size]
    probes["MatMul"] = (raw.MatMul(a=ph(list(a)), b=ph(list(b))),
                        _flops("MatMul", [a, b], a[:-1] + b[-1:]))
    (a, b) = BATCH_MATMUL_SHAPES[size]
    for op in ("BatchMatMulV2", "BatchMatMul"):
        probes[op] = (getattr(raw, op)(x=ph(list(a)), y=ph(list(b))),
                      _flops(op, [a, b], a[:-1] + b[-1:]))
    (a, b) = EINSUM_SHAPES[size]
    equation = "abc,cd->abd"
    probes["Einsum"] = (raw.Einsum(inputs=[ph(list(a)), ph(list(b))], equation=equation),
                        _flops("Einsum", [a, b], a[:-1] + b[-1:], equation))
    (x, k) = CONV_SHAPES[size]
    out = list(x[:3]) + [k[3]]  # SAME, stride 1
    probes["Conv2D"] = (raw.Conv2D(input=ph(list(x)), filter=ph(list(k)), strides=[1, 1, 1, 1],
                                   padding="SAME"), _flops("Conv2D", [x, k], out))
    probes["Conv2DBackpropInput"] = (raw.Conv2DBackpropInput(
        input_sizes=list(x), filter=ph(list(k)), out_backprop=ph(out), strides=[1, 1, 1, 1],
        padding="SAME"), _flops("Conv2DBackpropInput", [[4], k, out], x))
    probes["Conv2DBackpropFilter"] = (raw.Conv2DBackpropFilter(
        input=ph(list(x)), filter_sizes=list(k), out_backprop=ph(out), strides=[1, 1, 1, 1],
        padding="SAME"), _flops("Conv2DBackpropFilter", [x, [4], out], k))
    (x, k) = DEPTHWISE_SHAPES[size]
    elements = x[0] * x[1] * x[2] * x[3]
    kwargs = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    probes["DepthwiseConv2dNative"] = (raw.DepthwiseConv2dNative(
        input=ph(list(x)), filter=ph(list(k)), **kwargs), elements)
    probes["DepthwiseConv2dNativeBackpropInput"] = (raw.DepthwiseConv2dNativeBackpropInput(
        input_sizes=list(x), filter=ph(list(k)), out_backprop=ph(list(x)), **kwargs), elements)
    probes["DepthwiseConv2dNativeBackpropFilter"] = (raw.DepthwiseConv2dNativeBackpropFilter(
        input=ph(list(x)), filter_sizes=list(k), out_backprop=ph(list(x)), **kwargs), elements)
    return probes


def _kernel_seconds(tf, probes):
    """{op type: fastest seconds of its probe kernel} over RUNS traced runs; a probe whose
    kernel does not run here (none registered for the dtype) is left out. No probes (only
    matrix products asked for, at a size they have no problem of): {}."""
    if not probes:
        return {}
    try:
        return _traced_seconds(tf, probes)
    except tf.errors.OpError:
        found = {}
        for op, probe in probes.items():
            try:
                found.update(_traced_seconds(tf, {op: probe}))
            except tf.errors.OpError:
                _log.debug("op-cost probe %s does not run here", op)
        return found


def _traced_seconds(tf, probes):
    import numpy as np  # pylint: disable=import-outside-toplevel
    tf1 = tf.compat.v1
    targets = [t.op if hasattr(t, "op") else t for t, _ in probes.values()]
    names = {target.name: op for op, target in zip(probes, targets)}
    feeds = _random_feeds(targets, np.random.default_rng(0))
    times = _run_traced(tf1, targets[0].graph, targets, names, feeds, RUNS)
    return {op: min(t) for op, t in times.items() if t}


def _random_feeds(ops, rng):
    """{placeholder: values in [0.1, 1) of its dtype and shape} for the ops' inputs."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    return {tensor: rng.uniform(0.1, 1.0, tensor.shape.as_list()).astype(np.float32).astype(
        tensor.dtype.as_numpy_dtype) for op in ops for tensor in op.inputs
        if tensor.op.type == "Placeholder"}


def _probe_session(tf1, graph, optimize=True):
    """A Session that runs one op at a time (the probes time each kernel alone); `optimize`
    False: without Grappler, whose optimizers merge a node probe's identical copies and drop
    its control edges (TensorFlow's own rewrites, e.g. to oneDNN kernels, still run)."""
    config = tf1.ConfigProto(inter_op_parallelism_threads=1)
    if not optimize:
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        config.graph_options.optimizer_options.opt_level = tf1.OptimizerOptions.L0
    return tf1.Session(graph=graph, config=config)


def _run_traced(tf1, graph, targets, names, feeds, runs):
    """{name: [seconds per traced run]} of the kernels of `targets` (names: node name ->
    the name to report it under)."""
    times = {name: [] for name in names.values()}
    with _probe_session(tf1, graph) as session:
        session.run(targets, feeds)
        for target in targets:  # one op per run, as a graph's op runs between others
            own = {t: feeds[t] for t in target.inputs if t in feeds}
            for _ in range(runs):
                for node, nanos in _traced_run(tf1, session, target, own).items():
                    if node in names:
                        times[names[node]].append(nanos * 1e-9)
    return times


def _traced_run(tf1, session, target, feeds):
    """Runs `target` once, traced: {node name: nanoseconds its kernel took}."""
    metadata = tf1.RunMetadata()
    session.run(target, feeds, run_metadata=metadata,
                options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))
    return {stats.node_name.split(":")[0]:
            stats.all_end_rel_nanos or stats.all_end_rel_micros * 1000
            for device in metadata.step_stats.dev_stats for stats in device.node_stats}


def measure(dtype="bfloat16", ops=None):
    """Times the probe ops (`ops`: those of probe_ops.PROBED_OPS named, None: all) and the
    Casts in float32 and `dtype` at every size; returns OpCosts (`probed`: the ops asked
    for, those no probe times included, so that nobody asks for them again)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    half = tf.as_dtype(dtype)
    asked = _ops.PROBED_OPS if ops is None else frozenset(ops)
    wanted = asked & _ops.PROBED_OPS

    def probes_of(dt, size):
        return {op: probe for op, probe in _probes(tf, dt, size).items()
                if op in wanted or op in _ops.CASTS}

    seconds = {}
    with tf.Graph().as_default():  # the process's first kernels run slow: not timed
        _kernel_seconds(tf, probes_of(half, 0))
    for size in range(len(ELEMENTS)):  # the dtypes alternate: see time_nodes
        for name, dt in (("float32", tf.float32), ("half", half)):
            with tf.Graph().as_default():
                probes = probes_of(dt, size)
                units = {op: u for op, (_, u) in probes.items()}
                for op, t in _kernel_seconds(tf, probes).items():
                    seconds.setdefault((name, op), []).append((units[op], t))
    points = {"float32": {}, "half": {}}
    for (name, op), found in seconds.items():
        if len(found) >= 2:
            points[name][op] = tuple(sorted(found))
    to, back = (points["half"].pop(k, ()) for k in ("Cast:to", "Cast:from"))
    cast = tuple((n, (a + b) / 2) for (n, a), (_, b) in zip(to, back))
    # the remapper fusions: TensorFlow's x86 build fuses them all (oneDNN)
    return _op_costs.OpCosts(dtype=half.name, source=f"measured on {_cpu.cpu_model()}",
                             float32=points["float32"], half=points["half"], cast=cast,
                             threads=os.cpu_count() or 0, probed=tuple(sorted(asked)))


def _node_graph(tf, spec, dtype):
    """A GraphDef holding one node as `spec` (op_costs.node_spec) describes it, computing in
    `dtype`, its float inputs placeholders (or constants where the graph has constants)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from tensorflow.core.framework import attr_value_pb2  # pylint: disable=import-outside-toplevel
    graph_def = tf.compat.v1.GraphDef()
    rng = np.random.default_rng(0)
    node = graph_def.node.add(name="probe_0", op=spec["op"])
    for j, (kind, value, constant) in enumerate(spec["inputs"]):
        name = f"input_{j}"
        if kind == "float" and not constant:
            source = graph_def.node.add(name=name, op="Placeholder")
            source.attr["dtype"].type = dtype.as_datatype_enum
            source.attr["shape"].shape.CopyFrom(tf.TensorShape(value).as_proto())
        else:
            array = (rng.uniform(0.1, 1.0, value).astype(dtype.as_numpy_dtype)
                     if kind == "float" else np.array(value, np.int32))
            source = graph_def.node.add(name=name, op="Const")
            source.attr["dtype"].type = tf.as_dtype(array.dtype).as_datatype_enum
            source.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(array))
        node.input.append(name)
    for key, text in spec["attrs"].items():
        value = attr_value_pb2.AttrValue()
        value.ParseFromString(base64.b64decode(text))
        node.attr[key].CopyFrom(value)
    node.attr["T"].type = dtype.as_datatype_enum
    # CHAIN copies run one after the other (each waits for the one before), and the copies
    # after the first are timed: in a graph the kernels before a node keep both cores'
    # threads awake. Timed alone, a float32 [512x128] x [128x512] MatMul took 560-680 us in
    # most probes (one core's time), the first of a chain ~400 us, the rest 325-370 us, as
    # in the Transformer's steps (303-358 us); its bfloat16 twin ~300-310 us either way.
    for k in range(1, CHAIN):
        copy = graph_def.node.add()
        copy.CopyFrom(node)
        copy.name = f"probe_{k}"
        copy.input.append(f"^probe_{k - 1}")
    return graph_def


def time_nodes(specs, dtype="bfloat16"):
    """{spec key: [float32 seconds, half seconds]} of each NodeSpec key (JSON text) whose
    kernel runs here; each kernel's fastest run counts.

    Each run times a chain of CHAIN copies of the node (see _node_graph). The two dtypes'
    runs alternate (float32, half, float32, ...): this CPU's speed drifts between runs, and
    timing one dtype's runs after the other's turned a drift into a 2x "speed-up". The runs
    of matrix products also go round those nodes (SPREAD_CHUNK at a time), so that each
    node's runs spread over the measurement; convolutions keep their runs back to back."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    alone, spread = [], []
    for key in specs:
        (spread if json.loads(key)["op"] in _contractions.SPREAD_OPS else alone).append(key)
    found = {}
    for key in alone:
        found.update(_time_together(tf, [key], dtype))
    for start in range(0, len(spread), SPREAD_CHUNK):
        found.update(_time_together(tf, spread[start:start + SPREAD_CHUNK], dtype))
    return found


def _time_together(tf, keys, dtype):
    """time_nodes of `keys`, their runs going round them."""
    tf1 = tf.compat.v1
    errors = (tf.errors.OpError, ValueError, TypeError, KeyError)
    nodes = {}  # key -> ([float32 run, half run], [[float32 seconds], [half seconds]])
    try:
        for key in keys:
            spec, runs = json.loads(key), []
            try:
                for dt in (tf.float32, tf.as_dtype(dtype)):
                    runs.append(_NodeRun(tf1, _node_graph(tf, spec, dt)))
            except errors as error:
                _log.debug("node probe %s does not run here: %s", spec["op"], error)
                for run in runs:
                    run.session.close()
                continue
            nodes[key] = (runs, [[], []])
        for _ in range(NODE_RUNS):
            for key in list(nodes):
                runs, seconds = nodes[key]
                try:
                    for k, run in enumerate(runs):
                        seconds[k].append(run.traced_seconds())
                except errors as error:
                    _log.debug("node probe %s failed: %s", key, error)
                    for run in nodes.pop(key)[0]:
                        run.session.close()
        return {key: [min(s) for s in seconds] for key, (_, seconds) in nodes.items()}
    finally:
        for runs, _ in nodes.values():
            for run in runs:
                run.session.close()


class _NodeRun:
    """One probe chain in its own Session, warmed up: traced_seconds() runs it once."""

    def __init__(self, tf1, graph_def):
        import numpy as np  # pylint: disable=import-outside-toplevel
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        with tf.Graph().as_default() as graph:
            tf.graph_util.import_graph_def(graph_def, name="")
        self.probe = graph.get_operation_by_name(f"probe_{CHAIN - 1}")
        self.feeds = _random_feeds([self.probe], np.random.default_rng(1))
        self._tf1 = tf1
        self.session = _probe_session(tf1, graph, optimize=False)
        try:
            for _ in range(3):
                self.session.run(self.probe, self.feeds)
        except Exception:  # no kernel for this dtype: the caller never sees this Session
            self.session.close()
            raise

    def traced_seconds(self):
        """The median kernel time of the chain's copies after the first, one traced run."""
        nanos = _traced_run(self._tf1, self.session, self.probe, self.feeds)
        return statistics.median(nanos[f"probe_{k}"] for k in range(1, CHAIN)) * 1e-9


def serve(requests, replies):
    """Answers measurement requests, one JSON line each, until `requests` ends:

        {"dtype": d, "nodes": null, "ops": [op types] or null}  -> {"ok": measure(d, ops)}
        {"dtype": d, "nodes": [NodeSpec keys]}                  -> {"ok": time_nodes(...)}
        a failure                                               -> {"error": "..."}

    One process answers every measurement of its parent (op_costs.ProbeServer): TensorFlow
    is imported once."""
    import tensorflow  # pylint: disable=import-outside-toplevel,unused-import
    for line in requests:
        try:
            request = json.loads(line)
            if request.get("nodes") is None:
                result = json.loads(measure(request["dtype"], request.get("ops")).to_json())
            else:
                result = time_nodes(request["nodes"], request["dtype"])
            reply = {"ok": result}
        except Exception as error:  # pylint: disable=broad-except
            reply = {"error": f"{type(error).__name__}: {error}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _main(argv=None):
    import argparse  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--nodes", help="a JSON list of NodeSpec keys to time")
    parser.add_argument("--out", help="write the result here (JSON) instead of printing it")
    parser.add_argument("--serve", action="store_true",
                        help="answer requests on stdin (op_costs.ProbeServer's protocol)")
    args = parser.parse_args(argv)
    if args.serve:
        replies = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)  # anything else printed goes to stderr, never into the replies
        serve(sys.stdin, replies)
        return
    if args.nodes:
        with open(args.nodes) as f:
            text = json.dumps(time_nodes(json.load(f), args.dtype))
    else:
        costs = measure(args.dtype)
        text = costs.to_json()
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        return
    if args.nodes:
        print(text)
        return
    print(f"{costs.source}; {args.dtype} vs float32 at {ELEMENTS[2]} elements / 1e8 FLOPs")
    for op in sorted(costs.half):
        if op in costs.float32:
            units = 1e8 if op in _contractions.FLOP_OPS else ELEMENTS[2]
            single, half = costs.time(op, units, False), costs.time(op, units, True)
            print(f"  {op:38s} float32 {single * 1e6:9.1f} us  half {half * 1e6:9.1f} us  "
                  f"{single / half if half else 0:5.2f}x")


if __name__ == "__main__":
    _main()
