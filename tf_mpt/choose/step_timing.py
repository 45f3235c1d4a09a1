"""Timing a traced tf.function's candidate colourings on copies of its variables, where the
cost model's prediction is too small to trust.

The cost model adds up measured kernel and Cast times op by op; what it does not see (cache
traffic between ops, the executor, fusions Grappler makes in one version and not the other)
can be a few percent of a step either way. Where its predicted saving is small beside the
times it adds up (`worth_timing`), the decision module (decision.py) times the function's
candidates, as it times a graph's (float32, the rules', the cost model's, contractions
only), and the function runs the fastest:

    sandbox graph:  copies of the function's variables (their current values) and of its
                    other captures; made-up inputs of its argument shapes (a leading
                    dimension the trace left unknown: the batch it is costed at)
                    candidate_0/...  the float32 graph   } each imported, reading and
                    candidate_1/...  a rewrite           } updating the same copies
                    ...
    Session of its own: graph_timing.rounds (a warm-up run each, then rotating rounds
                    within the budget, TF_MPT_TIMING_BUDGET)

Nothing the script owns is touched: not its variables, its inputs, its iterators or its
random state. A function with a stateful op outside the known-safe set (`_unsafe_ops`:
printing, summaries, queues, iterators, tables, collectives, Python calls, file writes)
is not timed, nor one whose captures are not plain variables or tensors.
"""

import functools
import logging
import time

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry as _op_def_registry

from tf_mpt._process import state as _state
from tf_mpt.rewrite import function_bodies as _function_library

_log = logging.getLogger(__name__)

THIN = 0.3  # auto: time where the predicted saving is below this share of what it adds up
# auto: also time where half kernels other than matrix products and convolutions account for
# more than this share of the predicted saving (report.predicted_elementwise). Such a
# kernel's time is read from its op's line, probed alone at a few sizes; in a graph it may
# run several times slower than the probe said (Sapphire Rapids: a table whose bfloat16 Mul,
# AddV2 and Sub probed 1.3-1.5x faster at 1 M elements left MobileNetV2's Keras predict step
# untimed, its saving all element-wise, and it ran at 0.80x float32)
ELEMENTWISE_SHARE = 0.2
# auto, memory bounded (TF_MPT_MEMORY=float32): also time a step that computes gradients where
# the cost model kept at least this share of the nodes it weighed float32 (values the backward
# pass reads may then be held in float32: what the step holds is measured, not predicted)
KEPT_SHARE = 0.1
# the name scopes gradients are built in (tf.GradientTape's, tf.gradients' and a TF1
# optimizer's): a function with such a node computes gradients
_GRADIENT_SCOPES = ("gradient_tape", "gradients")
BUDGET_SECONDS = 20.0  # of timed rounds, after the warm-up runs (TF_MPT_TIMING_BUDGET)
MAX_COPY_BYTES = 1 << 30  # the variables and inputs a sandbox may copy
# peaks[RESIDENT] (time_versions, graph_timing.time_candidates): the bytes every candidate
# holds alike across its steps (its variables, the optimizer's slots, its inputs)
RESIDENT = "(resident)"
# one run (a warm-up includes Grappler's optimisation): a loop that made-up inputs never end
# stops here, and the function is not timed
_RUN_TIMEOUT_MS = 30_000

# Stateful ops whose state is the function's own (its variables, its random draws, state
# made and dropped within one run): running them on copies changes nothing outside.
_SAFE_STATEFUL = frozenset((
    "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "VarIsInitializedOp", "VariableShape", "ResourceGather", "ResourceGatherNd",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul", "ResourceScatterDiv",
    "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterUpdate",
    "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdUpdate",
    "ResourceStridedSliceAssign",
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "Multinomial",
    "ParameterizedTruncatedNormal", "StatefulUniform", "StatefulUniformInt",
    "StatefulUniformFullInt", "StatefulStandardNormalV2", "StatefulTruncatedNormal",
    "RngReadAndSkip", "RngSkip",
    "While", "If", "Case", "StatefulPartitionedCall", "PartitionedCall",
    "Assert", "CheckNumerics", "CheckNumericsV2",
    "TensorArrayV3", "TensorArrayGradV3", "TensorArrayWriteV3", "TensorArrayReadV3",
    "TensorArrayGatherV3", "TensorArrayScatterV3", "TensorArraySizeV3",
    "TensorArrayCloseV3", "TensorArrayConcatV3", "TensorArraySplitV3",
    "StackV2", "StackPushV2", "StackPopV2", "StackCloseV2",
))
_SAFE_STATEFUL_PREFIXES = ("ResourceApply", "ResourceSparseApply")


