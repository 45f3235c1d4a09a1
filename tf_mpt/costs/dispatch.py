"""The dispatch check: how TensorFlow runs each half op type on this CPU, against float32.

Probing an op alone misses the kernel TensorFlow actually runs: its remapper fuses a MatMul
with the BiasAdd after it into one oneDNN kernel, and on a CPU without AVX512_FP16 that fused
float16 kernel takes oneDNN's reference path (620x float32 for a [128x100] x [100x256] dense
layer on a Sapphire Rapids, while the MatMul alone runs as fast as float32); a float16
Conv2DBackpropFilter runs 195x float32 there. From the user's side that is a hang. So each
pattern below is a small graph run as TensorFlow runs it (a Session with Grappler's default
optimizers, the remapper's fusions included) in float32 and in the half type:

    ratio = fastest half run / fastest float32 run

An op type whose pattern runs more than SLOW times float32 stays float32 wherever the graph
runs on this machine (the automatic path; target `here`), whatever the dtype and target,
with one WARNING naming the op and the ratio. A half run that takes longer than
max(TIMEOUT_FACTOR x float32, TIMEOUT_FLOOR_MS) is stopped: its ratio is at least that
(recorded as such).

The ratios are measured once per machine, TensorFlow version and dtype, in a child process
(`python -m tf_mpt.costs.dispatch`), and cached beside the op table. The automatic path starts
that child when it is switched on (`start_early`: every pattern, the common ones first, each
written as it is done), so the script's own start-up hides it and the first rewrite waits
only for the patterns of its op types; a rewrite with no child under way measures only the
op types its graph has; a cost table standing in for this CPU (TF_MPT_OP_COSTS) supplies them instead (its
"dispatch" entry; none: nothing is checked), so tests never measure.
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from tf_mpt._process import state as _state

SLOW = 3.0
TIMEOUT_FACTOR = 50.0
TIMEOUT_FLOOR_MS = 2000
RUNS = 5
VERSION = 2  # 2: the patterns run (1 fetched a NoOp Grappler pruned: nothing was timed)

ELEMENTS = (2048, 2048)  # element-wise probes: 4M elements


def _patterns(tf, dtype):
    """{pattern: callable(variables) -> output tensor} and the variable shapes each reads."""
    nn = tf.nn

    matmul = {"x": (512, 1024), "w": (1024, 1024), "b": (1024,)}
    conv = {"x": (32, 32, 32, 64), "w": (3, 3, 64, 64), "b": (64,)}
    backprop = {"x": (128, 15, 15, 32), "w": (3, 3, 32, 32), "dy": (128, 13, 13, 32)}
    depthwise = {"x": (32, 32, 32, 64), "w": (3, 3, 64, 1), "dy": (32, 32, 32, 64)}
    element = {"x": ELEMENTS}
    batch = {"x": (32, 128, 128), "y": (32, 128, 128)}
    norm = {"x": (32, 32, 32, 64), "scale": (64,), "offset": (64,), "dy": (32, 32, 32, 64)}
    pool = {"x": (32, 32, 32, 64), "dy": (32, 16, 16, 64)}
    f32 = {"scale", "offset"}  # batch norm parameters stay float32

    def conv2d(v):
        return nn.conv2d(v["x"], v["w"], 1, "SAME")

    patterns = {
        "MatMul": (matmul, lambda v: tf.matmul(v["x"], v["w"])),
        "MatMul+BiasAdd": (matmul, lambda v: nn.bias_add(tf.matmul(v["x"], v["w"]), v["b"])),
        "MatMul+BiasAdd+Relu": (matmul, lambda v: nn.relu(nn.bias_add(
            tf.matmul(v["x"], v["w"]), v["b"]))),
        "BatchMatMulV2": (batch, lambda v: tf.matmul(v["x"], v["y"])),
        "Conv2D": (conv, conv2d),
        "Conv2D+BiasAdd+Relu": (conv, lambda v: nn.relu(nn.bias_add(conv2d(v), v["b"]))),
        "Conv2DBackpropFilter": (backprop, lambda v: tf.raw_ops.Conv2DBackpropFilter(
            input=v["x"], filter_sizes=[3, 3, 32, 32], out_backprop=v["dy"],
            strides=[1, 1, 1, 1], padding="VALID")),
        "Conv2DBackpropInput": (backprop, lambda v: tf.raw_ops.Conv2DBackpropInput(
            input_sizes=[128, 15, 15, 32], filter=v["w"], out_backprop=v["dy"],
            strides=[1, 1, 1, 1], padding="VALID")),
        "DepthwiseConv2dNative": (depthwise, lambda v: tf.raw_ops.DepthwiseConv2dNative(
            input=v["x"], filter=v["w"], strides=[1, 1, 1, 1], padding="SAME")),
        "DepthwiseConv2dNativeBackpropFilter": (
            depthwise, lambda v: tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
                input=v["x"], filter_sizes=[3, 3, 64, 1], out_backprop=v["dy"],
                strides=[1, 1, 1, 1], padding="SAME")),
        "DepthwiseConv2dNativeBackpropInput": (
            depthwise, lambda v: tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
                input_sizes=[32, 32, 32, 64], filter=v["w"], out_backprop=v["dy"],
                strides=[1, 1, 1, 1], padding="SAME")),
        "FusedBatchNormV3": (norm, lambda v: tf.raw_ops.FusedBatchNormV3(
            x=v["x"], scale=v["scale"], offset=v["offset"], mean=[], variance=[],
            is_training=True)[0]),
        "FusedBatchNormGradV3": (norm, lambda v: tf.raw_ops.FusedBatchNormGradV3(
            y_backprop=v["dy"], x=v["x"], scale=v["scale"], reserve_space_1=v["scale"],
            reserve_space_2=v["offset"], reserve_space_3=v["offset"], is_training=True)[0]),
        "BiasAddGrad": ({"x": ELEMENTS}, lambda v: tf.raw_ops.BiasAddGrad(
            out_backprop=v["x"])),
        "MaxPool": (pool, lambda v: nn.max_pool2d(v["x"], 2, 2, "VALID")),
        "AvgPool": (pool, lambda v: nn.avg_pool2d(v["x"], 2, 2, "VALID")),
        "Softmax": (element, lambda v: nn.softmax(v["x"])),
    }
    for op, fn in (("Relu", nn.relu), ("Relu6", nn.relu6), ("Sigmoid", tf.sigmoid),
                   ("Tanh", tf.tanh), ("Erf", tf.math.erf), ("Exp", tf.exp)):
        patterns[op] = (element, lambda v, fn=fn: fn(v["x"]))
    patterns["Mul"] = ({"x": ELEMENTS, "y": ELEMENTS}, lambda v: v["x"] * v["y"])
    patterns["AddV2"] = ({"x": ELEMENTS, "y": ELEMENTS}, lambda v: v["x"] + v["y"])
    return patterns, f32


# The patterns _patterns builds (a test keeps the two in step): no TensorFlow import needed
# to know which op types are checked.
PATTERNS = (
    "AddV2", "AvgPool", "BatchMatMulV2", "BiasAddGrad", "Conv2D", "Conv2D+BiasAdd+Relu",
    "Conv2DBackpropFilter", "Conv2DBackpropInput", "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput", "Erf", "Exp",
    "FusedBatchNormGradV3", "FusedBatchNormV3", "MatMul", "MatMul+BiasAdd",
    "MatMul+BiasAdd+Relu", "MaxPool", "Mul", "Relu", "Relu6", "Sigmoid", "Softmax", "Tanh")
CHILD_TIMEOUT_SECONDS = 900
# The order an early child measures in: the op types most graphs have first (dense and
# convolutional layers, their element-wise neighbours, their gradients), the rare ones last.
FIRST = ("MatMul+BiasAdd", "MatMul", "MatMul+BiasAdd+Relu", "AddV2", "Mul", "Relu",
         "BiasAddGrad", "Conv2D+BiasAdd+Relu", "Conv2D", "Conv2DBackpropFilter",
         "Conv2DBackpropInput", "Sigmoid", "Tanh", "Softmax", "FusedBatchNormV3",
         "FusedBatchNormGradV3", "MaxPool", "AvgPool", "Relu6", "BatchMatMulV2", "Exp", "Erf")
_POLL_SECONDS = 0.05


def op_of(pattern):
    """The op type a pattern checks: its first op (the one the others fuse into)."""
    return pattern.split("+")[0]


CHECKED_OPS = frozenset(op_of(p) for p in PATTERNS)


def slow_ops(config, dtype, ops):
    """{op type: (ratio, pattern)} for the op types among `ops` whose half kernel, as
    TensorFlow runs it here, took more than SLOW times float32 (the worst pattern of each);
    from the table standing in for this CPU (config.op_costs) where one is set, else
    measured here once (cached). {} where nothing could be measured (said once)."""
    wanted = set(ops) & CHECKED_OPS
    if not wanted:
        return {}
    found = ratios(config, dtype, wanted)
    slow = {}
    for pattern, ratio in found.items():
        op = op_of(pattern)
        if op in wanted and ratio > SLOW and ratio > slow.get(op, (0.0, ""))[0]:
            slow[op] = (ratio, pattern)
    return slow


def ratios(config, dtype, ops):
    """{pattern: half time / float32 time} covering the patterns of `ops`."""
    if config.op_costs:  # a table stands in for this CPU: its entry, nothing measured
        return in_table(config.op_costs, dtype)
    path = _cache_path(config, dtype)
    known = _read(path)
    missing = {op_of(p) for p in PATTERNS if op_of(p) in ops and p not in known}
    if not missing:
        return known
    try:
        _log_measuring(dtype, missing)
        early = _EARLY.get(dtype)
        if early is not None:
            known.update(early.wait_for([p for p in PATTERNS if op_of(p) in missing]))
            missing = {op_of(p) for p in PATTERNS if op_of(p) in ops and p not in known}
        if missing:
            known.update(_in_child(dtype, sorted(missing)))
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        _state.warn_once(("dispatch check", dtype),
                         "tf_mpt could not check how TensorFlow runs %s kernels on this CPU "
                         "(%s: %s); no op is kept float32 for a slow half kernel",
                         dtype, type(error).__name__, error)
        return known
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
        op_costs._write_atomically(path, json.dumps(known, indent=1, sort_keys=True))  # pylint: disable=protected-access
    except OSError:
        pass  # measured again by the next process
    return known


class _Early:
    """A child measuring every pattern, started before any graph asked (`start_early`)."""

    def __init__(self, proc, directory):
        self.proc, self.directory = proc, directory
        self.out = os.path.join(directory, _OUT)

    def done(self):
        return _read(self.out)

    def wait_for(self, patterns, timeout=CHILD_TIMEOUT_SECONDS):
        """{pattern: ratio} the child has measured once it has every one of `patterns`, or
        has ended (then: what it measured), or `timeout` seconds have passed."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.done()
            if all(p in found for p in patterns) or self.proc.poll() is not None or \
                    time.monotonic() > deadline:
                return self.done() if self.proc.poll() is not None else found
            time.sleep(_POLL_SECONDS)

    def stop(self):
        """Ends the child (at the process's exit: a script that ends first does not leave it
        running) and removes its directory."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


_EARLY = {}  # dtype -> _Early
_OUT = "dispatch.json"  # (an early child's file of ratios, in its directory)


def start_early(config, dtype):
    """Starts a child measuring every pattern of `dtype` now, the common ones first, where a
    rewrite in this process will check them (no table stands in for this CPU, and its cache
    lacks some): the automatic path calls it when it is switched on. Never raises."""
    try:
        if config.op_costs or not config.dispatch_check or dtype in _EARLY:
            return
        cache = _cache_path(config, dtype)
        known = _read(cache)
        missing = [p for p in FIRST + PATTERNS if p not in known]
        if not missing:
            return
        ops = list(dict.fromkeys(op_of(p) for p in missing))
        early = _spawn(dtype, ops, cache)
        if early is not None:
            _EARLY[dtype] = early
            atexit.register(early.stop)
    except Exception as error:  # pylint: disable=broad-except
        _state.warn_once(("dispatch early", dtype),
                         "tf_mpt did not start checking %s kernels early (%s: %s); the first "
                         "rewrite checks them", dtype, type(error).__name__, error, level=10)


def _spawn(dtype, ops, cache):
    """An _Early whose child measures `ops` in that order, writing each pattern's ratio as it
    is done and, at its end, merging them into `cache`."""
    directory = tempfile.mkdtemp(prefix="tf_mpt_dispatch_")
    proc = subprocess.Popen(
        _command(dtype, ops, os.path.join(directory, _OUT)) + ["--cache", cache],
        env=_child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _Early(proc, directory)


def _command(dtype, ops, out):
    """The child's command line: measure `ops`' patterns in `dtype`, write them to `out`."""
    return [sys.executable, "-m", "tf_mpt.costs.dispatch", "--dtype", dtype, "--ops",
            ",".join(ops), "--out", out]


def _child_env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for name in list(env):  # the child is tf_mpt's own probe, never rewritten
        if name.startswith("TF_MPT_") and name != "TF_MPT_CACHE_DIR":
            del env[name]
    return env


def _log_measuring(dtype, ops):
    _state.warn_once(("dispatch measuring", dtype, tuple(sorted(ops))),
                     "tf_mpt is checking how TensorFlow runs %s %s on this CPU against "
                     "float32 (once; cached)", dtype, ", ".join(sorted(ops)),
                     level=20)


def in_table(path, dtype):
    """{pattern: ratio} a cost table file holds for `dtype` ("dispatch"; {} where none)."""
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    return {str(k): float(v) for k, v in op_costs.table_entry(path, dtype, "dispatch").items()}


def _cache_path(config, dtype):
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    return op_costs.cache_file(config, dtype, "dispatch", f"-v{VERSION}")


def _read(path):
    try:
        with open(path) as f:
            data = json.load(f)
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def _in_child(dtype, ops):
    """{pattern: ratio} for `ops`, measured in a child process (TensorFlow's trace output and
    the probe Sessions stay out of this one)."""
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, _OUT)
        proc = subprocess.run(
            _command(dtype, ops, out), env=_child_env(), capture_output=True, text=True,
            timeout=CHILD_TIMEOUT_SECONDS, check=False)
        if proc.returncode != 0:
            raise ValueError(f"the child exited with {proc.returncode}: "
                             f"{proc.stderr.strip().splitlines()[-1:] or ''}")
        with open(out) as f:
            return json.load(f)


def pattern_graph(tf, pattern, f32, dtype):
    """(graph, initializer, fetch) of one pattern (`_patterns`' (shapes, build)) in `dtype`."""
    shapes, build = pattern
    graph = tf.Graph()
    with graph.as_default():
        held = {}
        for index, (k, shape) in enumerate(sorted(shapes.items())):
            # drawn in the graph: a large constant would be copied into every Session's graph
            value = 0.1 * tf.random.stateless_normal(shape, seed=[index, 0])
            held[k] = tf.compat.v1.Variable(value if k in f32 else tf.cast(value, dtype),
                                            trainable=False)
        out = build({k: h.value() for k, h in held.items()})
        # one element fetched: the pattern runs whole (a NoOp target grouping it would be
        # pruned by Grappler, the pattern never run) and little is copied out
        target = tf.reshape(out, [-1])[:1]
        init = tf.compat.v1.global_variables_initializer()
    return graph, init, target


def measure(dtype, ops, done=None):
    """{pattern: ratio} for the patterns of the op types `ops` (in that order where it is a
    list), timed here (in this process: the child's). `done(results so far)` is called after
    each pattern."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf1 = tf.compat.v1
    half = tf.as_dtype(dtype)
    results = {}
    with tf.Graph().as_default():
        patterns, f32 = _patterns(tf, dtype)
    rank = {op: index for index, op in enumerate(ops)} if isinstance(ops, list) else {}
    for pattern in sorted(patterns, key=lambda p: (rank.get(op_of(p), len(rank)),
                                                   FIRST.index(p) if p in FIRST else len(FIRST),
                                                   p)):
        if op_of(pattern) not in ops:
            continue
        seconds = {}
        for name, dt in (("float32", tf.float32), ("half", half)):
            graph, init, target = pattern_graph(tf, patterns[pattern], f32, dt)
            with tf1.Session(graph=graph) as session:
                session.run(init)
                timeout = TIMEOUT_FLOOR_MS if name == "float32" else max(
                    TIMEOUT_FLOOR_MS, int(TIMEOUT_FACTOR * seconds["float32"] * 1e3))
                options = tf1.RunOptions(timeout_in_ms=timeout)
                try:
                    session.run(target, options=options)  # warm-up, Grappler
                    runs = []
                    for _ in range(RUNS):
                        began = time.perf_counter()
                        session.run(target, options=options)
                        runs.append(time.perf_counter() - began)
                    seconds[name] = min(runs)
                except tf.errors.DeadlineExceededError:
                    seconds[name] = timeout / 1e3
                    seconds["stopped"] = True
        results[pattern] = round(seconds["half"] / seconds["float32"], 3)
        if done is not None:
            done(results)
    return results


def _main(argv):
    import argparse  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser(prog="python -m tf_mpt.costs.dispatch")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--ops", default="")
    parser.add_argument("--out", help="written after each pattern (atomically)")
    parser.add_argument("--cache", help="a cache file the ratios are merged into at the end")
    options = parser.parse_args(argv)
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    ops = options.ops.split(",") if options.ops else list(
        dict.fromkeys(op_of(p) for p in FIRST + PATTERNS))

    def done(results):
        if options.out:
            op_costs._write_atomically(  # pylint: disable=protected-access
                options.out, json.dumps(results, indent=1, sort_keys=True))
    result = measure(options.dtype, ops, done)
    done(result)
    if options.cache:
        merged = dict(_read(options.cache), **result)
        os.makedirs(os.path.dirname(options.cache) or ".", exist_ok=True)
        op_costs._write_atomically(  # pylint: disable=protected-access
            options.cache, json.dumps(merged, indent=1, sort_keys=True))
    if not options.out:
        print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    _main(sys.argv[1:])
