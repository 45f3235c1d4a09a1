"""What an op costs on this machine in float32 and in the half type, measured at first use.

The cost model decides per op whether half precision pays here, so it needs the speed of the
half kernels of *this* CPU. On an AMD Zen 4, bfloat16 is ~1.8x float32 for a large Conv2D,
but a bfloat16 Sigmoid is ~3x slower than float32's, a small MatMul loses to its reorders, a
bfloat16 Add (half the bytes) is faster, and a bfloat16 DepthwiseConv2dNativeBackpropInput
with stride 2 is 15-80x slower. No fixed table is right on every CPU, so (probes.py):

* each op type is timed once at a few sizes in float32 and in the half type, and
      time(op, dtype, n)               n = FLOPs (contractions.FLOP_OPS) or elements
  interpolates linearly between those points (beyond the largest: the last segment's slope;
  below the smallest: the smallest time), cached as JSON in TF_MPT_CACHE_DIR under a key of
  this CPU's identity (_cpu.identity: its model and half-precision flags, as `auto` sees
  them), TensorFlow's version and MEASURE_VERSION. Only the op types a graph has are timed,
  the first time a graph has them (a convolutional net's training step: 16 op types, ~1.5 s
  on a Zen 4; all 68: ~7 s), so the table grows with the graphs a machine rewrites;
* each matrix product or convolution (contractions.NODE_TIMED_OPS) is timed at its own
  shapes and attrs the first time a graph has it, and cached the same way.

Both are measured in one child process per process (ProbeServer: TensorFlow imported there
once, started early by the automatic path while its optimizer compiles), in the measuring
step a rewrite takes before it decides anything (rewrite._measure_workloads).

TF_MPT_OP_COSTS=<file> uses a table written before (`python -m tf_mpt.costs.probes
--out FILE`; a JSON list of such tables holds one per half type) and measures nothing:
per-node times then come from the op types' points (tests inject a table that way, so their
decisions do not depend on the machine).
"""

import atexit
import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import threading
import typing

from tf_mpt import _cpu
from tf_mpt._process import state as _state
from tf_mpt import config as _config
from tf_mpt.costs import contractions as _contractions
from tf_mpt.costs import probe_ops as _probe_ops

_log = logging.getLogger("tf_mpt")

MEASURE_VERSION = 9
MEASURE_TIMEOUT = 600  # seconds for one measurement (a table takes ~5, a node ~0.1)

# The attrs that change such an op's kernel time (besides its shapes and T).
NODE_ATTRS = ("strides", "padding", "explicit_paddings", "dilations", "data_format",
              "transpose_a", "transpose_b", "adj_x", "adj_y", "equation")
# Integer inputs that hold the op's output shape: (op, input port).
SIZE_INPUTS = {("Conv2DBackpropInput", 0), ("Conv2DBackpropFilter", 1),
                ("DepthwiseConv2dNativeBackpropInput", 0),
                ("DepthwiseConv2dNativeBackpropFilter", 1)}

# Ops that move or view data and have no kernel time worth a Cast (never a reason to keep an
# op float32): costed 0.
FREE_OPS = frozenset((
    "Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot",
    "PreventGradient", "Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike",
    "EnsureShape", "CheckNumerics", "Enter", "Exit", "Merge", "Switch", "NextIteration"))


class NodeTime(typing.NamedTuple):
    """The kernel seconds of one node (a node_spec) in float32 and in the half type."""
    float32: float
    half: float