class NotTimed(Exception):
    """The function cannot be timed safely; the message says why."""


class TooSlow(NotTimed):
    """Its rounds do not fit in the budget: it runs, but too slowly to time (its peaks can
    still be measured, one traced run each: decision's memory check)."""


def worth_timing(report, target, mode):
    """Whether a function rewritten with `report` for `target` (a resolved
    tf_mpt.targets.Target) is timed under TF_MPT_STEP_TIMING=`mode` (timing_reason)."""
    return timing_reason(report, target, mode) is not None


def timing_reason(report, target, mode):
    """Why a function rewritten with `report` for `target` is timed under
    TF_MPT_STEP_TIMING=`mode`, or None: never with 'off', nor where the decisions were not
    made for this CPU (target.for_this_cpu: not for `rules` or a cost table of another
    machine), nor where nothing was converted; with 'always' otherwise; with 'auto' where
    the predicted saving is below THIN of the kernel and Cast times it adds up, or where
    half kernels other than contractions make over ELEMENTWISE_SHARE of it
    (report.predicted_elementwise: probed alone, not timed at the node's shapes)."""
    if (mode == "off" or report is None or not report.converted_nodes
            or not target.for_this_cpu):
        return None
    if mode == "always":
        return "TF_MPT_STEP_TIMING=always"
    saving, changed = report.predicted_saving, report.predicted_changed
    if saving < THIN * changed:
        return (f"its predicted saving, {saving * 1e3:.3g} ms per run, is under {THIN:.0%} of "
                f"the {changed * 1e3:.3g} ms of kernel and Cast times it adds up")
    if report.predicted_elementwise > ELEMENTWISE_SHARE * saving:
        return (f"{report.predicted_elementwise * 1e3:.3g} ms of its predicted saving of "
                f"{saving * 1e3:.3g} ms per run (over {ELEMENTWISE_SHARE:.0%}) is half kernels "
                "other than matrix products and convolutions, each probed alone, not at "
                "the graph's shapes")
    return None


def holds_float32_for_gradients(report):
    """Whether a function rewritten with `report` computes gradients (a node in a gradient
    name scope: _GRADIENT_SCOPES) and the cost model kept float32 at least KEPT_SHARE of the
    nodes it weighed: a training step whose forward values the backward pass reads may be
    held in float32, where the op lists' colouring (or a lean version) could hold them in
    half at nearly the same speed; TF_MPT_STEP_TIMING=auto times it where the peak is
    bounded (decision.step_applies)."""
    if report is None or not report.weighed_nodes or not report.weighed_nodes[0]:
        return False
    if report.kept_by_cost_model < KEPT_SHARE * report.weighed_nodes[0]:
        return False
    return computes_gradients(report)


def computes_gradients(report):
    """Whether a node of `report` is in a gradient name scope (_GRADIENT_SCOPES)."""
    return any(part.startswith(_GRADIENT_SCOPES)
               for name in report.decisions for part in name.split("/"))


def holds_half_loop_buffers_for_gradients(report):
    """The number of a loop's buffers (TensorLists, loop variables) a function rewritten with
    `report` keeps in half, where it computes gradients (_GRADIENT_SCOPES), else 0: the
    backward pass of a loop reads what its forward iterations accumulate, and a half value
    accumulated beside the float32 one it was cast from is held once per iteration (a Keras
    LSTM's fit step, untimed, held 2.14x float32's peak tensors on Sapphire Rapids);
    TF_MPT_STEP_TIMING=auto times it where the peak is bounded (decision.step_applies)."""
    if report is None:
        return 0
    buffers = report.tensor_lists_kept_half + report.loop_variables_kept_half
    return buffers if buffers and computes_gradients(report) else 0


