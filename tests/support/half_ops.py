"""Counts the half-precision ops TensorFlow executes in a process: what the tests of "it runs
in half" read, instead of a log line.

A subprocess is observed by starting it with `observed_env(env)`: tests/support/observe is put
first on PYTHONPATH, and its sitecustomize.py calls `install()` at interpreter start-up when
HALF_OPS_OBSERVER=1 (which it removes, so the process's own children are not observed). That
works however the script is launched (`python script.py`, `python -m tf_mpt script.py`, the
`tf-mpt run` console script, `python -c SOURCE`). TensorFlow is imported only when the
program imports it. Two ways a program runs graphs are seen:

    TF1 Sessions     every Session.run returns its partition graphs (RunOptions
                     output_partition_graphs: the graphs after Grappler and tf_mpt's own pass,
                     as the executor ran them)
    tf.function      the eager context's run metadata: the partition graphs of every
                     function call (Keras's fit / evaluate / predict steps included)
    XLA              the HLO modules handed to XLA (a jit_compile=True function, Keras's
                     compile(jit_compile=True), auto-clustering): the observer appends
                     --xla_dump_to=<a directory of its own> --xla_dump_hlo_as_text to
                     XLA_FLAGS before TensorFlow starts, and counts each module's dot and
                     convolution instructions by element type ("dot (XLA)", "convolution
                     (XLA)" in half_types: the run metadata holds no graph of a compiled
                     function)

At exit (of a process that imported TensorFlow) one line goes to stderr,
`COUNT_LINE_PREFIX {json}`: "half_ops" (distinct executed nodes whose type attr T is float16 or
bfloat16), "float_ops" (whose T is float32), "half_types" ({op type: count}, oneDNN's renames
read as the op they run: op_type). A float32 run prints half_ops 0; so does a mixed run that
converted nothing. Nothing of the program changes: its RunOptions are copied, a run_metadata
it passes is still filled.
"""

import atexit
import json
import os
import re
import shutil
import sys
import tempfile

COUNT_LINE_PREFIX = "half-ops-observer:"
SWITCH = "HALF_OPS_OBSERVER"
OBSERVE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "observe")

_seen = {}  # (graph kind, node name) -> (op type, 'half' or 'float32')
_XLA = {}  # "dump": the directory XLA dumps this process's HLO modules to
_HLO_CONTRACTION = re.compile(r"= (\w+)\[[^\]]*\][^ ]* (dot|convolution)\(")
_HLO_KINDS = {"f16": "half", "bf16": "half", "f32": "float32"}
_kinds = {}  # type attr enum -> 'half' or 'float32' (set once TensorFlow is imported)


def observed_env(env, keras_as_on_a_gpu=False):
    """A copy of the environment `env` in which a Python process counts its half ops (and,
    with `keras_as_on_a_gpu`, Keras 3's jit_compile="auto" resolves as on a GPU machine)."""
    out = dict(env)
    if keras_as_on_a_gpu:
        out[KERAS_AS_ON_A_GPU] = "1"
    out["PYTHONPATH"] = os.pathsep.join(
        [OBSERVE_DIR] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p])
    out[SWITCH] = "1"
    return out


def parse(stderr):
    """The counts a process printed (a dict), or None if it printed none (it died first)."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(COUNT_LINE_PREFIX + " {"):
            return json.loads(line[len(COUNT_LINE_PREFIX) + 1:])
    return None


def half_ops(stderr):
    """The half ops a process executed; AssertionError if it printed no count."""
    counts = parse(stderr)
    assert counts is not None, f"no '{COUNT_LINE_PREFIX}' line: {stderr[-2000:]}"
    return counts["half_ops"]


def op_type(executed):
    """The op type a partition graph's node `executed` runs, as the program's graph names it:
    oneDNN's layout pass renames the ops it takes (Conv2D to _MklNativeConv2D or _MklConv2D,
    _FusedMatMul to _MklFusedMatMul), and which it takes differs from CPU to CPU (float16
    Conv2D only where the CPU has avx512_fp16)."""
    for prefix in ("_MklNative", "_Mkl"):
        if executed.startswith(prefix):
            rest = executed[len(prefix):]
            return "_" + rest if rest.startswith("Fused") else rest
    return executed


def _record(graphs, kind):
    for graph in graphs:
        for node in graph.node:
            if "T" in node.attr and node.attr["T"].type in _kinds:
                _seen[(kind, node.name)] = (op_type(node.op), _kinds[node.attr["T"].type])


def _observe(tf):
    """Patches TF1 Sessions and switches the eager context's run metadata on."""
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
    _kinds.update({tf.float16.as_datatype_enum: "half", tf.bfloat16.as_datatype_enum: "half",
                   tf.float32.as_datatype_enum: "float32"})
    base = tf.compat.v1.Session.__mro__[1]
    original = base.run

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        wanted = tf.compat.v1.RunOptions()
        if options is not None:
            wanted.CopyFrom(options)
        wanted.output_partition_graphs = True
        metadata = run_metadata if run_metadata is not None else tf.compat.v1.RunMetadata()
        out = original(self, fetches, feed_dict, wanted, metadata)
        _record(metadata.partition_graphs, f"session{id(self.graph)}")
        return out
    base.run = run
    context.enable_run_metadata()
    atexit.register(_report)  # after TensorFlow's own exit handlers were registered: before