@dataclasses.dataclass(frozen=True)
class OpCosts:
    """Measured costs: {op: ((units, seconds), ...)} per dtype, and the Casts'.

    Attributes:
        dtype: the half type measured ('bfloat16' or 'float16').
        source: where the table comes from ("measured on <CPU>" or a file), for the report.
        float32 / half: {op type: ((units, seconds), ...) by units}; unit = FLOP for
            contractions.FLOP_OPS, else element.
        cast: ((elements, seconds), ...) of a Cast between float32 and the half type (the
            mean of both directions).
        fusions: the remapper fusions of the machine measured (_cpu.REMAPPER_FUSIONS names;
            a table written before they were recorded: all of them).
        threads: the CPU threads of the machine measured (0: not recorded).
        probed: the op types measured for it, those whose kernels did not run included (a
            table of this CPU grows by the op types each graph needs).
        nodes: per-node times (NodeTimes for this CPU, TableNodes for a file), or None.
    """
    dtype: str
    source: str
    float32: dict
    half: dict
    cast: tuple
    fusions: tuple = tuple(sorted(_cpu.REMAPPER_FUSIONS))
    threads: int = 0
    probed: tuple = ()
    nodes: typing.Optional["NodeTimes"] = dataclasses.field(default=None, compare=False)

    def knows(self, op):
        return op in FREE_OPS or (op in self.float32 and op in self.half)

    def time(self, op, units, half):
        """Seconds of one `op` over `units` (FLOPs or elements) in half or float32; None if
        not measured. FREE_OPS cost 0."""
        if op in FREE_OPS:
            return 0.0
        table = self.half if half else self.float32
        if op not in table:
            return None
        return _interpolate(table[op], units)

    def half_minus_float32(self, op, units):
        """Seconds the half kernel takes more than float32's (negative: half is faster)."""
        half, single = self.time(op, units, True), self.time(op, units, False)
        return None if half is None or single is None else half - single

    def cast_time(self, elements):
        return _interpolate(self.cast, elements)

    def node_seconds(self, specs):
        """{spec: NodeTime} known for these node_spec keys: this machine's (measured by
        measure_nodes before the decisions), a table's (`tf-mpt measure --model`), or none.
        Read-only: never measures."""
        return {} if self.nodes is None or not specs else self.nodes.lookup(specs)

    def measure_nodes(self, specs):
        """The measuring step, apart from every decision: times the node_spec keys this
        CPU's cache does not hold yet (one child process), for node_seconds to read. A
        table's nodes are never measured. Records the keys while `recording_node_specs`."""
        recorder = _state.STATE.node_spec_recorder
        if recorder is not None:
            recorder.update(specs)
        if isinstance(self.nodes, NodeTimes) and specs:
            self.nodes.measure(specs)

    def merged(self, other):
        """This table with `other`'s op types and Casts added (`other` wins where both
        have one)."""
        return dataclasses.replace(
            self, float32={**self.float32, **other.float32}, half={**self.half, **other.half},
            cast=other.cast or self.cast, threads=other.threads or self.threads,
            probed=tuple(sorted(set(self.probed) | set(other.probed))))

    def to_json(self):
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "nodes"}
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text, source=None):
        return cls.from_dict(json.loads(text), source)

    @classmethod
    def from_dict(cls, data, source=None):
        """A table as `to_json` or `tf-mpt measure` wrote it; its "nodes" (per-node times of
        a model, `tf-mpt measure --model`), when present, answer node_seconds."""
        nodes = data.get("nodes")
        fusions = data.get("fusions", sorted(_cpu.REMAPPER_FUSIONS))
        unknown = set(fusions) - _cpu.REMAPPER_FUSIONS
        if unknown:
            raise ValueError(f"unknown fusions {sorted(unknown)} (known: "
                             f"{sorted(_cpu.REMAPPER_FUSIONS)})")
        return cls(dtype=data["dtype"], source=source or data["source"],
                   float32={k: _points(v) for k, v in data["float32"].items()},
                   half={k: _points(v) for k, v in data["half"].items()},
                   cast=_points(data["cast"]), fusions=tuple(sorted(fusions)),
                   threads=int(data.get("threads", 0)),
                   probed=tuple(sorted(data.get("probed", set(data["float32"]) |
                                                set(data["half"])))),
                   nodes=None if nodes is None else TableNodes(nodes))


def _points(value):
    points = tuple(sorted((float(n), float(t)) for n, t in value))
    if len(points) < 2:
        raise ValueError(f"an op's times need two points or more, not {value!r}")
    return points


