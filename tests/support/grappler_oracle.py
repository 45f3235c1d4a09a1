"""TensorFlow's Grappler auto mixed precision pass as an oracle, run in a subprocess.

Grappler's AMP pass is run **alone** (no other optimizer) through
`tf_optimizer.OptimizeGraph`, in a child process because it can crash the interpreter
(segfault). The GraphDef goes to the child in a temporary file; the optimized GraphDef and
the timings come back the same way.

Modes used per dtype:

* ``bfloat16``: ``auto_mixed_precision_onednn_bfloat16``. TensorFlow gates it on
  AVX512F / AVX_NE_CONVERT (and oneDNN being on); elsewhere it is a silent no-op, which
  `run_grappler_amp` detects and reports as a skip reason.
* ``float16``: ``auto_mixed_precision_cpu`` with
  ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16=0`` (real float16 on CPU, the same lists
  as the CUDA pass), or, with ``fp16_mode="simulate_gpu"``, ``auto_mixed_precision`` with
  ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_SIMULATE_GPU=1`` (works only when nodes carry no
  device placement).

Fetch nodes go into the MetaGraphDef collection ``train_op``, which is what
`GrapplerItemFromMetaGraphDef` reads as the item's fetch list; fetched nodes are preserved
(never painted) by the pass.

Usable from tests (``tests`` is on ``sys.path``) and from scripts after
``sys.path.insert(0, "<repo>/tests")``. Running this file is the child side
(``python grappler_oracle.py --worker ...``).

`run_grappler_amp_batch` runs several graphs in one child (TensorFlow is imported once).

Example:
    >>> graph_def, info = run_grappler_amp(graph_def, ["loss", "train"], "bfloat16")
    >>> info["skip_reason"] or info["casts_added"]
    8
"""

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BF16_MODE = "auto_mixed_precision_onednn_bfloat16"
FP16_CPU_MODE = "auto_mixed_precision_cpu"
FP16_GPU_MODE = "auto_mixed_precision"
FP16_MODES = ("cpu", "simulate_gpu")
SIMULATE_GPU_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_SIMULATE_GPU"
EMULATE_FP16_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
LOG_PATH_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH"
PAINTBUCKETS_PREFIX = "paintbuckets_"
# Section headers of Grappler's paintbuckets dump -> list names.
_PAINTBUCKET_HEADERS = {"AllowList:": "allow", "DenyList:": "deny", "InferList:": "infer",
                        "ClearList:": "clear"}
# Grappler names its Casts `<src>-<port>-CastToFp16-<k>-AutoMixedPrecision` (Bf16, Fp32).
GRAPPLER_CAST_SUFFIX = "-AutoMixedPrecision"
TF_MPT_CAST_SUFFIX = "-TfMpt"
FUNCTION_SEPARATOR = "::"
# An optimizer that changes nothing on graphs without debug ops (Assert, Print, CheckNumerics):
# timing it measures what OptimizeGraph costs around any pass.
BASELINE_OPTIMIZER = "debug_stripper"

DT_FLOAT = 1
DT_BFLOAT16 = 14
DT_HALF = 19
HALF_ENUM = {"float16": DT_HALF, "bfloat16": DT_BFLOAT16}

DEFAULT_TIMEOUT_S = 300.0
STDERR_TAIL_CHARS = 2000
CPUINFO_PATH = "/proc/cpuinfo"


@dataclasses.dataclass(frozen=True)
class Bf16Support:
    """What this CPU offers for bfloat16.

    Attributes:
        cpu_model: the `model name` line of /proc/cpuinfo ('unknown' if absent).
        flags: the bfloat16-relevant CPU flags present (avx512f, avx512_bf16, amx_bf16,
            avx_ne_convert).
        native: True if the CPU computes in bfloat16 (avx512_bf16 or amx_bf16).
        grappler_bf16_works: True if Grappler's oneDNN bfloat16 pass runs here (TensorFlow's
            IsBF16SupportedByOneDNNOnThisCPU: AVX512F or AVX_NE_CONVERT, with oneDNN on).
        reason: one sentence explaining `grappler_bf16_works`.
    """
    cpu_model: str
    flags: tuple
    native: bool
    grappler_bf16_works: bool
    reason: str


_BF16_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "avx_ne_convert")


