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
that child as the script starts importing TensorFlow (`start_beside_import`: the two imports
run side by side; adopted by `start_early` when the automatic path is switched on, which
starts one itself where none was: every pattern, the common ones first, each written as it is
done), so the script's own start-up hides it and the first rewrite waits
only for the patterns of its op types, which the child then measures next; a rewrite with no
child under way measures only the op types its graph has; a cost table standing in for this
CPU (TF_MPT_OP_COSTS) supplies them instead (its "dispatch" entry; none: nothing is
checked), so tests never measure. Where a TF1 script's first run compiles tf_mpt's Grappler
optimizer beside the import, bfloat16 is measured in the script's own process instead
(`measure_in_place`: the compiler holds the second core, and a child's TensorFlow import
would share the two with it and the script's), as each Session is created or about to run.

The numerics check rides in the same child: each pattern also runs once more in float32 and in
the half type on the same inputs (the float32 graph's values rounded to the half type first),
whole outputs fetched, and

    error ratio = (||half - full|| / ||full||) / (||round_half(full) - full|| / ||full||)

(L2 norms; 1: as good as rounding float32's result). An op type whose pattern errs more than
INACCURATE times that stays float32 where the graph runs here, with one WARNING naming the
op, the ratio and the remedy where one exists: with oneDNN off (TensorFlow's default on a CPU
without VNNI, bfloat16 or AMX; TF_ENABLE_ONEDNN_OPTS=0), TensorFlow's bfloat16 kernels are
Eigen's, which accumulate a convolution's filter gradient in bfloat16 (14x its rounding at
the pattern's shapes); oneDNN's, on a CPU it runs bfloat16 on, accumulate in float32. The
ratios are stored beside the speed ratios (the cache, keyed by whether oneDNN is on, and a
table's "numerics" entry).
"""

import atexit
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import typing
import weakref

from tf_mpt import _cpu
from tf_mpt._process import state as _state

SLOW = 3.0
INACCURATE = 4.0  # error ratio over which a half kernel stays float32 (1: rounding level)
TIMEOUT_FACTOR = 50.0
TIMEOUT_FLOOR_MS = 2000
RUNS = 5
# 3: each pattern's error ratio too; 2: the patterns run (1 fetched a NoOp Grappler pruned)
VERSION = 3

ELEMENTS = (2048, 2048)  # element-wise probes: 4M elements
DRAWN = 1 << 16  # random values drawn per tensor; a larger one repeats them


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
        # x's own mean and variance (a variance drawn at random, negative: NaN outputs)
        "FusedBatchNormGradV3": (norm, lambda v: tf.raw_ops.FusedBatchNormGradV3(
            y_backprop=v["dy"], x=v["x"], scale=v["scale"], reserve_space_1=tf.zeros([64]),
            reserve_space_2=tf.fill([64], 0.01), reserve_space_3=v["offset"],
            is_training=True)[0]),
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


@dataclasses.dataclass(frozen=True)
class Ratios:
    """What the check found for some patterns: {pattern: half time / float32 time}
    (`dispatch`) and {pattern: error ratio} (`numerics`: a pattern stopped for its time has
    none). A pattern is checked once it has a dispatch ratio. As JSON (the child's output, the
    cache): {"dispatch": {...}, "numerics": {...}}."""
    dispatch: typing.Mapping = dataclasses.field(default_factory=dict)
    numerics: typing.Mapping = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, data):
        """From the JSON layout (a mapping); ValueError for another value."""
        if not isinstance(data, dict):
            raise ValueError("the dispatch check's ratios must be a JSON object "
                             "{\"dispatch\": {pattern: ratio}, \"numerics\": {pattern: ratio}}."
                             f" Received: {data!r:.80}")
        return cls(*({str(k): float(v) for k, v in (data.get(key) or {}).items()}
                     for key in ("dispatch", "numerics")))

    def to_json(self):
        return json.dumps({"dispatch": dict(self.dispatch), "numerics": dict(self.numerics)},
                          indent=1, sort_keys=True)

    def merged(self, other):
        """These ratios with `other`'s (which win)."""
        return Ratios({**self.dispatch, **other.dispatch}, {**self.numerics, **other.numerics})


def slow_ops(found, ops):
    """{op type: (ratio, pattern)} for the op types among `ops` whose half kernel, as
    TensorFlow runs it here, took more than SLOW times float32 (the worst pattern of each) in
    `found` (a Ratios: `ratios`)."""
    return _worst(found.dispatch, ops, SLOW)


def inaccurate_ops(found, ops):
    """{op type: (error ratio, pattern)} for the op types among `ops` whose half kernel, as
    TensorFlow runs it here, erred more than INACCURATE times the rounding of float32's
    result to the half type (the worst pattern of each) in `found` (a Ratios: `ratios`)."""
    return _worst(found.numerics, ops, INACCURATE)


def _worst(by_pattern, ops, bound):
    worst = {}
    for pattern, ratio in by_pattern.items():
        op = op_of(pattern)
        if op in ops and ratio > bound and ratio > worst.get(op, (0.0, ""))[0]:
            worst[op] = (ratio, pattern)
    return worst


def ratios(config, dtype, ops):
    """The Ratios covering the patterns of `ops`: from the table standing in for this CPU
    (config.op_costs) where one is set, else measured here once (cached); what could be
    measured where the child failed (said once)."""
    wanted = set(ops) & CHECKED_OPS
    if not wanted:
        return Ratios()
    if config.op_costs:  # a table stands in for this CPU: its entries, nothing measured
        return in_table(config.op_costs, dtype)
    path = _cache_path(config, dtype)
    known = _read(path)
    missing = {op_of(p) for p in PATTERNS if op_of(p) in wanted and p not in known.dispatch}
    if not missing:
        return known
    try:
        _log_measuring(dtype, missing)
        early = _EARLY.get(dtype)
        if early is not None:
            known = known.merged(early.wait_for([p for p in PATTERNS if op_of(p) in missing]))
            missing = {op_of(p) for p in PATTERNS
                       if op_of(p) in wanted and p not in known.dispatch}
        if missing:
            known = known.merged(Ratios.from_json(_in_child(dtype, sorted(missing))))
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        _state.warn_once(("dispatch check", dtype),
                         "tf_mpt could not check how TensorFlow runs %s kernels on this CPU "
                         "(%s: %s); no op is kept float32 for a slow or inaccurate half kernel",
                         dtype, type(error).__name__, error)
        return known
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
        op_costs._write_atomically(path, known.to_json())  # pylint: disable=protected-access
    except OSError:
        pass  # measured again by the next process
    return known


def onednn_on():
    """Whether TensorFlow runs its oneDNN kernels in this process (TF_ENABLE_ONEDNN_OPTS, or
    its default for this CPU; read once, when TensorFlow starts)."""
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=import-outside-toplevel
    return bool(_pywrap_util_port.IsMklEnabled())


def remedy(dtype, onednn, flags):
    """What makes an inaccurate `dtype` kernel accurate here, as a clause ('' where nothing
    known does): with oneDNN off (`onednn` False), oneDNN's bfloat16 kernels, on a CPU it runs
    bfloat16 on (`flags`: avx512f or avx_ne_convert, TensorFlow's
    IsDataTypeSupportedByOneDNNOnThisCPU; elsewhere TensorFlow falls back to Eigen's). Not for
    float16: oneDNN runs it only with AVX512_FP16 or AMX_FP16, on its slow reference path for
    most ops (the dispatch check keeps them float32 anyway)."""
    if onednn or dtype != "bfloat16" or not _cpu.grappler_bfloat16_runs(flags):
        return ""
    return ("oneDNN is off in this process: set TF_ENABLE_ONEDNN_OPTS=1 (before TensorFlow "
            "starts) for oneDNN's bfloat16 kernels, which accumulate in float32")


def error_ratio(half_out, full_out, half_type):
    """How far a half kernel's output `half_out` is from float32's `full_out` on the same
    inputs, in units of the rounding of `full_out` to `half_type` (a numpy dtype):

        (||half_out - full_out|| / ||full_out||) / (||round(full_out) - full_out|| / ||full_out||)

    L2 norms: the differences taken in float32 (exact for values within 2x of each other), their
    squares summed in float64 (a float64 copy of a 4M-element output costs 3x the time, for
    nothing). 1: as good as rounding float32's result; 0: the same output. Where float32's
    output is (nearly) exact in the half type (a max pool, a Relu of half inputs), its rounding
    counts as at least eps / 8 of the half type: a small error is not magnified."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    def norm(values):
        return float(np.sqrt(np.square(values).sum(dtype=np.float64)))
    full = np.asarray(full_out, np.float32).ravel()
    error = norm(np.asarray(half_out, np.float32).ravel() - full)
    if error == 0:
        return 0.0
    rounding = norm(full.astype(half_type).astype(np.float32) - full)
    floor = float(np.finfo(half_type).eps) / 8 * norm(full)
    return error / max(rounding, floor, float(np.finfo(np.float64).tiny))


def described(config, dtype):
    """Lines for `tf-mpt cpu`: what the dispatch and numerics checks found for `dtype` on this
    CPU (the table standing in for it, or the cache), without measuring."""
    if not config.dispatch_check:
        return [f"{dtype} kernels: not checked (TF_MPT_DISPATCH_CHECK=0)"]
    onednn = onednn_on()
    if config.op_costs:
        found = in_table(config.op_costs, dtype)
        where = f"from {os.path.basename(config.op_costs)} (TF_MPT_OP_COSTS)"
        none = "nothing checked (the table has no \"dispatch\" entry)"
    else:
        found = _read(_cache_path(config, dtype))
        where = f"oneDNN {'on' if onednn else 'off'}, measured here"
        none = (f"not measured yet (the first rewrite to {dtype} of a graph that runs here "
                "measures them, once)")
    if not found.dispatch:
        return [f"{dtype} kernels ({where}): {none}"]
    inaccurate = inaccurate_ops(found, CHECKED_OPS)
    lines = [f"{dtype} kernels ({where}): {len(found.dispatch)}/{len(PATTERNS)} patterns "
             "checked; kept float32 where a graph runs here:",
             f"  over {SLOW:g}x slower than float32: " + _listed(slow_ops(found, CHECKED_OPS)),
             f"  error over {INACCURATE:g}x {dtype} rounding: " + _listed(inaccurate)]
    fix = remedy(dtype, onednn, _cpu.cpu_flags(config)) if inaccurate else ""
    if fix:
        lines.append(f"  remedy: {fix}")
    return lines


def _listed(worst):
    return ", ".join(f"{op} {ratio:.1f}x ({pattern})"
                     for op, (ratio, pattern) in sorted(worst.items())) or "none"


class _Early:
    """A child measuring every pattern, started before any graph asked (`start_early`; or
    `start_beside_import`, as TensorFlow starts importing: `machine` and `cache_dir` are what
    it was started for, and `onednn`, once this process's TensorFlow has said it, the kernels
    its ratios must be of)."""

    def __init__(self, proc, directory, machine=None, cache_dir=None):
        self.proc, self.directory = proc, directory
        self.out = os.path.join(directory, _OUT)
        self.machine, self.cache_dir, self.onednn = machine, cache_dir, None

    def _written(self):
        """(the Ratios in the child's file, whether the child said it runs other kernels than
        this process: a child started beside the import whose TensorFlow set oneDNN
        otherwise, the script having changed TF_ENABLE_ONEDNN_OPTS before its import)."""
        try:
            with open(self.out) as f:
                data = json.load(f)
            found = Ratios.from_json(data)
        except (OSError, ValueError, AttributeError, TypeError):
            return Ratios(), False
        return found, self.onednn is not None and data.get("onednn", self.onednn) != self.onednn

    def done(self):
        """What the child has measured; nothing where it runs other kernels."""
        found, other_kernels = self._written()
        return Ratios() if other_kernels else found

    def wait_for(self, patterns, timeout=CHILD_TIMEOUT_SECONDS):
        """The Ratios the child has measured once it has every one of `patterns`, or has
        ended (then: what it measured), or `timeout` seconds have passed. The child is told
        to measure those next (its file of wanted patterns)."""
        deadline = time.monotonic() + timeout
        missing = sorted(set(patterns) - set(self.done().dispatch))
        if missing:
            from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
            op_costs._write_atomically(  # pylint: disable=protected-access
                os.path.join(self.directory, _WANTED), json.dumps(missing))
        while True:
            found, other_kernels = self._written()
            if other_kernels:
                self.stop()  # the rewrite measures in a child of its own
                return Ratios()
            if all(p in found.dispatch for p in patterns) or self.proc.poll() is not None or \
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
_HERE = set()  # dtypes this process measures itself, before its Sessions run (measure_in_place)
_SCANNED = weakref.WeakKeyDictionary()  # graph -> (its version, operations, op types) seen
_STARTED = {}  # dtype -> _Early started by start_beside_import, until start_early adopts it
_OUT = "dispatch.json"  # (an early child's file of ratios, in its directory)
_WANTED = "wanted.json"  # (the patterns a rewrite waits for: the child measures them next)


def start_early(config, dtype):
    """Starts a child measuring every pattern of `dtype` now, the common ones first, where a
    rewrite in this process will check them (no table stands in for this CPU, and its cache
    lacks some): the automatic path calls it when it is switched on. Never raises."""
    try:
        started = _STARTED.pop(dtype, None)
        stop_started()
        if config.op_costs or not config.dispatch_check or dtype in _EARLY or dtype in _HERE:
            if started is not None:
                started.stop()
            return
        if started is not None:
            if started.proc.poll() in (None, 0) and started.machine == _cpu.identity(config) \
                    and started.cache_dir == config.cache_directory:
                started.onednn = onednn_on()
                _EARLY[dtype] = started
                return
            started.stop()
        cache = _cache_path(config, dtype)
        known = _read(cache)
        missing = [p for p in FIRST + PATTERNS if p not in known.dispatch]
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


def start_beside_import(config, compiling=False):
    """As the script starts importing TensorFlow (the automatic path's start-up hook sees
    it): starts the check's child for the half type this process's rewrites will run here,
    so that its TensorFlow import runs beside the script's own (2.6 s of a Zen 4 core, more
    on a slower one) instead of after it; a process that never imports TensorFlow starts
    none. Only where that is known without TensorFlow: the graph rewrite is on, no table
    stands in for this CPU, the check is on, the dtype is a half type here (`auto` resolved as
    without a GPU) and the machine has no GPU device (with one, the graphs may run there:
    `start_early` decides once TensorFlow has said). The child
    reads this CPU's cache itself and measures only what it lacks; whether oneDNN is on is
    its TensorFlow's (the script's environment at start), checked against the script's when
    `start_early` adopts it; a child nothing adopts is stopped, and killed at the exit. A
    cache that holds every pattern already (the runs after the first) starts none.
    `compiling`: tf_mpt's Grappler optimizer compiles beside the import (a TF1 script's first
    run): for bfloat16 no child starts, the Sessions check in this process (measure_in_place).
    Never raises."""
    try:
        if not config.graph_rewrite or config.op_costs or not config.dispatch_check or \
                _cpu.gpu_device_present():
            return
        dtype = config.resolve_dtype(False, _cpu.has_native_bfloat16(_cpu.cpu_flags(config)))
        if dtype is None or dtype in _STARTED:
            return
        machine, cache_dir = _cpu.identity(config), config.cache_directory
        if _cached_already(cache_dir, machine, dtype):
            return
        if dtype == "bfloat16" and compiling:
            _HERE.add(dtype)  # the compiler holds the other core: see measure_in_place
            return
        directory = tempfile.mkdtemp(prefix="tf_mpt_dispatch_")
        command = _command(dtype, list(dict.fromkeys(op_of(p) for p in FIRST + PATTERNS)),
                           os.path.join(directory, _OUT))
        proc = subprocess.Popen(command + ["--cache-dir", cache_dir, "--machine", machine],
                                env=_child_env(onednn=None), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        _STARTED[dtype] = _Early(proc, directory, machine, cache_dir)
        atexit.register(_STARTED[dtype].stop)
    except Exception as error:  # pylint: disable=broad-except
        _state.warn_once(("dispatch beside import",),
                         "tf_mpt did not start checking half kernels beside TensorFlow's "
                         "import (%s: %s); it starts once TensorFlow is imported",
                         type(error).__name__, error, level=10)


def measure_in_place(config, dtype, graph, session_config=None):
    """Where a TF1 script's first run compiles tf_mpt's Grappler optimizer beside TensorFlow's
    import (`start_beside_import` left the check to this process: `_HERE`), a Session about to
    be created on `graph` or to run it calls this first: the patterns of the op types `graph`
    holds that this CPU's cache lacks are measured here, in this process, and cached, so that
    the rewrite inside the Session's graph optimisation (where no Session may run) reads them.

    Why here and not in a child: on two cores the script's TensorFlow import and the compiler
    fill both, and a child's own TensorFlow import (~2.8 s of a Zen 4 core) was the largest
    part of a TF1 script's first-run overhead; the first Session waits for the compiler
    anyway, and this runs while it does. bfloat16 only: a float16 kernel can take oneDNN's
    reference path (195x float32 on a Sapphire Rapids), which a child can be killed over.

    The pattern Sessions take the threading of `session_config` (the user's Session's
    ConfigProto): TensorFlow sizes its process-wide thread pools by the first Session's
    options, so the user's Session finds them as it would have made them. Op types added
    since the last call are read from the graph's new operations only. Never raises: where it
    fails (said at DEBUG), the rewrite measures in a child as before."""
    if dtype not in _HERE or config.op_costs or not config.dispatch_check:
        return
    try:
        version, scanned, types = _SCANNED.get(graph, (None, 0, frozenset()))
        if version == graph.version:
            return
        operations = graph.get_operations()
        types = types | {op.type for op in operations[scanned:]}
        _SCANNED[graph] = (graph.version, len(operations), types)
        path = _cache_path(config, dtype)
        known = _read(path)
        missing = sorted({op_of(p) for p in PATTERNS
                          if op_of(p) in types and p not in known.dispatch})
        if not missing:
            return
        _log_measuring(dtype, missing, ", in this process while its optimizer compiles")
        with _state.bypass():
            found = measure(dtype, missing, known=known,
                            session_config=_threading_of(session_config))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
        op_costs._write_atomically(  # pylint: disable=protected-access
            path, _read(path).merged(found).to_json())
    except Exception as error:  # pylint: disable=broad-except
        _state.warn_once(("dispatch in place", dtype),
                         "tf_mpt could not check %s kernels in this process (%s: %s); the "
                         "rewrite checks them in a child process", dtype,
                         type(error).__name__, error, level=10)


_THREADING = ("intra_op_parallelism_threads", "inter_op_parallelism_threads",
              "use_per_session_threads")  # (and the repeated session_inter_op_thread_pool)


def _threading_of(session_config):
    """A ConfigProto holding only the thread settings of `session_config` (None: None)."""
    if session_config is None:
        return None
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    threading = tf.compat.v1.ConfigProto()
    for field in _THREADING:
        setattr(threading, field, getattr(session_config, field))
    threading.session_inter_op_thread_pool.extend(session_config.session_inter_op_thread_pool)
    return threading


def _cached_already(cache_dir, machine, dtype):
    """Whether this CPU's cache holds every pattern of `dtype` already, for oneDNN on or off
    (which one this process's TensorFlow runs is known only once it is imported: where it is
    the other, start_early starts the child then), read without importing TensorFlow: its
    version from the installed distribution's metadata (none found: False, the child
    starts)."""
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    for version in op_costs.installed_tensorflow_versions():
        for onednn in (True, False):
            known = _read(_cache_file(cache_dir, machine, dtype, onednn, version))
            if all(p in known.dispatch for p in PATTERNS):
                return True
    return False


def stop_started():
    """Stops the children start_beside_import started that nothing adopted (the automatic path
    found a GPU, another dtype or no rewrite once TensorFlow was imported)."""
    while _STARTED:
        _STARTED.popitem()[1].stop()


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


def _child_env(onednn=True):
    # the child runs the kernels this process runs (what the cache is keyed by), whatever
    # os.environ says now: TensorFlow read TF_ENABLE_ONEDNN_OPTS once, when it started
    # (`onednn` None: before this process's TensorFlow started, the environment as it is)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn_on() else "0"
    for name in list(env):  # the child is tf_mpt's own probe, never rewritten
        if name.startswith("TF_MPT_") and name != "TF_MPT_CACHE_DIR":
            del env[name]
    return env


def _log_measuring(dtype, ops, where=""):
    _state.warn_once(("dispatch measuring", dtype, tuple(sorted(ops))),
                     "tf_mpt is checking how TensorFlow runs %s %s on this CPU against "
                     "float32, for speed and accuracy%s (once; cached)", dtype,
                     ", ".join(sorted(ops)), where, level=20)


def in_table(path, dtype):
    """The Ratios a cost table file holds for `dtype` (its "dispatch" and "numerics" entries;
    empty where none)."""
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    return Ratios.from_json({key: op_costs.table_entry(path, dtype, key)
                             for key in ("dispatch", "numerics")})


def _cache_path(config, dtype):
    """This CPU's cache of the ratios of `dtype`, for oneDNN on or off (its kernels and
    Eigen's differ in speed and accuracy)."""
    return _cache_file(config.cache_directory, _cpu.identity(config), dtype, onednn_on())


def _cache_file(directory, machine, dtype, onednn, tf_version=None):
    """<directory>/dispatch-<dtype>-<key><suffix>.json, beside the op table of `machine`
    (op_costs.cache_file's layout; its key needs TensorFlow's version: `tf_version`, or the
    imported TensorFlow's)."""
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    key = op_costs.cache_key(dtype, machine, tf_version)
    return os.path.join(directory, f"dispatch-{dtype}-{key}-v{VERSION}-onednn-"
                                   f"{'on' if onednn else 'off'}.json")


def _read(path):
    """The Ratios in `path`; empty where it cannot be read."""
    try:
        with open(path) as f:
            return Ratios.from_json(json.load(f))
    except (OSError, ValueError, AttributeError, TypeError):
        return Ratios()


def _in_child(dtype, ops):
    """The Ratios of `ops` as JSON ({"dispatch": ..., "numerics": ...}), measured in a child
    process (TensorFlow's trace output and the probe Sessions stay out of this one)."""
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


def pattern_graph(tf, pattern, f32, dtype, rounded_to=None):
    """(graph, initializer, fetch, output) of one pattern (`_patterns`' (shapes, build)) in
    `dtype`: `fetch` one element of `output`. With `rounded_to` (a half DType), the values of
    its variables other than `f32` are drawn rounded to that type (a float32 graph on the
    half graph's inputs)."""
    shapes, build = pattern
    graph = tf.Graph()
    with graph.as_default():
        held = {}
        for index, (k, shape) in enumerate(sorted(shapes.items())):
            # drawn in the graph: a large constant would be copied into every Session's graph;
            # a large tensor repeats a block of DRAWN values (drawing 4M normal values took
            # 0.1 s of a Zen 4 core per tensor, most of an element-wise pattern's time)
            size = math.prod(shape)
            block = 0.1 * tf.random.stateless_normal([min(size, DRAWN)], seed=[index, 0])
            value = block if size <= DRAWN else \
                tf.tile(block, [-(-size // DRAWN)])[:size]
            value = tf.reshape(value, shape)
            if k not in f32 and rounded_to is not None:
                value = tf.cast(tf.cast(value, rounded_to), value.dtype)
            held[k] = tf.compat.v1.Variable(value if k in f32 else tf.cast(value, dtype),
                                            trainable=False)
        out = build({k: h.value() for k, h in held.items()})
        # one element fetched: the pattern runs whole (a NoOp target grouping it would be
        # pruned by Grappler, the pattern never run) and little is copied out
        target = tf.reshape(out, [-1])[:1]
        init = tf.compat.v1.global_variables_initializer()
    return graph, init, target, out


def measure(dtype, ops, done=None, wanted=None, known=None, session_config=None):
    """The Ratios of the patterns of the op types `ops` (in that order where it is a list),
    measured here (in this process: the child's). Each pattern runs in float32 and in `dtype`
    on the same values (rounded to `dtype`): RUNS timed runs of one element each, then one
    run fetching the whole output for its error ratio (none where the half run was stopped).
    `done(Ratios so far)` is called after each pattern; `wanted()`, before each, names the
    patterns to measure next (a rewrite waits for them), if any are left. Patterns `known`
    (Ratios, e.g. a cache's) are not measured again; the results include them. The pattern
    Sessions take `session_config` (a ConfigProto: measure_in_place's threading) where given."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf1 = tf.compat.v1
    half = tf.as_dtype(dtype)
    known = known or Ratios()
    speed, numerics = dict(known.dispatch), dict(known.numerics)
    with tf.Graph().as_default():
        patterns, f32 = _patterns(tf, dtype)
    rank = {op: index for index, op in enumerate(ops)} if isinstance(ops, list) else {}
    queue = [p for p in sorted(patterns, key=lambda p: (
        rank.get(op_of(p), len(rank)), FIRST.index(p) if p in FIRST else len(FIRST), p))
        if op_of(p) in ops and p not in known.dispatch]
    while queue:
        asked = wanted() if wanted is not None else ()
        pattern = next((p for p in queue if p in asked), queue[0])
        queue.remove(pattern)
        seconds, outputs = {}, {}
        for name, dt in (("float32", tf.float32), ("half", half)):
            graph, init, target, out = pattern_graph(tf, patterns[pattern], f32, dt, half)
            with tf1.Session(graph=graph, config=session_config) as session:
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
                    outputs[name] = session.run(out, options=options)  # the numerics run
                except tf.errors.DeadlineExceededError:
                    seconds.setdefault(name, timeout / 1e3)
                    seconds["stopped"] = True
        speed[pattern] = round(seconds["half"] / seconds["float32"], 3)
        if len(outputs) == 2:
            numerics[pattern] = round(error_ratio(outputs["half"], outputs["float32"],
                                                  half.as_numpy_dtype), 3)
        if done is not None:
            done(Ratios(dict(speed), dict(numerics)))
    return Ratios(speed, numerics)


def _main(argv):
    import argparse  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser(prog="python -m tf_mpt.costs.dispatch")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--ops", default="")
    parser.add_argument("--out", help="written after each pattern (atomically)")
    parser.add_argument("--cache", help="a cache file the ratios are merged into at the end")
    parser.add_argument("--cache-dir", help="instead of --cache: this CPU's cache directory "
                        "(start_beside_import's child: the file is the one of this process's "
                        "kernels, oneDNN's or Eigen's, and only what it lacks is measured)")
    parser.add_argument("--machine", help="with --cache-dir: _cpu.identity of the parent")
    options = parser.parse_args(argv)
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    write = op_costs._write_atomically  # pylint: disable=protected-access
    ops = options.ops.split(",") if options.ops else list(
        dict.fromkeys(op_of(p) for p in FIRST + PATTERNS))

    known, said = Ratios(), {}
    if options.cache_dir:
        onednn = onednn_on()
        options.cache = _cache_file(options.cache_dir, options.machine, options.dtype, onednn)
        known, said = _read(options.cache), {"onednn": onednn}

    def done(results):
        if options.out:
            write(options.out, json.dumps(dict(json.loads(results.to_json()), **said)))

    def wanted():
        try:
            with open(os.path.join(os.path.dirname(options.out), _WANTED)) as f:
                return set(json.load(f))
        except (OSError, ValueError, TypeError):
            return set()
    done(known)
    result = measure(options.dtype, ops, done, wanted if options.out else None, known)
    done(result)
    if options.cache:
        merged = _read(options.cache).merged(result)
        os.makedirs(os.path.dirname(options.cache) or ".", exist_ok=True)
        write(options.cache, merged.to_json())
    if not options.out:
        print(result.to_json())


if __name__ == "__main__":
    # (at the script's own priority: a niced child starved by a busy machine ran a half
    # kernel past its timeout, 136x "slower", a verdict the cache would have kept)
    _main(sys.argv[1:])