def _interpolate(points, units):
    """Seconds at `units` on the piecewise-linear curve through `points` (sorted by units;
    the last segment's slope beyond them, the first point's time below them)."""
    if units <= points[0][0]:
        return points[0][1]
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if units <= n1:
            break  # else the last segment, extended
    return max(0.0, t0 + (t1 - t0) * (units - n0) / (n1 - n0))


# --- the table of this machine --------------------------------------------------------------

def node_spec(node, input_shapes, output_shape, constant_inputs):
    """The key (JSON text) a contractions.NODE_TIMED_OPS node is timed and cached under, or
    None when a shape it needs is unknown.

    node: its NodeDef; input_shapes: static shape (tuple) or None per data input;
    output_shape: its first output's; constant_inputs: per data input, True if a Const.
    """
    if (node.op not in _contractions.NODE_TIMED_OPS or output_shape is None
            or any(d < 0 for d in output_shape)):
        return None
    inputs = []
    for port, shape in enumerate(input_shapes):
        if (node.op, port) in SIZE_INPUTS:
            inputs.append(("int", list(output_shape), True))
        elif shape is None or any(d is None or d < 0 for d in shape):
            return None
        else:
            inputs.append(("float", list(shape), bool(constant_inputs[port])))
    attrs = {k: base64.b64encode(node.attr[k].SerializeToString(deterministic=True)).decode()
             for k in NODE_ATTRS if k in node.attr}
    return json.dumps({"op": node.op, "attrs": attrs, "inputs": inputs}, sort_keys=True)


# the distributions TensorFlow's own module comes from (their version is its __version__)
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly",
                    "tf-nightly-cpu")