def _read_cpuinfo(path=CPUINFO_PATH):
    """Returns (model name, set of flags) of the first processor in `path`."""
    model, flags = "unknown", set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def native_bf16(cpuinfo_path=CPUINFO_PATH, environ=None):
    """Reports whether this CPU computes bfloat16 natively and whether Grappler's bf16 pass works.

    Args:
        cpuinfo_path: the cpuinfo file to read.
        environ: the environment to check TF_ENABLE_ONEDNN_OPTS in (default os.environ).

    Returns:
        A Bf16Support.
    """
    environ = os.environ if environ is None else environ
    model, flags = _read_cpuinfo(cpuinfo_path)
    present = tuple(flag for flag in _BF16_FLAGS if flag in flags)
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    onednn_off = environ.get(ONEDNN_ENV, "").strip() == "0"
    gate = "avx512f" in flags or "avx_ne_convert" in flags
    if onednn_off:
        works, reason = False, f"{ONEDNN_ENV}=0 turns oneDNN off, so {BF16_MODE} is a no-op"
    elif not gate:
        works, reason = False, (f"the CPU has neither avx512f nor avx_ne_convert, so {BF16_MODE} "
                                "is a silent no-op here")
    else:
        works, reason = True, f"the CPU has {' and '.join(present)}, so {BF16_MODE} runs"
    return Bf16Support(model, present, native, works, reason)


def grappler_dtype():
    """'bfloat16' if this CPU computes it natively and Grappler's pass runs, else 'float16'."""
    support = native_bf16()
    return "bfloat16" if support.native and support.grappler_bf16_works else "float16"


def mode_and_env(dtype, fp16_mode="cpu"):
    """Returns (Grappler optimizer name, extra environment variables) for `dtype`.

    Args:
        dtype: 'float16' or 'bfloat16'.
        fp16_mode: 'cpu' (auto_mixed_precision_cpu, EMULATE_FP16=0) or 'simulate_gpu'
            (auto_mixed_precision, SIMULATE_GPU=1; needs nodes without device placement).

    Raises:
        ValueError: an unknown dtype or fp16_mode.
    """
    if dtype == "bfloat16":
        return BF16_MODE, {}
    if dtype != "float16":
        raise ValueError(f"dtype must be 'float16' or 'bfloat16'. Received: dtype={dtype!r}")
    if fp16_mode == "cpu":
        return FP16_CPU_MODE, {EMULATE_FP16_ENV: "0"}
    if fp16_mode == "simulate_gpu":
        return FP16_GPU_MODE, {SIMULATE_GPU_ENV: "1"}
    raise ValueError(f"fp16_mode must be one of {FP16_MODES}. Received: fp16_mode={fp16_mode!r}")


def _fetch_node_names(fetches):
    """'loss:0', '^train' -> 'loss', 'train'."""
    names = []
    for fetch in fetches:
        name = fetch.lstrip("^").split(":")[0]
        if name not in names:
            names.append(name)
    return names


def _crash_reason(returncode, stderr):
    """One sentence for a child that exited with `returncode` (negative: killed by a signal)."""
    if returncode < 0:
        try:
            what = f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            what = f"signal {-returncode}"
        text = f"Grappler subprocess died with {what}"
    else:
        text = f"Grappler subprocess exited with status {returncode}"
    tail = stderr[-STDERR_TAIL_CHARS:].strip()
    return f"{text}: {tail}" if tail else text