def time_versions(concrete_function, graph_defs, batch, rounds, budget_seconds=BUDGET_SECONDS,
                  peaks=None, sandbox=None):
    """Times each of {candidate: GraphDef} (`concrete_function`'s graph and its rewrites: the
    same inputs, outputs and captures; library functions named apart) in one sandbox
    Session, with `rounds` (graph_timing.rounds, which reads this module's limits). Returns
    {candidate: (seconds per run, ...)}; raises NotTimed when that cannot be done safely.
    `peaks`, a dict: filled with {candidate: the step peak in bytes of one traced run after
    the rounds} (step_peak_bytes) and peaks[RESIDENT] (the copies' bytes). `sandbox`: a
    Sandbox of the function kept open across calls (None: one for this call only)."""
    def use(runners, traced_run, resident, _):
        times = rounds(runners, budget_seconds)
        if peaks is not None:
            for name in runners:
                peaks[name] = step_peak_bytes(traced_run(name))
            peaks[RESIDENT] = resident
        return times
    return _in_sandbox(concrete_function, graph_defs, batch, use, sandbox)


def traced_runs(concrete_function, graph_defs, batch, warmup=3):
    """({candidate: RunMetadata of one FULL_TRACE run}, resident bytes) of each of
    {candidate: GraphDef} (as time_versions takes them) in one sandbox Session, each traced
    run after `warmup` untraced ones: where a step's bytes go (benchmarks/memory_profile.py
    reads its allocation records). Raises NotTimed where the sandbox cannot be made."""
    def use(runners, traced_run, resident, _):
        found = {}
        for name, run in runners.items():
            for _ in range(warmup):
                run()
            found[name] = traced_run(name)
        return found, resident
    return _in_sandbox(concrete_function, graph_defs, batch, use)


def step_peak_bytes(metadata):
    """The highest sum of bytes TensorFlow's allocators handed out and had not yet taken
    back during one traced run (RunMetadata with FULL_TRACE: its allocation records): what
    a step adds on top of what lives across steps (variables, inputs held in variables)."""
    events = []
    for device in metadata.step_stats.dev_stats:
        for stats in device.node_stats:
            for memory in stats.memory:
                events.extend((record.alloc_micros, record.alloc_bytes)
                              for record in memory.allocation_records)
    events.sort(key=lambda event: (event[0], -event[1]))  # at one instant, allocations first
    total = peak = 0
    for _, size in events:
        total += size
        peak = max(peak, total)
    return peak


def profile_versions(concrete_function, graph_defs, batch, runs, sandbox=None):
    """{candidate: {node name: seconds}}: per node of each of {candidate: GraphDef} (as
    time_versions), the fastest of `runs` traced runs after a warm-up run."""
    def profile(runners, traced_run, _, prefixes):
        found = {}
        for name, run in runners.items():
            run()
            metadatas = [traced_run(name) for _ in range(runs)]
            found[name] = fastest_node_seconds(metadatas, prefixes[name])
        return found
    return _in_sandbox(concrete_function, graph_defs, batch, profile, sandbox)


def fastest_node_seconds(metadatas, prefix=""):
    """{node name: seconds}: per node whose name starts with `prefix` (taken off), the
    fastest over the traced runs `metadatas` (RunMetadata) of its kernels' summed times."""
    best = {}
    for metadata in metadatas:
        seconds = {}
        for device in metadata.step_stats.dev_stats:
            for stats in device.node_stats:
                node = stats.node_name.partition(":")[0]
                if node.startswith(prefix):
                    node = node[len(prefix):]
                    seconds[node] = seconds.get(node, 0.0) + 1e-6 * max(
                        stats.op_end_rel_micros - stats.op_start_rel_micros, 0)
        for node, value in seconds.items():
            best[node] = min(best.get(node, value), value)
    return best