def installed_tensorflow_versions():
    """The versions of the TensorFlow distributions installed, read from their metadata
    without importing TensorFlow (for a cache file's name before its import)."""
    from importlib import metadata  # pylint: disable=import-outside-toplevel
    versions = []
    for name in TF_DISTRIBUTIONS:
        try:
            versions.append(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    return versions


def cache_key(dtype, machine, tf_version=None):
    """The key this CPU's tables are cached under: `machine` (_cpu.identity: the same idea
    of this CPU `auto` decides from, injected flags included), TensorFlow's version
    (`tf_version`, or the imported TensorFlow's), MEASURE_VERSION, `dtype` and the thread
    count."""
    if tf_version is None:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        tf_version = tf.__version__
    text = "|".join([machine, tf_version, str(MEASURE_VERSION), dtype,
                     str(os.cpu_count())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def bind(target, config, dtype, ops=()):
    """`target` (a tf_mpt.targets.Target) with what its decisions read, made once per
    rewrite: its table (`costs`, None for `rules`), the machine the table stands for, its
    fusions and threads. For `here`, the table holds what this CPU's cache holds and the op
    types in `ops` (measured now where missing; None: every op type a probe times).
    Raises ValueError for a bad table file."""
    costs = table_for(target, config, dtype, ops)
    if costs is None:
        return target
    machine = _cpu.identity(config) if target.measures else costs.source
    return dataclasses.replace(target, costs=costs, machine=machine,
                               fusions=frozenset(costs.fusions), threads=costs.threads)


def table_for(target, config, dtype, ops=None):
    """The OpCosts decisions for `target` (a tf_mpt.targets.Target) read for `dtype` (a name):
    None for `rules`; the target's table file; for `here` the table standing in for this CPU
    (TF_MPT_OP_COSTS) or `costs_for`. Raises ValueError for a bad file."""
    if target.kind == "rules":
        return None
    if target.table is None:
        return costs_for(config, dtype, ops)
    return _file_table(target.table, dtype)


def costs_for(config, dtype, ops=None):
    """This CPU's OpCosts for `dtype` (a name): the file TF_MPT_OP_COSTS names, else this
    machine's table: cached, with the op types of `ops` it lacks measured now (None: every
    op type a probe times, where none is cached yet; (): none, and no Casts either) and
    cached; None if a measurement failed (the cost model is then off in this process, with
    one warning). Raises ValueError for a bad file."""
    if config.op_costs:
        return _file_table(config.op_costs, dtype)
    directory = config.cache_directory
    machine = _cpu.identity(config)
    tables = _state.STATE.op_cost_tables
    key = ("measured", directory, dtype, machine)
    if key not in tables:
        tables[key] = _cached(directory, dtype, machine)
    costs = tables[key]
    if costs is None or ops == ():
        return costs
    if ops is None:  # every op type, unless some were measured already
        wanted = None if not costs.probed else set()
    else:
        wanted = (set(ops) & _probe_ops.PROBED_OPS) - set(costs.probed)
    if wanted is None or wanted or not costs.cast:
        tables[key] = costs = _measured(directory, dtype, machine, costs, wanted)
    return costs


def _file_table(path, dtype):
    """The table for `dtype` in the file at `path`, read once per version of the file (a
    table `tf-mpt measure` rewrites is read again)."""
    key = ("file", path, dtype)
    try:
        stat = os.stat(path)
        key = key + (stat.st_mtime_ns, stat.st_size)
    except OSError:
        pass  # _read says what is wrong with it
    tables = _state.STATE.op_cost_tables
    if key not in tables:
        tables[key] = _read(path, dtype)
    return tables[key]


class TableNodes:
    """Per-node kernel times read from a table: {node_spec key: NodeTime}; a node the table
    does not hold has none (nothing is measured)."""

    def __init__(self, times):
        self.times = {k: NodeTime(*v) for k, v in times.items() if len(v) == 2}

    def lookup(self, specs):
        return {k: self.times[k] for k in specs if k in self.times}


@contextlib.contextmanager
def recording_node_specs():
    """Collects into the set it yields every node_spec key the cost model asks times for
    while it is open (what `tf-mpt measure --model` times)."""
    recorder = _state.STATE.node_spec_recorder = set()
    try:
        yield recorder
    finally:
        _state.STATE.node_spec_recorder = None


def _read(path, dtype):
    """The table for `dtype` in the file: one table, or a list of tables (one per dtype)."""
    try:
        with open(path) as f:
            data = json.load(f)
        tables = [OpCosts.from_dict(table, source=f"the table in {path}")
                  for table in (data if isinstance(data, list) else [data])]
        costs = next((t for t in tables if t.dtype == dtype), tables[0])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
        raise ValueError(f"the cost table {path!r} ({_config.TF_MPT_TARGET} or "
                         f"{_config.TF_MPT_OP_COSTS}) is not a readable op-cost table "
                         f"({type(error).__name__}: {error}); write one with `tf-mpt measure "
                         "--out FILE` on the target machine, or use the target rules") from error
    if costs.dtype != dtype:
        raise ValueError(f"the cost table {path!r} ({_config.TF_MPT_TARGET} or "
                         f"{_config.TF_MPT_OP_COSTS}) holds costs for {costs.dtype}, not "
                         f"{dtype}; write a table for {dtype} with `tf-mpt measure --dtype "
                         f"{dtype} --out FILE` on the target machine")
    return costs


class MeasureFailed(RuntimeError):
    """The child process measuring kernel times failed (the message says how)."""


def _in_child(directory, dtype, nodes=None, ops=None):
    """The op table for `dtype` (nodes None; `ops`: the op types to time, None: all) or the
    times of `nodes` (node_spec keys), as JSON text, measured by this process's ProbeServer
    (a child process: TensorFlow's trace warnings and the probe Sessions stay out of this
    one). Raises MeasureFailed."""
    try:
        return _probe_server(directory).request(dtype, nodes, ops)
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        _discard_probe_server()
        raise MeasureFailed(f"{type(error).__name__}: {error}") from error
    except MeasureFailed:
        _discard_probe_server()
        raise


class ProbeServer:
    """One child process that measures for this process (`python -m
    tf_mpt.costs.probes --serve`): TensorFlow is imported there once, however many
    graphs ask for new shapes, and can be imported early (`start_measuring_early`) while
    this process does other work. It reads one JSON request per line and exits when its
    stdin closes: at this process's exit, or when this process dies."""

    def __init__(self, directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.log = tempfile.TemporaryFile(dir=directory)  # its stderr, for a failure's tail
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_ENABLE="0",
                   TF_MPT_GRAPH_REWRITE="0", TF_MPT_LOSS_SCALING="0")
        self.owner = os.getpid()  # a forked child starts its own
        self.lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tf_mpt.costs.probes", "--serve"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)

    def request(self, dtype, nodes, ops=None):
        """The reply's result as JSON text; MeasureFailed if the child fails or exits."""
        line = json.dumps({"dtype": dtype, "nodes": None if nodes is None else sorted(nodes),
                           "ops": None if ops is None else sorted(ops)})
        with self.lock:
            self.process.stdin.write((line + "\n").encode())
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], MEASURE_TIMEOUT)
            line = self.process.stdout.readline() if ready else b""
        if not ready:
            raise MeasureFailed(f"the measurement took over {MEASURE_TIMEOUT} s")
        if not line:  # it exited: its stderr's last line says why (_in_child ends it)
            returncode = self.process.wait(timeout=5)
            raise MeasureFailed(f"the measurement exited with {returncode}: {self._tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise MeasureFailed(f"the measurement failed: {reply['error']}")
        return json.dumps(reply["ok"])

    def _tail(self):
        try:
            self.log.seek(0)
            lines = self.log.read().decode(errors="replace").strip().splitlines()
            return lines[-1] if lines else ""
        except OSError:
            return ""

    def close(self):
        """Ends the child at once: it holds nothing of this process's (a request returns only
        with its whole reply read, and the child writes no file), so it is killed rather than
        waited for. Waiting held a script's exit for its TensorFlow import (a child started
        early that no rewrite used) or for TensorFlow's teardown: 3.5 s on a Zen 4."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.log.close()


def _probe_server(directory):
    """This process's ProbeServer, started if there is none."""
    server = _state.STATE.probe_server
    if server is None or server.owner != os.getpid():
        server = _state.STATE.probe_server = ProbeServer(directory)
        if not _state.STATE.probe_server_atexit:
            _state.STATE.probe_server_atexit = True
            atexit.register(_discard_probe_server)
    return server


def _discard_probe_server():
    server, _state.STATE.probe_server = _state.STATE.probe_server, None
    if server is not None and server.owner == os.getpid():
        server.close()


def start_measuring_early(config, dtype, gpu_visible=False):
    """Starts the ProbeServer now (its TensorFlow import runs beside this process's work)
    when the first rewrite to `dtype` will measure this CPU: the target is `here`, measured,
    and this CPU's table is not cached. Never raises; measures nothing itself."""
    from tf_mpt import targets as _targets  # pylint: disable=import-outside-toplevel
    try:
        target = _targets.resolve(config, dtype, gpu_visible)
        if not target.measures or _state.STATE.probe_server is not None:
            return
        directory = config.cache_directory
        if os.path.exists(_table_path(directory, dtype, _cpu.identity(config))):
            return
        _probe_server(directory)
    except Exception as error:  # pylint: disable=broad-except
        _log.debug("tf_mpt did not start measuring early: %s", error)


def _write_atomically(path, text):
    try:
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False,
                                         suffix=".tmp") as f:
            f.write(text)
        os.replace(f.name, path)
    except OSError as error:
        _log.info("tf_mpt could not cache op costs in %s (%s); they are measured again in the "
                  "next process", path, error)


def cache_file(config, dtype, stem, suffix=""):
    """The path of one of this CPU's cache files beside its op table:
    <cache dir>/<stem>-<dtype>-<cache_key><suffix>.json (graph timing's verdicts, the
    dispatch check's ratios)."""
    directory = config.cache_directory
    key = cache_key(dtype, _cpu.identity(config))
    return os.path.join(directory, f"{stem}-{dtype}-{key}{suffix}.json")


def table_entry(path, dtype, key):
    """The `key` entry ("verdicts", "dispatch") of a cost table file's table for `dtype` (a
    dict; {} where there is none or the file cannot be read). Read once per version of the
    file: a rewrite asks for it every time."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return {}
    return _table_entry_at(path, stamp, dtype, key)


@functools.lru_cache(maxsize=32)
def _table_entry_at(path, stamp, dtype, key):
    del stamp  # (part of the key: a rewritten file is read again)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    for table in data if isinstance(data, list) else [data]:
        if isinstance(table, dict) and table.get("dtype") == dtype:
            found = table.get(key)
            return found if isinstance(found, dict) else {}
    return {}


def _table_path(directory, dtype, machine):
    return os.path.join(directory, f"op_costs-{dtype}-{cache_key(dtype, machine)}.json")


def _read_cached(path):
    try:
        with open(path) as f:
            return OpCosts.from_json(f.read())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cached(directory, dtype, machine):
    """This machine's table as cached (`machine`: _cpu.identity), or an empty one (nothing
    measured yet); its node times from the cache beside it."""
    key = cache_key(dtype, machine)
    nodes = NodeTimes(os.path.join(directory, f"node_costs-{dtype}-{key}.json"), directory,
                      dtype)
    costs = _read_cached(_table_path(directory, dtype, machine))
    if costs is None:
        costs = OpCosts(dtype=dtype, source=f"measured on {_cpu.cpu_model()}", float32={},
                        half={}, cast=())
    return dataclasses.replace(costs, nodes=nodes)


def _measured(directory, dtype, machine, costs, ops):
    """`costs` with the op types `ops` (None: all) and the Casts measured on this CPU and
    merged in, the cache updated; None, with one warning, if the measurement failed."""
    _log.info("tf_mpt is measuring %s in float32 and %s on this CPU for its cost model (once; "
              "cached in %s)", "every op type" if ops is None else f"{len(ops)} op type(s)",
              dtype, directory)
    try:
        measured = OpCosts.from_json(_in_child(directory, dtype,
                                               ops=None if ops is None else sorted(ops)))
    except (MeasureFailed, ValueError, KeyError, TypeError) as error:
        _log.warning("tf_mpt could not measure op costs on this CPU (%s); its cost model is off "
                     "in this process (set %s to a table to use one)", error,
                     _config.TF_MPT_OP_COSTS)
        return None
    costs = costs.merged(measured)
    path = _table_path(directory, dtype, machine)
    on_disk = _read_cached(path)  # another process may have added op types meanwhile
    _write_atomically(path, (on_disk.merged(costs) if on_disk is not None else costs).to_json())
    return costs


class NodeTimes:
    """Kernel times of contractions.NODE_TIMED_OPS nodes of this CPU by node_spec key: this
    process's, then the cache file's; `measure` times new keys (one child process per
    call), `lookup` only reads."""

    def __init__(self, path, directory, dtype):
        self.path, self.directory, self.dtype = path, directory, dtype
        self.known = None
        self.failed = False

    def _load(self):
        try:
            with open(self.path) as f:
                return {k: tuple(v) for k, v in json.load(f).items()}
        except (OSError, ValueError, AttributeError, TypeError):
            return {}

    def lookup(self, specs):
        """{spec: NodeTime} of the specs timed before (this process, the cache file);
        never measures."""
        if self.known is None:
            self.known = self._load()
        return {k: NodeTime(*self.known[k]) for k in specs if len(self.known.get(k, ())) == 2}

    def measure(self, specs):
        """Times the specs neither this process nor the cache file holds (one child process)
        and caches them; a spec that does not run here is not timed again."""
        if self.known is None:
            self.known = self._load()
        missing = sorted(set(specs) - set(self.known))
        if not missing or self.failed:
            return
        _log.info("tf_mpt is timing %d matrix product / convolution shape(s) in float32 and "
                  "%s on this CPU (once; cached in %s)", len(missing), self.dtype,
                  self.directory)
        try:
            measured = json.loads(_in_child(self.directory, self.dtype, missing))
        except (MeasureFailed, ValueError) as error:
            self.failed = True
            _log.warning("tf_mpt could not time shapes on this CPU (%s); its cost model uses "
                         "its per-op lines for them in this process", error)
            measured = {}
        for key in missing:
            self.known[key] = tuple(measured.get(key, ()))
        merged = self._load()
        merged.update(self.known)
        self.known = merged
        _write_atomically(self.path, json.dumps(merged))
