"""Graph timing's sandbox: candidate colourings of one GraphDef run on this CPU.

    sandbox         one tf.Graph and Session per candidate, each importing its GraphDef;
                    made-up inputs of its placeholders' shapes (an unknown leading dimension:
                    the cost model's batch) held in variables; the graph's variables copies
                    of nothing (random values): the script's variables, inputs, iterators and
                    files are never touched
    runs            timers/rounds.py: a warm-up run each, then rotating rounds; the times,
                    peaks and profiles read as a traced step's are (timers/measuring.py)

Only the part of the graph its fetches need is run. A graph whose fetches need an op with
effects outside the sandbox (files, queues, iterators, tables, Python calls, printing,
summaries, collectives) is not timed; nor one whose inputs have an unknown size other than
the batch, or a dtype with no made-up value (strings). It then keeps the prediction, and
the report says why.
"""

import functools

import numpy as np
from tensorflow.core.framework import types_pb2

from tf_mpt._process import state as _state
from tf_mpt.choose import policy as _policy
from tf_mpt.choose.timers import measuring as _measuring
from tf_mpt.choose.timers import protocol as _protocol
from tf_mpt.choose.timers import rounds as _rounds
from tf_mpt.choose.timers import safety as _safety
from tf_mpt.rewrite import function_bodies as _function_library
from tf_mpt.rewrite import graph_view as _graph_view


_MADE_UP_DTYPES = frozenset((
    types_pb2.DT_FLOAT, types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_DOUBLE,
    types_pb2.DT_INT32, types_pb2.DT_INT64, types_pb2.DT_INT8, types_pb2.DT_UINT8,
    types_pb2.DT_INT16, types_pb2.DT_UINT16, types_pb2.DT_BOOL))
# Stateful ops that only act on the sandbox's own state: a TF1 graph's reference variables
# and their updates (besides step timing's resource-variable and random ops).
_SAFE_REF_STATEFUL = frozenset((
    "VariableV2", "Variable", "VarHandleOp", "Assign", "AssignAdd", "AssignSub",
    "IsVariableInitialized", "VarIsInitializedOp", "TemporaryVariable",
    "DestroyTemporaryVariable", "ScatterAdd", "ScatterSub", "ScatterMul", "ScatterDiv",
    "ScatterUpdate", "ScatterMin", "ScatterMax", "ScatterNdAdd", "ScatterNdSub",
    "ScatterNdUpdate", "NoOp", "Placeholder", "PlaceholderWithDefault"))
_SAFE_REF_PREFIXES = ("Apply", "SparseApply")  # (the Resource* ones: step timing's)


def runnable(graph_def, fetches):
    """(the fetches whose runs stay in a sandbox, the main-graph nodes those need). A fetch
    that needs an op with effects outside the sandbox (a SavedModel's saver, a summary
    writer) or an input with no made-up value (a string: a saver's file name) is left out;
    NotTimed where none is left."""
    view = {node.name: node for node in graph_def.node}
    library = {f.signature.name: f for f in graph_def.library.function}
    kept, needed, unsafe = [], set(), set()
    for fetch in fetches:
        if fetch not in view or _initializer_only(view, fetch) or _variable_initializer(
                view, fetch):
            continue  # (an initializer runs once, not every step: not timed)
        mine, stack = set(), [fetch]
        while stack:
            name = stack.pop()
            if name in mine:
                continue
            mine.add(name)
            for ref in view[name].input:
                source = ref.lstrip("^").partition(":")[0]
                if source in view and source not in mine:
                    stack.append(source)
        nodes, functions, stack = [view[n] for n in mine], set(), [view[n] for n in mine]
        while stack:
            node = stack.pop()
            for name in [node.op] + [f.name for f in _function_library.called_functions(node)]:
                if name in library and name not in functions:
                    functions.add(name)
                    stack.extend(library[name].node_def)
                    nodes.extend(library[name].node_def)
        found = _safety.unsafe_ops(nodes, library, _SAFE_REF_STATEFUL,
                                   _SAFE_REF_PREFIXES) | {
            f"Placeholder of {types_pb2.DataType.Name(view[n].attr['dtype'].type)}"
            for n in mine if view[n].op == "Placeholder" and
            view[n].attr["dtype"].type not in _MADE_UP_DTYPES}
        if found:
            unsafe |= found
            continue
        kept.append(fetch)
        needed |= mine
    if not kept:
        raise _safety.NotTimed(f"its fetches need op(s) with effects outside its own state: "
                               f"{', '.join(sorted(unsafe)[:5]) or 'no fetch found'}")
    return kept, needed