def _child_env(extra_env):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in (SIMULATE_GPU_ENV, EMULATE_FP16_ENV, LOG_PATH_ENV):
        env.pop(name, None)
    env.update(extra_env)
    return env


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How to run the child.

    Attributes:
        fp16_mode: see `mode_and_env`.
        repeats: how many times each OptimizeGraph call is timed (after one untimed warm-up
            on a tiny graph); the info's 'seconds' is the median.
        timeout: seconds before the child is killed (for a whole batch).
        want_lists: also read Grappler's effective op lists (the pass then dumps the graphs
            and lists to a temporary directory, which costs time on large graphs).
        baseline: also time OptimizeGraph with `BASELINE_OPTIMIZER` instead of the AMP pass:
            the cost of Grappler's framework (MetaGraphDef import into a GrapplerItem, proto
            conversion), which every optimizer run pays.
    """
    fp16_mode: str = "cpu"
    repeats: int = 1
    timeout: float = DEFAULT_TIMEOUT_S
    want_lists: bool = False
    baseline: bool = False


def _result_info(mode, dtype, extra_env):
    return {
        "mode": mode,
        "dtype": dtype,
        "env": dict(extra_env),
        "seconds": None,
        "seconds_all": [],
        "baseline_seconds": None,
        "casts": [],
        "casts_added": 0,
        "converted_nodes": [],
        "lists": None,
        "skip_reason": None,
    }


class _ChildFailed(Exception):
    """The Grappler subprocess crashed, failed or timed out; the message says how."""


def run_grappler_amp(graph_def, fetches, dtype, **options):
    """Runs Grappler's AMP pass alone on `graph_def` in a subprocess.

    Args:
        graph_def: a GraphDef (not modified).
        fetches: node or tensor names to fetch; they go into the `train_op` collection, so
            Grappler preserves them.
        dtype: 'float16' or 'bfloat16'.
        **options: fields of RunOptions (fp16_mode, repeats, timeout, want_lists, baseline).

    Returns:
        (optimized GraphDef or None, info). The GraphDef is None only when the child failed.
        info keys:
            mode, dtype, env: the Grappler optimizer and the environment variables set for it.
            seconds: median OptimizeGraph wall time (time.perf_counter); seconds_all: each.
            baseline_seconds: with baseline, the median time of the no-op optimizer run.
            casts, casts_added: names and number of the Casts Grappler added (library
                function nodes are named '<function>::<node>', see `all_nodes`).
            converted_nodes: original nodes with a type attr changed from float32 to `dtype`,
                named likewise.
            lists: with want_lists, {'allow'|'infer'|'deny'|'clear': frozenset of op names}.
            skip_reason: None when the result is usable, else why not (a crash, a timeout, or
                the pass was a no-op).
    """
    return run_grappler_amp_batch([(graph_def, fetches)], dtype, **options)[0]


def run_grappler_amp_batch(items, dtype, **options):
    """`run_grappler_amp` for several graphs in one subprocess (one TensorFlow import).

    Args:
        items: a sequence of (graph_def, fetches).
        dtype: 'float16' or 'bfloat16'.
        **options: fields of RunOptions; the timeout is for the whole batch.

    Returns:
        A list of (optimized GraphDef or None, info), one per item. If the child fails, every
        item gets None and the same skip reason.
    """
    options = RunOptions(**options)
    mode, extra_env = mode_and_env(dtype, options.fp16_mode)
    jobs = [(graph_def, _fetch_node_names(fetches)) for graph_def, fetches in items]
    try:
        outputs, lists = _run_child(jobs, mode, extra_env, options)
    except _ChildFailed as failure:
        return [(None, dict(_result_info(mode, dtype, extra_env), skip_reason=str(failure)))
                for _ in items]
    results = []
    for (graph_def, _), (optimized, timings) in zip(jobs, outputs):
        info = _summarize(graph_def, optimized, timings, mode, dtype, extra_env)
        info["lists"] = lists
        results.append((optimized, info))
    return results


def _summarize(graph_def, optimized, timings, mode, dtype, extra_env):
    """The info dict of one successful run (see `run_grappler_amp`)."""
    info = _result_info(mode, dtype, extra_env)
    info["seconds_all"] = timings["amp"]
    info["seconds"] = statistics.median(timings["amp"])
    if timings.get("baseline"):
        info["baseline_seconds"] = statistics.median(timings["baseline"])
    info["casts"] = added_casts(graph_def, optimized, GRAPPLER_CAST_SUFFIX)
    info["casts_added"] = len(info["casts"])
    info["converted_nodes"] = sorted(converted_nodes(graph_def, optimized, dtype))
    if not info["casts"] and not info["converted_nodes"]:
        info["skip_reason"] = _noop_reason(mode, dtype)
    return info


def _run_child(jobs, mode, extra_env, options):
    """Runs the worker on [(graph_def, fetch names)].

    Returns:
        ([(optimized GraphDef, {'amp': [seconds], 'baseline': [seconds]})], lists or None).

    Raises:
        _ChildFailed: the child timed out, died from a signal or exited with an error.
    """
    with tempfile.TemporaryDirectory(prefix="grappler_oracle_") as tmp:
        dump_dir = os.path.join(tmp, "dump")
        if options.want_lists:
            os.mkdir(dump_dir)
            extra_env = {**extra_env, LOG_PATH_ENV: dump_dir}
        spec = {"mode": mode, "repeats": options.repeats, "jobs": [],
                "baseline": BASELINE_OPTIMIZER if options.baseline else None}
        for k, (graph_def, fetch_names) in enumerate(jobs):
            job = {"input": os.path.join(tmp, f"in{k}.pb"),
                   "output": os.path.join(tmp, f"out{k}.pb"), "fetches": fetch_names}
            with open(job["input"], "wb") as f:
                f.write(graph_def.SerializeToString())
            spec["jobs"].append(job)
        spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        _call_worker([spec_path, result_path], extra_env, options.timeout)
        with open(result_path) as f:
            timings = json.load(f)["seconds"]
        outputs = [(_parse_graph_def(job["output"]), seconds)
                   for job, seconds in zip(spec["jobs"], timings)]
        return outputs, read_paintbuckets(dump_dir) if options.want_lists else None


def _call_worker(args, extra_env, timeout):
    """Runs this file as the worker with `args`; raises _ChildFailed unless it succeeds."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", *args]
    try:
        proc = subprocess.run(command, env=_child_env(extra_env), capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise _ChildFailed(f"Grappler subprocess timed out after {timeout:g} s") from error
    if proc.returncode != 0:
        raise _ChildFailed(_crash_reason(proc.returncode, proc.stderr))


def read_paintbuckets(directory):
    """Grappler's effective op lists from the first paintbuckets dump in `directory`.

    Returns:
        {'allow'|'infer'|'deny'|'clear': frozenset of op names}, or None if there is no dump
        (the pass stopped before writing it).
    """
    dumps = sorted(name for name in os.listdir(directory) if name.startswith(PAINTBUCKETS_PREFIX))
    if not dumps:
        return None
    lists, current = {name: set() for name in _PAINTBUCKET_HEADERS.values()}, None
    with open(os.path.join(directory, dumps[0])) as f:
        for line in f:
            line = line.strip()
            if line in _PAINTBUCKET_HEADERS:
                current = _PAINTBUCKET_HEADERS[line]
            elif line and current is not None:
                lists[current].add(line)
    return {name: frozenset(ops) for name, ops in lists.items()}


def _noop_reason(mode, dtype):
    text = f"Grappler {mode} was a no-op (0 Casts, 0 nodes converted)"
    if dtype == "bfloat16":
        support = native_bf16()
        if not support.grappler_bf16_works:
            text += f": {support.reason}"
    return text


def _parse_graph_def(path):
    from tensorflow.core.framework import graph_pb2  # pylint: disable=g-import-not-at-top
    graph_def = graph_pb2.GraphDef()
    with open(path, "rb") as f:
        graph_def.ParseFromString(f.read())
    return graph_def


def _called_functions(nodes, library_names):
    """Names of library functions that `nodes` call (as their op or through func attrs)."""
    called = set()
    for node in nodes:
        if node.op in library_names:
            called.add(node.op)
        for value in node.attr.values():
            if value.HasField("func"):
                called.add(value.func.name)
            called.update(func.name for func in value.list.func)
    return called & library_names


def reachable_functions(graph_def):
    """The library functions the graph can run: called from its nodes, transitively.

    Grappler's output keeps only these; a function no node calls never runs.
    """
    functions = {function.signature.name: function for function in graph_def.library.function}
    names = set(functions)
    reached, frontier = set(), _called_functions(graph_def.node, names)
    while frontier:
        reached |= frontier
        frontier = _called_functions(
            [node for name in frontier for node in functions[name].node_def], names) - reached
    return reached


def all_nodes(graph_def):
    """Yields (name, NodeDef) for the graph's nodes and the nodes of its reachable functions.

    Function nodes are named '<function>::<node>': Grappler rewrites each function body
    separately (control flow v2 keeps loop and branch bodies there). Functions no node calls
    are left out (see `reachable_functions`).
    """
    for node in graph_def.node:
        yield node.name, node
    reachable = reachable_functions(graph_def)
    for function in graph_def.library.function:
        if function.signature.name not in reachable:
            continue
        for node in function.node_def:
            yield f"{function.signature.name}{FUNCTION_SEPARATOR}{node.name}", node


def node_ops(graph_def):
    """{name: op} over `all_nodes`."""
    return {name: node.op for name, node in all_nodes(graph_def)}


def added_casts(before, after, suffix):
    """Names (see `all_nodes`) of the Casts in `after`, not in `before`, ending in `suffix`."""
    old = {name for name, _ in all_nodes(before)}
    return [name for name, node in all_nodes(after)
            if node.op == "Cast" and name.endswith(suffix) and name not in old]


def type_attrs(node):
    """{attr key: dtype enum} for the type and list(type) attrs of a NodeDef.

    List entries are keyed (attr name, index).
    """
    result = {}
    for key, value in node.attr.items():
        kind = value.WhichOneof("value")
        if kind == "type":
            result[key] = value.type
        elif kind == "list" and value.list.type:
            for index, dtype in enumerate(value.list.type):
                result[(key, index)] = dtype
    return result


def converted_attrs(before, after, dtype):
    """{node name: set of attr keys} that were float32 in `before` and are `dtype` in `after`.

    Covers library function nodes too (named as in `all_nodes`).
    """
    half = HALF_ENUM[dtype]
    old = dict(all_nodes(before))
    result = {}
    for name, node in all_nodes(after):
        original = old.get(name)
        if original is None:
            continue
        old_types = type_attrs(original)
        keys = {key for key, value in type_attrs(node).items()
                if value == half and old_types.get(key) == DT_FLOAT}
        if keys:
            result[name] = keys
    return result


def converted_nodes(before, after, dtype):
    """Names of the original nodes with at least one type attr changed from float32 to `dtype`."""
    return set(converted_attrs(before, after, dtype))


# --- child side -------------------------------------------------------------------------------


def _meta_graph(graph_def, fetch_names):
    from tensorflow.core.protobuf import meta_graph_pb2  # pylint: disable=g-import-not-at-top
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph_def)
    meta_graph.collection_def["train_op"].node_list.value.extend(fetch_names)
    return meta_graph