def hlo_contractions(directory, seen=None):
    """{module file: [(element type, 'dot' or 'convolution')]}: the dot and convolution
    instructions of each HLO module XLA was handed, as `--xla_dump_to=directory
    --xla_dump_hlo_as_text` dumped it before XLA's own passes; the files named in `seen` (a
    set, updated) left out."""
    found = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".before_optimizations.txt") or (seen is not None and
                                                              name in seen):
            continue
        if seen is not None:
            seen.add(name)
        with open(os.path.join(directory, name)) as f:
            found[name] = _HLO_CONTRACTION.findall(f.read())
    return found


def is_half_hlo(element):
    """Whether an HLO element type ('bf16', 'f32', ...) is a half type."""
    return _HLO_KINDS.get(element) == "half"


def _record_hlo(directory):
    """The dot and convolution instructions of the HLO modules XLA was handed, one entry per
    instruction."""
    for name, instructions in hlo_contractions(directory).items():
        for index, (element, what) in enumerate(instructions):
            if element in _HLO_KINDS:
                _seen[(f"xla {name}", index)] = (f"{what} (XLA)", _HLO_KINDS[element])


def _report():
    if _XLA.get("dump"):
        try:
            _record_hlo(_XLA["dump"])
        except OSError as error:
            sys.stderr.write(f"{COUNT_LINE_PREFIX} no XLA dump: {error}\n")
        shutil.rmtree(_XLA["dump"], ignore_errors=True)
    if "tensorflow" in sys.modules:
        try:
            from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
            metadata = context.export_run_metadata()
            if metadata is not None:
                for function_graphs in metadata.function_graphs:
                    _record(function_graphs.partition_graphs, "function")
        except Exception as error:  # pylint: disable=broad-except
            sys.stderr.write(f"{COUNT_LINE_PREFIX} no run metadata: {error}\n")
    half_types = {}
    for op, kind in _seen.values():
        if kind == "half":
            half_types[op] = half_types.get(op, 0) + 1
    counts = {"half_ops": sum(half_types.values()),
              "float_ops": sum(1 for _, kind in _seen.values() if kind == "float32"),
              "half_types": dict(sorted(half_types.items()))}
    sys.stderr.write(f"{COUNT_LINE_PREFIX} {json.dumps(counts)}\n")
    sys.stderr.flush()


class _AfterTensorFlowImport:
    """A meta path finder that observes TensorFlow once the program has imported it."""

    def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
        if name != "tensorflow" or "tensorflow" in sys.modules:
            return None
        sys.meta_path.remove(self)
        import importlib.util  # pylint: disable=import-outside-toplevel
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            _observe(module)
        loader.exec_module = exec_module
        return spec


KERAS_AS_ON_A_GPU = "HALF_OPS_KERAS_AS_ON_A_GPU"  # (observed_env's keras_as_on_a_gpu)
KERAS_TRAINER = "keras.src.trainers.trainer"


def _resolve_as_on_a_gpu(trainer_module):
    """Keras 3's compile(jit_compile="auto") resolved as on a machine with a GPU: XLA, unless
    a distribution strategy is in use or the model cannot be compiled (its own rules, less
    "Disable XLA on CPU-only machines")."""
    def resolve(self):
        if getattr(self, "_distribute_strategy", None):
            return False
        return bool(trainer_module.model_supports_jit(self))
    trainer_module.Trainer._resolve_auto_jit_compile = resolve  # pylint: disable=protected-access


class _AfterKerasTrainerImport:
    """A meta path finder that makes Keras's "auto" resolve as on a GPU machine once the
    program has imported Keras 3's trainer."""

    def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
        if name != KERAS_TRAINER or name in sys.modules:
            return None
        sys.meta_path.remove(self)
        import importlib.util  # pylint: disable=import-outside-toplevel
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module

        def exec_module(module):
            original_exec(module)
            _resolve_as_on_a_gpu(module)
        spec.loader.exec_module = exec_module
        return spec


def install():
    """Observes this process from TensorFlow's import on (now, if it is imported) and
    reports at exit; a process that never imports TensorFlow reports nothing. With
    HALF_OPS_KERAS_AS_ON_A_GPU=1 (removed: not for this process's children), Keras 3's
    compile(jit_compile="auto") resolves as on a machine with a GPU (its steps XLA
    compiles, as a GPU user's run), this being a CPU."""
    if os.environ.pop(KERAS_AS_ON_A_GPU, None) == "1":
        if KERAS_TRAINER in sys.modules:
            _resolve_as_on_a_gpu(sys.modules[KERAS_TRAINER])
        else:
            sys.meta_path.insert(0, _AfterKerasTrainerImport())
    if "tensorflow" not in sys.modules:  # (XLA reads its flags once, at its first use)
        _XLA["dump"] = tempfile.mkdtemp(prefix="half-ops-xla-")
        atexit.register(shutil.rmtree, _XLA["dump"], True)  # (also where TF never comes)
        os.environ["XLA_FLAGS"] = " ".join(filter(None, [
            os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={_XLA['dump']}",
            "--xla_dump_hlo_as_text"]))
    if "tensorflow" in sys.modules:
        _observe(sys.modules["tensorflow"])
    else:
        sys.meta_path.insert(0, _AfterTensorFlowImport())
