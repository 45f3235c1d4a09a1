"""A traced step's candidates as XLA compiles them: each a tf.function(jit_compile=True) on
eager copies of the step's variables, compiled once outside the rounds."""

import logging
import time

import tensorflow as tf

from tf_mpt._process import state as _state
from tf_mpt.choose.timers import safety as _safety
from tf_mpt.choose.timers import steps as _step_sandbox

_log = logging.getLogger(__name__)


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

    def runners(self, graph_defs, batch, policy=None):
        """({candidate: run()}, seconds compiling the candidates new to the sandbox); the
        copies, where made here, within `policy`'s max_copy_bytes (None: the default's)."""
        with tf.init_scope():  # (eager, also while an outer function traces)
            if self._values is None:
                self._set_up(batch, policy)
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

    def _set_up(self, batch, policy):
        values, self.resident = _step_sandbox.copied_values(
            self._cf, batch, None if policy is None else policy.max_copy_bytes)
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


def time_compiled(concrete_function, graph_defs, batch, rounds, budget_seconds, sandbox,
                  policy=None):
    """Times each of {candidate: GraphDef} (as time_versions takes them) as XLA runs it, in
    `sandbox` (a CompiledSandbox): each compiled once (its first call), then `rounds`
    (timers.rounds.rounds) with what the compiles left of `budget_seconds`. Returns
    {candidate: (seconds per run, ...)}; NotTimed where it cannot be done safely (TooSlow
    where compiling took the whole budget; `policy`: the copies' limit, None the default's)."""
    del concrete_function  # (the sandbox's)
    _safety.refuse_unsafe(graph_defs)
    try:
        runners, compiling = sandbox.runners(graph_defs, batch, policy)
    except (tf.errors.OpError, ValueError, TypeError) as error:
        raise _safety.NotTimed(f"a candidate did not compile or run on made-up inputs under XLA "
                               f"({type(error).__name__})") from None
    left = budget_seconds - compiling
    if left <= 0:
        raise _safety.TooSlow(f"XLA took {compiling:.1f} s to compile the {len(runners)} "
                              f"candidates, the {budget_seconds:.3g} s the rounds may spend of "
                              "the budget (TF_MPT_TIMING_BUDGET)")
    with _state.bypass():
        return rounds(runners, left)