def _warm_up_graph_def():
    """A three-node MatMul graph, for an untimed first call of the optimizer."""
    from tensorflow.core.framework import graph_pb2  # pylint: disable=g-import-not-at-top
    graph_def = graph_pb2.GraphDef()
    for name in ("a", "b"):
        node = graph_def.node.add(name=name, op="Placeholder")
        node.attr["dtype"].type = DT_FLOAT
        node.attr["shape"].shape.unknown_rank = True  # Grappler rejects a Placeholder without it
    node = graph_def.node.add(name="mm", op="MatMul", input=["a", "b"])
    node.attr["T"].type = DT_FLOAT
    return graph_def


def _optimize_timed(optimize, meta_graph, repeats):
    """Returns (last optimized GraphDef, [seconds of each of `repeats` calls])."""
    seconds = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        optimized = optimize(meta_graph)
        seconds.append(time.perf_counter() - start)
    return optimized, seconds


def _config(optimizer):
    from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-import-not-at-top
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.optimizers[:] = [optimizer]
    # The meta-optimizer skips graphs of fewer than 4 nodes by default: a tiny test graph would
    # look like a no-op of the pass (TensorFlow's own AMP tests set -1 too).
    config.graph_options.rewrite_options.min_graph_nodes = -1
    return config


def _worker(spec_path, result_path):
    """Child: optimizes each job's GraphDef `repeats` times; writes results and timings."""
    # pylint: disable=g-import-not-at-top
    from tensorflow.python.grappler import cluster as gcluster
    from tensorflow.python.grappler import tf_optimizer
    # pylint: enable=g-import-not-at-top
    with open(spec_path) as f:
        spec = json.load(f)
    cluster = gcluster.Cluster()

    def optimizer(name):
        config = _config(name)
        return lambda meta_graph: tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False,
                                                             cluster=cluster)

    amp = optimizer(spec["mode"])
    baseline = optimizer(spec["baseline"]) if spec["baseline"] else None
    timings = []
    try:
        amp(_meta_graph(_warm_up_graph_def(), ["mm"]))
        for job in spec["jobs"]:
            meta_graph = _meta_graph(_parse_graph_def(job["input"]), job["fetches"])
            optimized, seconds = _optimize_timed(amp, meta_graph, spec["repeats"])
            with open(job["output"], "wb") as f:
                f.write(optimized.SerializeToString())
            timing = {"amp": seconds}
            if baseline is not None:
                timing["baseline"] = _optimize_timed(baseline, meta_graph, spec["repeats"])[1]
            timings.append(timing)
    finally:
        cluster.Shutdown()
    with open(result_path, "w") as f:
        json.dump({"seconds": timings}, f)


def _parse_args(argv):
    parser = argparse.ArgumentParser(description="Child side of run_grappler_amp_batch.")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("spec", help="JSON: mode, repeats, baseline, jobs [{input, output, "
                        "fetches}]")
    parser.add_argument("result", help="JSON written here: seconds per job")
    return parser.parse_args(argv)


if __name__ == "__main__":
    _ARGS = _parse_args(sys.argv[1:])
    _worker(_ARGS.spec, _ARGS.result)
