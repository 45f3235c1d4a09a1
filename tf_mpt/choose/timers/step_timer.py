"""A traced step's Timer: its candidates on copies of its variables (steps.py), or as XLA
compiles them (compiled.py), in one sandbox kept open across the stages."""

import functools

import tensorflow as tf

from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose.timers import compiled as _compiled
from tf_mpt.choose.timers import protocol as _protocol
from tf_mpt.choose.timers import rounds as _rounds
from tf_mpt.choose.timers import safety as _safety
from tf_mpt.choose.timers import steps as _step_sandbox


class StepTimer(_protocol.Timer):
    """A traced step's Timer: its candidates run on copies of its variables (time_versions;
    as XLA compiles them where `compiled`: timers.compiled.time_compiled), each half
    candidate's library functions named apart (`rename(graph_def, suffix)`: the eager
    context holds the float32 ones under their names). One sandbox serves every call until
    close() (decide's stages: a candidate timed again is not imported or set up again).

    cf: the traced ConcreteFunction. build: what makes a candidate's jit_compile function
    (CompiledSandbox's). canonical(graph_def): the GraphDef a verdict is cached by (a trace
    names its functions with its process's counters). calls_compiled: the step calls a
    function XLA compiles.

    The protocol's methods hold its rules (a step under a strategy is not timed, the
    graphs named apart, XLA's steps neither profiled nor traced); what runs the graphs is
    `measure_times`, `measure_profiles` and `measure_peaks` (a test's fake timer is this one
    with its own three: tests/support/fake_timing.py)."""

    def __init__(self, cf, compiled, rename, build, canonical, calls_compiled):
        super().__init__()
        self.cf, self.compiled = cf, bool(compiled)
        # (XLA fuses the nodes a profile would time one by one: no refinement by op type)
        self.profiles = not self.compiled
        self.calls_compiled = self.compiled or bool(calls_compiled)
        self._rename, self._canonical = rename, canonical
        self._named_apart = {}  # {id(GraphDef): (the GraphDef, its copy named apart)}
        # (set up at its first use)
        self._sandbox = _compiled.CompiledSandbox(cf, build) if self.compiled else \
            _step_sandbox.Sandbox(cf)

    def _apart(self, graphs):
        out = {}
        for name, graph in graphs.items():
            if name == _candidates.FLOAT32:
                out[name] = graph
                continue
            if id(graph) not in self._named_apart:
                self._named_apart[id(graph)] = (graph, self._rename(
                    graph, f"_tf_mpt_t{len(self._named_apart) + 1}"))
            out[name] = self._named_apart[id(graph)][1]
        return out

    @staticmethod
    def _check():
        if tf.distribute.has_strategy():
            raise _safety.NotTimed("it runs under a tf.distribute strategy, on devices the "
                                   "timing would not use")

    def time(self, graphs, budget, policy):
        self._check()
        return self.measure_times(self._apart(graphs), budget, policy)

    def profile(self, graphs, policy):
        self._check()
        if self.compiled:
            raise _safety.NotTimed("XLA fuses the nodes a profile would time one by one")
        return self.measure_profiles(self._apart(graphs), policy)

    def peaks_only(self, graphs, policy):
        self._check()
        if self.compiled:
            raise _safety.NotTimed("XLA runs it: its steps' allocations are not recorded")
        return self.measure_peaks(self._apart(graphs), policy)

    def measure_times(self, graphs, budget, policy):
        """`time`'s rounds of `graphs` (named apart), in the sandbox: as XLA compiles them
        where `compiled` (no allocation records under XLA: no peaks), else on the copies,
        their peaks into `peaks`."""
        runs = functools.partial(_rounds.rounds, policy=policy)
        if self.compiled:
            return _compiled.time_compiled(self.cf, graphs, policy.batch, runs, budget,
                                           self._sandbox, policy)
        return _step_sandbox.time_versions(self.cf, graphs, policy.batch, runs, budget,
                                           self.peaks, sandbox=self._sandbox, policy=policy)

    def measure_profiles(self, graphs, policy):
        """`profile`'s per-node times of `graphs` (named apart), in the sandbox."""
        return _step_sandbox.profile_versions(self.cf, graphs, policy.batch,
                                              policy.profile_runs, sandbox=self._sandbox,
                                              policy=policy)

    def measure_peaks(self, graphs, policy):
        """`peaks_only`'s first and traced runs of `graphs` (named apart), their peaks into
        `peaks`."""
        return _step_sandbox.time_versions(self.cf, graphs, policy.batch, _rounds.first_runs,
                                           0.0, self.peaks, sandbox=self._sandbox,
                                           policy=policy)

    def key_graph(self, graph_def):
        self._check()  # (a verdict is read only where the function could be timed)
        key = self._canonical(graph_def)
        if self.compiled:  # (a verdict timed under XLA is not one timed without it)
            key.node.add(name="_tf_mpt_compiled_by_xla", op="NoOp")
        return key

    def close(self):
        self._sandbox.close()
        self._named_apart.clear()