class Sandbox:
    """The sandbox of one function, kept open across a decision's stages (its first rounds,
    a lean version's, a refinement's): its copies made and its Session set up once, at the
    first call (at that call's batch); each candidate GraphDef (the same object timed again)
    imported once, under a name scope of its own, and its executor built once. close() ends
    it; the next call sets it up again."""

    def __init__(self, cf):
        self._cf = cf
        self._graph = self._session = None
        self._imported = []  # [(GraphDef, fetches, name scope)]: the object itself is held

    def runs(self, graph_defs, batch):
        """({candidate: fetches}, {candidate: its name scope + '/'}, the Session, the copies'
        bytes), importing the GraphDefs not yet imported."""
        with tf.init_scope():  # values are read eagerly, also while an outer function traces
            if self._graph is None:
                self._set_up(batch)
            fetches, prefixes = {}, {}
            for name, graph_def in graph_defs.items():
                found = next((entry for entry in self._imported if entry[0] is graph_def),
                             None)
                if found is None:
                    scope = f"candidate_{len(self._imported)}"
                    began = time.perf_counter()
                    found = (graph_def, _import(self._graph, self._cf, graph_def,
                                                self._input_map, scope), scope)
                    self._imported.append(found)
                    _log.debug("step timing: %s (%s) imported in %.1f s", name, scope,
                               time.perf_counter() - began)
                fetches[name], prefixes[name] = found[1], found[2] + "/"
        return fetches, prefixes, self._session, self._resident

    def _set_up(self, batch):
        began = time.perf_counter()
        self._graph, self._input_map, (init, feeds), self._resident = _sandbox(self._cf, batch)
        # bypass: the automatic path leaves this Session as TensorFlow makes it (its TF1
        # rewrite would otherwise convert the float32 version too)
        with _state.bypass():
            self._session = tf.compat.v1.Session(graph=self._graph)
            try:
                self._session.run(init, feed_dict=feeds, options=tf.compat.v1.RunOptions(
                    timeout_in_ms=_RUN_TIMEOUT_MS))
            except tf.errors.OpError as error:
                self.close()  # (a later call starts again, not from half a set-up)
                raise NotTimed(f"its copies could not be set up ({type(error).__name__})") \
                    from None
        _log.debug("step timing: copies of %s set up in %.1f s (%.0f MiB)", self._cf.name,
                   time.perf_counter() - began, self._resident / 2**20)

    def close(self):
        if self._session is not None:
            self._session.close()
        self._graph = self._session = None
        self._imported = []


def _in_sandbox(cf, graph_defs, batch, use, sandbox=None):
    """use({candidate: run()}, traced_run(candidate) -> RunMetadata of one FULL_TRACE run,
    resident bytes: the copies', {candidate: its name scope + '/'}) in the sandbox Session
    of `cf`'s {candidate: GraphDef} (`sandbox`, a Sandbox kept open, or one made and closed
    here); NotTimed where that cannot be done safely."""
    _refuse_unsafe(graph_defs)
    own = sandbox is None
    sandbox = Sandbox(cf) if own else sandbox
    try:
        fetches, prefixes, session, resident = sandbox.runs(graph_defs, batch)
        with _state.bypass():
            options = tf.compat.v1.RunOptions(timeout_in_ms=_RUN_TIMEOUT_MS)
            traced = tf.compat.v1.RunOptions(timeout_in_ms=_RUN_TIMEOUT_MS,
                                             trace_level=tf.compat.v1.RunOptions.FULL_TRACE)

            def traced_run(name):
                metadata = tf.compat.v1.RunMetadata()
                session.run(fetches[name], options=traced, run_metadata=metadata)
                return metadata
            try:
                return use({name: functools.partial(session.run, f, options=options)
                            for name, f in fetches.items()}, traced_run, resident, prefixes)
            except tf.errors.OpError as error:
                raise NotTimed(f"a run on made-up inputs failed ({type(error).__name__})") \
                    from None
    finally:
        if own:
            sandbox.close()