def _variable_initializer(view, name):
    """Whether node `name` is a variable's initializer: `<variable>/Assign` assigning to
    `<variable>` (a graph's sinks when no fetches are given)."""
    return _graph_view.initialized_variable(
        view[name], lambda n: view[n].op if n in view else None) is not None


def _initializer_only(view, name, seen=None):
    """Whether node `name` is a NoOp grouping only variable assignments (a TF1
    `global_variables_initializer`), directly or through other such NoOps."""
    node = view[name]
    if node.op != "NoOp" or not node.input:
        return False
    seen = set() if seen is None else seen
    seen.add(name)
    for ref in node.input:
        source = ref.lstrip("^").partition(":")[0]
        if source in seen or source not in view:
            continue
        op = view[source].op
        if op == "NoOp":
            if not _initializer_only(view, source, seen):
                return False
        elif op not in _graph_view.INITIALIZING_OPS:
            return False
    return True


def made_up_inputs(graph_def, needed, batch, seed=0, max_bytes=None):
    """{placeholder name: array} for the Placeholders among `needed`: normal noise for floats,
    zeros for integers and booleans (a valid index or label); an unknown leading dimension is
    `batch`. Raises NotTimed where no value can be made, or where they would take over
    `max_bytes` (None: the default Policy's max_copy_bytes)."""
    max_bytes = _policy.DEFAULT.max_copy_bytes if max_bytes is None else max_bytes
    from tensorflow.python.framework import dtypes  # pylint: disable=import-outside-toplevel
    rng = np.random.RandomState(seed)
    values, total = {}, 0
    for node in graph_def.node:
        if node.name not in needed or node.op != "Placeholder":
            continue
        shape = node.attr["shape"].shape if "shape" in node.attr else None
        if shape is None or shape.unknown_rank:
            raise _safety.NotTimed(f"input {node.name} has an unknown rank")
        dims = [d.size for d in shape.dim]
        if dims and dims[0] < 0 and batch:
            dims[0] = batch
        if any(d < 0 for d in dims):
            raise _safety.NotTimed(f"input {node.name} has shape {[d.size for d in shape.dim]}: a "
                                   "size other than the batch is unknown")
        dtype = dtypes.as_dtype(node.attr["dtype"].type)
        if dtype.is_floating:
            value = rng.standard_normal(dims).astype(dtype.as_numpy_dtype)
        elif dtype.is_integer or dtype.is_bool:
            value = np.zeros(dims, dtype.as_numpy_dtype)
        else:
            raise _safety.NotTimed(f"input {node.name} is {dtype.name}: no made-up value for it")
        total += value.nbytes
        if total > max_bytes:
            raise _safety.NotTimed(f"its made-up inputs would take over {max_bytes >> 20} MiB")
        values[node.name] = value
    return values


