"""Steps XLA compiles (jit_compile=True): what has no XLA kernel runs after them, in their caller.

A dynamic loss scale warns (a print) and stops (an Assert) after too many skipped steps; XLA
has no kernel for either. Built inside a compiled step, such checks `defer` themselves; the
tf_mpt.function that traced the step `collect`ed them and runs them after each call
(`run_after`), on the state the step left, in the caller's graph or eagerly. Where the caller
is compiled too, they are deferred once more, to its caller. Where nothing collects them
(the step was not traced through tf_mpt.function), one WARNING says what is not checked.
"""

import contextlib
import threading

import tensorflow as tf

from tf_mpt._process import state as _state

_LOCAL = threading.local()  # .checks: the list collect() is filling: (key, check, missing)


def in_xla_context():
    """Whether the graph being built now is compiled by XLA (inside a jit_compile=True
    function, or called from one)."""
    from tensorflow.python.ops import control_flow_util  # pylint: disable=g-import-not-at-top
    try:
        return bool(control_flow_util.GraphOrParentsInXlaContext(
            tf.compat.v1.get_default_graph()))
    except Exception:  # pylint: disable=broad-except  (no such context: nothing compiles)
        return False


@contextlib.contextmanager
def collect():
    """Collects the checks deferred while the block traces (yields the list of checks)."""
    outer = getattr(_LOCAL, "checks", None)
    _LOCAL.checks = []
    try:
        yield _LOCAL.checks
    finally:
        _LOCAL.checks = outer


def defer(key, check, missing):
    """Defers `check` (a callable building the check's ops where it is called, returning
    them) to the caller of the compiled step being traced, once per `key`; where nothing
    collects, logs `missing` once per key (a WARNING saying what goes unchecked)."""
    checks = getattr(_LOCAL, "checks", None)
    if checks is None:
        _state.warn_once(("xla unchecked", key), missing)
    elif not any(known == key for known, _, _ in checks):
        checks.append((key, check, missing))


def run_after(checks, result):
    """After a call of a compiled step: its deferred checks (eager: run now; in a graph:
    ops the returned tensors wait for). Returns `result` (in a graph, its tensors behind the
    checks)."""
    if not checks:
        return result
    if in_xla_context():  # the caller is compiled too: to its caller
        for deferred in checks:
            defer(*deferred)
        return result
    ops = [op for _, check, _ in checks for op in check()]
    if tf.executing_eagerly():
        return result
    with tf.control_dependencies(ops):
        return tf.nest.map_structure(
            lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, result)


# What TensorFlow says when XLA cannot compile a function (raised before any of it runs).
_COMPILE_FAILURES = ("Detected unsupported operations when trying to compile",
                     "tf2xla conversion failed", "for XLA_CPU_JIT devices",
                     "for XLA_GPU_JIT devices")


def failed_to_compile(error):
    """Whether a tf.errors.OpError says XLA could not compile the function."""
    text = str(getattr(error, "message", "") or error)
    return any(marker in text for marker in _COMPILE_FAILURES)


def first_line(error):
    """The first line that says why, of an OpError's message (at most 300 characters)."""
    text = str(getattr(error, "message", "") or error).strip()
    return (text.splitlines() or [""])[0][:300]