class CompiledSandbox:
    """The sandbox of a function XLA compiles (jit_compile=True): eager copies of its
    variables and captures and made-up inputs (as `Sandbox` makes them), and each candidate
    as a tf.function(jit_compile=True) reading them, `build(cf, graph_def, values)` ({the
    placeholder name of an argument or capture: its eager value or its copy's handle}) ->
    a no-argument callable. A candidate is compiled by XLA at its first call, made here (its
    seconds returned apart from any round) and kept until close()."""

    def __init__(self, cf, build):
        self._cf, self._build = cf, build
        self._values = self._held = None
        self._built = []  # [(GraphDef, runner)]: the object itself is held

    def runners(self, graph_defs, batch):
        """({candidate: run()}, seconds compiling the candidates new to the sandbox)."""
        with tf.init_scope():  # (eager, also while an outer function traces)
            if self._values is None:
                self._set_up(batch)
            runners, compiling = {}, 0.0
            for name, graph_def in graph_defs.items():
                found = next((entry for entry in self._built if entry[0] is graph_def), None)
                if found is None:
                    run = _eagerly(self._build(self._cf, graph_def, self._values))
                    began = time.perf_counter()
                    with _state.bypass():
                        run()  # XLA compiles it (and runs it once)
                    seconds = time.perf_counter() - began
                    compiling += seconds
                    _log.debug("step timing: %s compiled by XLA in %.1f s", name, seconds)
                    found = (graph_def, run)
                    self._built.append(found)
                runners[name] = found[1]
        return runners, compiling

    def _set_up(self, batch):
        values, self.resident = _copied_values(self._cf, batch)
        self._held, self._values = [], {}
        for name, value, kind in values:
            if kind == "copy":
                variable = tf.Variable(value, trainable=False)
                self._held.append(variable)
                self._values[name] = variable.handle
            else:
                self._values[name] = tf.constant(value)

    def close(self):
        self._values = self._held = None
        self._built = []


def _eagerly(function):
    """`function` called eagerly wherever it is called: a step is timed while an outer
    function traces it (Keras's step loop), where a bare call would only add a call op to
    the outer graph (nothing run, nothing timed, and the call left in the user's program)."""
    def run():
        with tf.init_scope():
            return function()
    run.function = function  # (what XLA compiles: its experimental_get_compiler_ir)
    return run


def time_compiled(concrete_function, graph_defs, batch, rounds, budget_seconds, sandbox):
    """Times each of {candidate: GraphDef} (as time_versions takes them) as XLA runs it, in
    `sandbox` (a CompiledSandbox): each compiled once (its first call), then `rounds`
    (graph_timing.rounds) with what the compiles left of `budget_seconds`. Returns
    {candidate: (seconds per run, ...)}; NotTimed where it cannot be done safely (TooSlow
    where compiling took the whole budget)."""
    del concrete_function  # (the sandbox's)
    _refuse_unsafe(graph_defs)
    try:
        runners, compiling = sandbox.runners(graph_defs, batch)
    except (tf.errors.OpError, ValueError, TypeError) as error:
        raise NotTimed(f"a candidate did not compile or run on made-up inputs under XLA "
                       f"({type(error).__name__})") from None
    left = budget_seconds - compiling
    if left <= 0:
        raise TooSlow(f"XLA took {compiling:.1f} s to compile the {len(runners)} candidates, "
                      f"the {budget_seconds:.3g} s the rounds may spend of the budget "
                      "(TF_MPT_TIMING_BUDGET)")
    with _state.bypass():
        return rounds(runners, left)


def _refuse_unsafe(graph_defs):
    """NotTimed where one of {candidate: GraphDef} runs a stateful op not known to be safe
    (_unsafe_ops): its runs on the copies would act outside them."""
    unsafe = set().union(*(_unsafe_ops(g) for g in graph_defs.values()))
    if unsafe:
        raise NotTimed(f"it runs op(s) with effects outside its variables: "
                       f"{', '.join(sorted(unsafe)[:5])}")


def _unsafe_ops(graph_def):
    """Op types of the graph and its functions that are stateful and not known to be safe
    (an op TensorFlow does not know, nor the library defines, is: nothing is known of it)."""
    return unsafe_ops(_function_library.all_nodes(graph_def),
                      {f.signature.name for f in graph_def.library.function})


def unsafe_ops(nodes, library, also_safe=frozenset(), also_safe_prefixes=()):
    """Op types of `nodes` that are stateful and not known to be safe: neither a function of
    `library` (names), nor in _SAFE_STATEFUL or `also_safe`, nor starting with one of
    _SAFE_STATEFUL_PREFIXES or `also_safe_prefixes`."""
    found = set()
    prefixes = _SAFE_STATEFUL_PREFIXES + tuple(also_safe_prefixes)
    for node in nodes:
        op = node.op
        if op in library or op in _SAFE_STATEFUL or op in also_safe or op.startswith(prefixes):
            continue
        op_def = _op_def_registry.get(op)
        if op_def is None or op_def.is_stateful:
            found.add(op)
    return found


