"""Timing a traced tf.function's candidate colourings on copies of its variables, where the
cost model's prediction is too small to trust.

The cost model adds up measured kernel and Cast times op by op; what it does not see (cache
traffic between ops, the executor, fusions Grappler makes in one version and not the other)
can be a few percent of a step either way. Where its predicted saving is small beside the
times it adds up (`worth_timing`), the choosing step (decision.py) times the function's
candidates, as it times a graph's (float32, the rules', the cost model's, contractions
only), and the function runs the fastest:

    sandbox graph:  copies of the function's variables (their current values) and of its
                    other captures; made-up inputs of its argument shapes (a leading
                    dimension the trace left unknown: the batch it is costed at)
                    candidate_0/...  the float32 graph   } each imported, reading and
                    candidate_1/...  a rewrite           } updating the same copies
                    ...
    Session of its own: timers.rounds.rounds (a warm-up run each, then rotating rounds
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

from tf_mpt._process import state as _state
from tf_mpt.choose import policy as _policy
from tf_mpt.choose.timers import measuring as _measuring
from tf_mpt.choose.timers import safety as _safety

_log = logging.getLogger(__name__)


def time_versions(concrete_function, graph_defs, batch, rounds, budget_seconds=None,
                  peaks=None, sandbox=None, policy=None):
    """Times each of {candidate: GraphDef} (`concrete_function`'s graph and its rewrites: the
    same inputs, outputs and captures; library functions named apart) in one sandbox
    Session, with `rounds` (timers.rounds.rounds, which reads this module's limits). Returns
    {candidate: (seconds per run, ...)}; raises NotTimed when that cannot be done safely.
    `peaks`, a dict: filled with {candidate: the step peak in bytes of one traced run after
    the rounds} (measuring.step_peak_bytes) and peaks[RESIDENT] (the copies' bytes). `sandbox`: a
    Sandbox of the function kept open across calls (None: one for this call only);
    `budget_seconds` None: `policy`'s step_budget. `policy`: the sandbox's limits too
    (max_copy_bytes, run_timeout_ms; None: the default Policy's)."""
    if budget_seconds is None:
        budget_seconds = (policy or _policy.DEFAULT).step_budget

    def use(runners, traced_run, resident, _):
        return _measuring.time_each(
            runners, lambda name: _measuring.step_peak_bytes(traced_run(name)), resident,
            rounds, budget_seconds, peaks)
    return _in_sandbox(concrete_function, graph_defs, batch, use, sandbox, policy)


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


def profile_versions(concrete_function, graph_defs, batch, runs, sandbox=None, policy=None):
    """{candidate: {node name: seconds}}: per node of each of {candidate: GraphDef} (as
    time_versions), the fastest of `runs` traced runs after a warm-up run."""
    def profile(runners, traced_run, _, prefixes):
        return _measuring.profile_each(
            runners, lambda name, n: _measuring.fastest_node_seconds(
                [traced_run(name) for _ in range(n)], prefixes[name]), runs)
    return _in_sandbox(concrete_function, graph_defs, batch, profile, sandbox, policy)


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

    def runs(self, graph_defs, batch, policy):
        """({candidate: fetches}, {candidate: its name scope + '/'}, the Session, the copies'
        bytes), importing the GraphDefs not yet imported (the copies, where made here, within
        `policy`'s limits)."""
        with tf.init_scope():  # values are read eagerly, also while an outer function traces
            if self._graph is None:
                self._set_up(batch, policy)
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

    def _set_up(self, batch, policy):
        began = time.perf_counter()
        self._graph, self._input_map, (init, feeds), self._resident = _sandbox(
            self._cf, batch, policy.max_copy_bytes)
        # bypass: the automatic path leaves this Session as TensorFlow makes it (its TF1
        # rewrite would otherwise convert the float32 version too)
        with _state.bypass():
            self._session = tf.compat.v1.Session(graph=self._graph)
            try:
                self._session.run(init, feed_dict=feeds, options=tf.compat.v1.RunOptions(
                    timeout_in_ms=policy.run_timeout_ms))
            except tf.errors.OpError as error:
                self.close()  # (a later call starts again, not from half a set-up)
                raise _safety.NotTimed(f"its copies could not be set up ({type(error).__name__})") \
                    from None
        _log.debug("step timing: copies of %s set up in %.1f s (%.0f MiB)", self._cf.name,
                   time.perf_counter() - began, self._resident / 2**20)

    def close(self):
        if self._session is not None:
            self._session.close()
        self._graph = self._session = None
        self._imported = []


def _in_sandbox(cf, graph_defs, batch, use, sandbox=None, policy=None):
    """use({candidate: run()}, traced_run(candidate) -> RunMetadata of one FULL_TRACE run,
    resident bytes: the copies', {candidate: its name scope + '/'}) in the sandbox Session
    of `cf`'s {candidate: GraphDef} (`sandbox`, a Sandbox kept open, or one made and closed
    here); NotTimed where that cannot be done safely (`policy`'s max_copy_bytes,
    run_timeout_ms; None: the default Policy's)."""
    policy = policy or _policy.DEFAULT
    _safety.refuse_unsafe(graph_defs)
    own = sandbox is None
    sandbox = Sandbox(cf) if own else sandbox
    try:
        fetches, prefixes, session, resident = sandbox.runs(graph_defs, batch, policy)
        with _state.bypass():
            options = tf.compat.v1.RunOptions(timeout_in_ms=policy.run_timeout_ms)
            traced = tf.compat.v1.RunOptions(timeout_in_ms=policy.run_timeout_ms,
                                             trace_level=tf.compat.v1.RunOptions.FULL_TRACE)

            def traced_run(name):
                metadata = tf.compat.v1.RunMetadata()
                session.run(fetches[name], options=traced, run_metadata=metadata)
                return metadata
            try:
                return use({name: functools.partial(session.run, f, options=options)
                            for name, f in fetches.items()}, traced_run, resident, prefixes)
            except tf.errors.OpError as error:
                raise _safety.NotTimed(f"a run on made-up inputs failed ({type(error).__name__})") \
                    from None
    finally:
        if own:
            sandbox.close()


def _sandbox(cf, batch, max_bytes):
    """(graph, input map, (initializer, its feeds), bytes copied) of the sandbox: copies of
    `cf`'s variables (their current values) and of its other captures, and made-up inputs of
    its argument shapes, that each candidate imported (_import) reads and updates. Called
    eagerly: the captures' values are read before the graph is built."""
    values, copied = copied_values(cf, batch, max_bytes)
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


def copied_values(cf, batch, max_bytes=None):
    """([(placeholder name, value, 'input' | 'copy' | 'constant')], bytes): made-up inputs of
    `cf`'s argument shapes, the current values of the variables it captures and of its other
    captures (NotTimed where one cannot be copied, or where they would take over `max_bytes`;
    None: the default Policy's max_copy_bytes)."""
    max_bytes = _policy.DEFAULT.max_copy_bytes if max_bytes is None else max_bytes
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
                raise _safety.NotTimed(f"it captures a resource that is not a plain variable "
                                       f"({placeholder.name})")
            elements = owner.shape.num_elements()
            if elements is None or owner.dtype == tf.string:
                raise _safety.NotTimed(f"it captures variable {owner.name} of shape {owner.shape} "
                                       f"and dtype {owner.dtype.name}: no copy of known size")
            copied += elements * owner.dtype.size
            if copied > max_bytes:
                raise _safety.NotTimed(f"copies of its variables would take over "
                                       f"{max_bytes >> 20} MiB")
            try:
                value = owner.numpy()
            except (tf.errors.OpError, ValueError) as error:
                raise _safety.NotTimed(
                    f"variable {owner.name} could not be read ({error})") from None
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
        raise _safety.NotTimed(f"its graphs did not import side by side ({error})") from None


def _made_up(placeholder, batch, rng):
    """An input of the placeholder's shape (an unknown leading dimension: `batch`): normal
    noise for floats, zeros for integers and booleans (always a valid index or label)."""
    dims = placeholder.shape.as_list() if placeholder.shape.rank is not None else None
    if dims is None:
        raise _safety.NotTimed(f"argument {placeholder.name} has an unknown rank")
    if dims and dims[0] is None and batch:
        dims[0] = batch
    if any(d is None for d in dims):
        raise _safety.NotTimed(f"argument {placeholder.name} has shape {placeholder.shape}: a size "
                               "other than the batch is unknown")
    dtype = placeholder.dtype
    if dtype.is_floating:
        return rng.standard_normal(dims).astype(dtype.as_numpy_dtype)
    if dtype.is_integer or dtype.is_bool:
        return np.zeros(dims, dtype.as_numpy_dtype)
    raise _safety.NotTimed(f"argument {placeholder.name} is {dtype.name}: no made-up value for it")