class _Sandbox:
    """One candidate's Session: its GraphDef imported with the made-up inputs in variables and
    its own variables given random values; a run stopped after `timeout_ms`."""

    def __init__(self, graph_def, inputs, fetches, needed, timeout_ms):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        self.graph = tf.Graph()
        with self.graph.as_default():
            made, input_map = [], {}
            for name, value in inputs.items():
                variable = tf.Variable(value, trainable=False, name="tf_mpt_timing_input")
                made.append(variable.initializer)
                input_map[f"{name}:0"] = variable.value()
            try:
                tf.graph_util.import_graph_def(graph_def, input_map=input_map, name="")
            except (ValueError, TypeError, tf.errors.OpError) as error:
                raise _safety.NotTimed(f"a candidate did not import ({error})") from None
            rng = np.random.RandomState(1)
            for node in graph_def.node:
                if node.name in needed and node.op in ("VariableV2", "Variable",
                                                       "VarHandleOp"):
                    made.append(_initializer(self.graph, node, rng))
            self.init = tf.group(*made)
            # (a fetched placeholder, a signature's input, is fed: nothing to run)
            self.targets = [self.graph.get_operation_by_name(name) for name in fetches
                            if name not in inputs]
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.options = tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms)
        self.session.run(self.init, options=self.options)

    def run(self):
        self.session.run(self.targets, options=self.options)

    def peak(self):
        """Bytes: the step peak of one traced run (step_peak_bytes)."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        metadata = tf.compat.v1.RunMetadata()
        self.session.run(self.targets, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
            timeout_in_ms=self.options.timeout_in_ms), run_metadata=metadata)
        return _measuring.step_peak_bytes(metadata)

    def profile(self, runs):
        """{node name: seconds}: the fastest of `runs` traced runs, per node."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        options = tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
            timeout_in_ms=self.options.timeout_in_ms)
        metadatas = []
        for _ in range(runs):
            metadatas.append(tf.compat.v1.RunMetadata())
            self.session.run(self.targets, options=options, run_metadata=metadatas[-1])
        return _measuring.fastest_node_seconds(metadatas)

    def close(self):
        self.session.close()


def _variable_bytes(graph_def, needed):
    """Bytes of the variables among `needed` (their static shapes; 0 for a shape not known:
    such a variable is refused when its sandbox is made)."""
    from tensorflow.python.framework import dtypes  # pylint: disable=import-outside-toplevel
    total = 0
    for node in graph_def.node:
        if node.name in needed and node.op in _graph_view.VARIABLE_OPS and "shape" in node.attr:
            dims = [d.size for d in node.attr["shape"].shape.dim]
            if all(d >= 0 for d in dims) and not node.attr["shape"].shape.unknown_rank:
                try:
                    size = dtypes.as_dtype(node.attr["dtype"].type).size
                except (TypeError, ValueError):
                    continue
                total += int(np.prod(dims, dtype=np.int64)) * size
    return total


def _initializer(graph, node, rng):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    dtype = tf.as_dtype(node.attr["dtype"].type)
    shape = node.attr["shape"].shape
    dims = [d.size for d in shape.dim]
    if shape.unknown_rank or any(d < 0 for d in dims):
        raise _safety.NotTimed(f"variable {node.name} has no static shape")
    if dtype.is_floating:
        value = (0.05 * rng.standard_normal(dims)).astype(dtype.as_numpy_dtype)
    elif dtype.is_integer or dtype.is_bool:
        value = np.zeros(dims, dtype.as_numpy_dtype)
    else:
        raise _safety.NotTimed(f"variable {node.name} is {dtype.name}: no made-up value for it")
    handle = graph.get_tensor_by_name(f"{node.name}:0")
    if node.op == "VarHandleOp":
        return tf.raw_ops.AssignVariableOp(resource=handle, value=value)
    return tf.compat.v1.assign(handle, value).op


def time_candidates(graph_defs, fetches, batch, budget_seconds, peaks=None, runs=None,
                    policy=None, sandbox=None, clock=None):
    """Times each of {candidate: GraphDef} (one graph's colourings: the same inputs and
    fetches) on this CPU. Returns {candidate: (seconds per run, ...)}; raises NotTimed where
    that cannot be done safely. `peaks`, a dict: filled with {candidate: the step peak in
    bytes of one traced run after the rounds} (measuring.step_peak_bytes) and peaks[RESIDENT].
    `runs`: what runs them in place of `rounds` (first_runs: for their peaks alone). `policy`: the
    sandboxes' limits (max_copy_bytes, run_timeout_ms; None: the default Policy's).
    `sandbox`, `clock`: a candidate's sandbox type and the rounds' clock (None: _Sandbox,
    rounds' perf_counter)."""
    clock = clock or _rounds._clock
    runs = runs or _rounds.rounds

    def use(boxes, resident):
        return _measuring.time_each(
            {name: box.run for name, box in boxes.items()}, lambda name: boxes[name].peak(),
            resident, functools.partial(runs, clock=clock), budget_seconds, peaks)
    return _in_sandboxes(graph_defs, fetches, batch, use, policy, sandbox)