def _sandbox(cf, batch):
    """(graph, input map, (initializer, its feeds), bytes copied) of the sandbox: copies of
    `cf`'s variables (their current values) and of its other captures, and made-up inputs of
    its argument shapes, that each candidate imported (_import) reads and updates. Called
    eagerly: the captures' values are read before the graph is built."""
    values, copied = _copied_values(cf, batch)
    graph = tf.Graph()
    made, input_map, feeds = [], {}, {}
    with graph.as_default():
        for name, value, kind in values:
            if kind == "constant":
                input_map[name] = tf.constant(value)
                continue
            # (fed at the initializer's run, not held in the graph as a constant: ResNet50's
            # copies and slots, ~300 MB, took ~6 s to set up as constants)
            initial = tf.compat.v1.placeholder(value.dtype, value.shape)
            feeds[initial] = value
            variable = tf.Variable(initial, trainable=False, name=kind)
            made.append(variable)
            input_map[name] = variable.value() if kind == "input" else variable.handle
        init = tf.compat.v1.variables_initializer(made)
    return graph, input_map, (init, feeds), copied


def _copied_values(cf, batch):
    """([(placeholder name, value, 'input' | 'copy' | 'constant')], bytes): made-up inputs of
    `cf`'s argument shapes, the current values of the variables it captures and of its other
    captures (NotTimed where one cannot be copied)."""
    captured = list(cf.captured_inputs)
    n_args = len(cf.inputs) - len(captured)
    owners = {id(v.handle): v for v in cf.graph.variables}
    rng = np.random.RandomState(0)
    values = [(p.name, _made_up(p, batch, rng), "input") for p in cf.inputs[:n_args]]
    copied = sum(value.nbytes for _, value, _ in values)
    for placeholder, tensor in zip(cf.inputs[n_args:], captured):
        if tensor.dtype == tf.resource:
            owner = owners.get(id(tensor))
            if owner is None or not hasattr(owner, "numpy"):
                raise NotTimed(f"it captures a resource that is not a plain variable "
                               f"({placeholder.name})")
            elements = owner.shape.num_elements()
            if elements is None or owner.dtype == tf.string:
                raise NotTimed(f"it captures variable {owner.name} of shape {owner.shape} "
                               f"and dtype {owner.dtype.name}: no copy of known size")
            copied += elements * owner.dtype.size
            if copied > MAX_COPY_BYTES:
                raise NotTimed(f"copies of its variables would take over "
                               f"{MAX_COPY_BYTES >> 20} MiB")
            try:
                value = owner.numpy()
            except (tf.errors.OpError, ValueError) as error:
                raise NotTimed(f"variable {owner.name} could not be read ({error})") from None
            values.append((placeholder.name, value, "copy"))
        else:
            values.append((placeholder.name, tensor.numpy(), "constant"))
    return values, copied


def _import(graph, cf, graph_def, input_map, scope):
    """The fetches (`cf`'s outputs and control outputs) of `graph_def` imported into the
    sandbox's `graph` under `scope`, reading and updating the copies of `input_map`."""
    outputs = [t.name for t in cf.outputs]
    controls = [op.name for op in cf.graph.control_outputs]
    try:
        with graph.as_default():
            return tf.graph_util.import_graph_def(
                graph_def, input_map=input_map, return_elements=outputs + controls,
                name=scope)
    except (ValueError, TypeError, tf.errors.OpError) as error:
        raise NotTimed(f"its graphs did not import side by side ({error})") from None


def _made_up(placeholder, batch, rng):
    """An input of the placeholder's shape (an unknown leading dimension: `batch`): normal
    noise for floats, zeros for integers and booleans (always a valid index or label)."""
    dims = placeholder.shape.as_list() if placeholder.shape.rank is not None else None
    if dims is None:
        raise NotTimed(f"argument {placeholder.name} has an unknown rank")
    if dims and dims[0] is None and batch:
        dims[0] = batch
    if any(d is None for d in dims):
        raise NotTimed(f"argument {placeholder.name} has shape {placeholder.shape}: a size "
                       "other than the batch is unknown")
    dtype = placeholder.dtype
    if dtype.is_floating:
        return rng.standard_normal(dims).astype(dtype.as_numpy_dtype)
    if dtype.is_integer or dtype.is_bool:
        return np.zeros(dims, dtype.as_numpy_dtype)
    raise NotTimed(f"argument {placeholder.name} is {dtype.name}: no made-up value for it")