def profile_candidates(graph_defs, fetches, batch, runs, policy=None, sandbox=None):
    """{candidate: {node name: seconds}}: per node of each of {candidate: GraphDef}, the
    fastest of `runs` traced runs after a warm-up run (the node names Grappler's graph
    runs: a fused kernel is named as the last node it fuses)."""
    def profile(boxes, _):
        return _measuring.profile_each({name: box.run for name, box in boxes.items()},
                                       lambda name, n: boxes[name].profile(n), runs)
    return _in_sandboxes(graph_defs, fetches, batch, profile, policy, sandbox)


def _in_sandboxes(graph_defs, fetches, batch, use, policy=None, sandbox_type=None):
    """use({candidate: sandbox}, resident bytes: its variables' and inputs') with a sandbox of
    each of {candidate: GraphDef} (closed after); NotTimed where they cannot be made or run
    safely (`policy`'s max_copy_bytes, run_timeout_ms; None: the default Policy's)."""
    policy = policy or _policy.DEFAULT
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    sandbox_type = sandbox_type or _Sandbox
    first = next(iter(graph_defs.values()))
    fetches, needed = runnable(first, fetches)
    for graph_def in graph_defs.values():
        if runnable(graph_def, fetches)[0] != fetches:
            raise _safety.NotTimed("a candidate's fetches need op(s) the float32 graph's do not")
    inputs = made_up_inputs(first, needed, batch, max_bytes=policy.max_copy_bytes)
    resident = _variable_bytes(first, needed) + sum(value.nbytes for value in inputs.values())
    copies = len(graph_defs) * resident
    if copies > policy.max_copy_bytes:
        raise _safety.NotTimed(f"the {len(graph_defs)} candidates' copies of its variables and "
                               f"inputs would take {copies / 2**20:.0f} MiB, over "
                               f"{policy.max_copy_bytes >> 20} MiB")
    sandboxes = {}
    try:
        with _state.bypass():  # the automatic path leaves these Sessions as they are
            try:
                for name, graph_def in graph_defs.items():
                    sandboxes[name] = sandbox_type(graph_def, inputs, fetches, needed,
                                                   policy.run_timeout_ms)
                return use(sandboxes, resident)
            except tf.errors.OpError as error:
                raise _safety.NotTimed(f"a run on made-up inputs failed "
                                       f"({_safety.first_line(error)})") from None
    finally:
        for sandbox in sandboxes.values():
            sandbox.close()


class GraphTimer(_protocol.Timer):
    """Graph timing's Timer: each candidate imported in a Session sandbox of its own, made
    anew at each call, running the graph's `fetches` (the node names timed).

    sandbox: the type of a candidate's sandbox, called (GraphDef, {input: value}, fetches,
    needed node names, run timeout in ms), with run(), peak() -> bytes, profile(runs) ->
    {node: seconds} and close() (None: a Session, _Sandbox); clock: what the rounds read
    (None: time.perf_counter). A test's fake timer is this one with its own of both
    (tests/support/fake_timing.py): every rule above the sandbox runs as it does here."""

    def __init__(self, fetches, sandbox=None, clock=None):
        super().__init__()
        self.fetches, self.sandbox, self.clock = fetches, sandbox, clock

    def time(self, graphs, budget, policy):
        return time_candidates(graphs, self.fetches, policy.batch, budget, self.peaks,
                               runs=functools.partial(_rounds.rounds, policy=policy),
                               policy=policy, sandbox=self.sandbox, clock=self.clock)

    def peaks_only(self, graphs, policy):
        return time_candidates(graphs, self.fetches, policy.batch, 0.0, self.peaks,
                               runs=_rounds.first_runs, policy=policy, sandbox=self.sandbox,
                               clock=self.clock)

    def profile(self, graphs, policy):
        return profile_candidates(graphs, self.fetches, policy.batch, policy.profile_runs,
                                  policy, self.sandbox)
