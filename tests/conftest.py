"""Shared fixtures (the named tolerances are in support/tolerances.py)."""

import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The cost model's kernel times: tables (bfloat16, float16) measured on an AMD Zen 4 (native
# bfloat16), so the decisions tests check do not depend on the machine
# (tests/unit/test_op_costs.py measures this one).
OP_COSTS_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support",
                              "op_costs_zen4.json")
os.environ.setdefault("TF_MPT_OP_COSTS", OP_COSTS_TABLE)
# Timing a rewritten tf.function against float32 (TF_MPT_STEP_TIMING=auto) picks by this
# machine's clock: off unless a test asks, so the versions tests check do not depend on it
# (tests/unit/test_step_timing.py and tests/integration/test_keras_step_timing.py switch it on).
os.environ.setdefault("TF_MPT_STEP_TIMING", "off")
# Timing a graph's candidate colourings (target here) picks by this machine's clock too: off
# unless a test asks (tests/unit/test_graph_timing.py injects a clock and a sandbox).
os.environ.setdefault("TF_MPT_TIMING_BUDGET", "0")

import pytest  # noqa: E402

from support.helpers import RUN_CACHE  # noqa: E402
from support.tolerances import HALF_DTYPES  # noqa: E402


MEASURES_THIS_CPU = "measures_this_cpu"


def pytest_configure(config):
    if not hasattr(config, "workerinput") and RUN_CACHE not in os.environ:
        # child scripts' cache (tests/support/helpers.child_env): one per run, new and empty as
        # on a fresh machine, so no verdict or table an earlier run left decides what they do
        os.environ[RUN_CACHE] = tempfile.mkdtemp(prefix="tf_mpt-tests-cache-")
        config.tf_mpt_run_cache = os.environ[RUN_CACHE]
    config.addinivalue_line(
        "markers", f"{MEASURES_THIS_CPU}: the test times kernels on this machine (its verdict "
        "must hold whichever way this CPU's clock goes)")


def _refusing(message):
    """A stand-in for a measuring function or method (whatever its arguments) that fails
    the test with `message`."""
    def refuse(*args, **kwargs):
        raise AssertionError(message)
    return refuse


@pytest.fixture(autouse=True)
def _no_verdict_from_this_cpus_clock(request, monkeypatch):
    """A test reads the injected table, never kernels timed on this machine: a configuration
    that escapes the suite's table (a bare Config(), an environment without TF_MPT_OP_COSTS)
    would decide by this CPU's clock and pass on one CPU kind and fail on another (the AMX
    kind keeps float32 what Zen 4 converts). Measuring fails the test at once, on every
    machine; a test about measuring itself carries @pytest.mark.measures_this_cpu."""
    # Graph timing's verdicts (a traced step's included) are cached per machine: a test
    # without a cache directory of its own (TF_MPT_CACHE_DIR), one that measures this CPU
    # included, reads and writes them in one of its own, never one another test or an earlier
    # run left (the same step traced by two tests, or by the default run and then the CPU-flag
    # runs of .ci/run, would replay the first one's verdict).
    from tf_mpt.choose import cache as verdicts  # pylint: disable=import-outside-toplevel
    own = request.getfixturevalue("tmp_path") / "verdicts"
    shared_path = verdicts._cache_path  # pylint: disable=protected-access

    def cache_path(config, dtype):
        if config.cache_dir:
            return shared_path(config, dtype)
        return str(own / f"verdicts-{dtype}.json")
    monkeypatch.setattr(verdicts, "_cache_path", cache_path)
    # Nor does it read this machine's other caches (the user's cache directory: op tables
    # and the dispatch check's ratios an earlier script measured here, a float16 MatMul +
    # BiasAdd 265x slower on Sapphire Rapids): without a cache directory of its own, a
    # configuration uses the run's (new and empty, as on a fresh machine; the native library
    # built there once), or the test's own where it measures this CPU.
    from tf_mpt import config as _config  # pylint: disable=import-outside-toplevel
    measures = request.node.get_closest_marker(MEASURES_THIS_CPU)
    directory = os.environ.get(RUN_CACHE) if not measures else None
    directory = directory or str(request.getfixturevalue("tmp_path") / "cache")
    monkeypatch.setattr(_config, "default_cache_dir", lambda: directory)
    if measures:
        return
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel

    def measuring(directory, dtype, nodes=None, ops=None):
        raise AssertionError(
            f"this test timed {dtype} kernels on this machine (nodes={bool(nodes)}, ops="
            f"{sorted(ops) if ops else ops}): its verdict would depend on this CPU's clock. "
            "Build the configuration with Config.from_env (the suite's TF_MPT_OP_COSTS table) "
            "or mark the test @pytest.mark.measures_this_cpu")
    monkeypatch.setattr(op_costs, "_in_child", measuring)
    from tf_mpt.choose.timers import compiled as _compiled  # pylint: disable=import-outside-toplevel
    from tf_mpt.choose.timers import graphs as _graph_sandbox  # pylint: disable=import-outside-toplevel
    from tf_mpt.choose.timers import rounds as _rounds  # pylint: disable=import-outside-toplevel
    from tf_mpt.choose.timers import steps as _step_sandbox  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(_graph_sandbox, "_Sandbox", _refusing(
        "this test timed candidate graphs on this machine: its verdict would depend on "
        "this CPU's clock. Time with the tests' Timer (tests/support/fake_timing.py: a GraphTimer "
        "with the test's sandbox and clock), or mark "
        "the test @pytest.mark.measures_this_cpu"))
    # nor a traced step's candidates in step timing's sandbox (its copies of the variables,
    # one Session), nor rounds on the real clock: a test times with the tests' step timer
    # (fake_timing.install_step_timer), gives the rounds its clock, or carries the mark

    monkeypatch.setattr(_step_sandbox.Sandbox, "runs", _refusing(
        "this test ran candidates in step timing's sandbox on this machine: its verdict "
        "would depend on this CPU's clock. Time with the tests' step timer "
        "(tests/support/fake_timing.py: install_step_timer), or mark the test "
        "@pytest.mark.measures_this_cpu"))
    monkeypatch.setattr(_compiled.CompiledSandbox, "runners", _refusing(
        "this test ran candidates XLA compiled in step timing's sandbox on this machine: "
        "its verdict would depend on this CPU's clock. Time with the tests' step timer "
        "(tests/support/fake_timing.py: install_step_timer), or mark the test "
        "@pytest.mark.measures_this_cpu"))
    monkeypatch.setattr(_rounds, "_clock", _refusing(
        "this test read the real clock of graph timing's rounds: its verdict would "
        "depend on this CPU's clock. Give the rounds the test's clock (tests/support/"
        "fake_timing.py), or mark the test @pytest.mark.measures_this_cpu"))
    from tf_mpt.costs import dispatch  # pylint: disable=import-outside-toplevel

    def not_checking(dtype, ops):
        return {}  # no ratio measured: nothing is kept float32 by the dispatch check
    # A configuration without the suite's table (a bare Config(), as a test of the automatic
    # path's plumbing builds) would check this machine's kernels: it checks nothing instead,
    # the same on every CPU. The check itself is tests/unit/test_dispatch_check.py's, with
    # ratios from a table.
    monkeypatch.setattr(dispatch, "_in_child", not_checking)
    # (nor does the automatic path start a child checking them early)
    monkeypatch.setattr(dispatch, "_spawn", lambda dtype, ops, cache: None)

    def measuring_here(dtype, ops, *args, **kwargs):
        raise AssertionError(
            f"this test checked {dtype} kernels ({ops}) in its own process on this machine: "
            "the ratios would depend on this CPU's clock. Inject dispatch.measure, or mark the "
            "test @pytest.mark.measures_this_cpu")
    # nor does a Session check them in this process (dispatch.measure_in_place)
    monkeypatch.setattr(dispatch, "measure", measuring_here)


@pytest.fixture(params=HALF_DTYPES)
def half_dtype(request):
    return request.param


@pytest.fixture
def no_cost_model(monkeypatch):
    """The cost model off (TF_MPT_TARGET=rules) for a test of other machinery (passes, loops,
    gathers, conversion) on a model of a few narrow layers, which the model keeps float32 in
    bfloat16 on a CPU (bfloat16 would not be faster: tests/unit/test_cost_model.py): the op
    lists decide, so the machinery has half ops."""
    monkeypatch.setenv("TF_MPT_TARGET", "rules")


def pytest_sessionfinish(session, exitstatus):
    """A run in which no test passed is a failure, never a pass."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    passed = len(reporter.stats.get("passed", ())) if reporter else 0
    if exitstatus == 0 and passed == 0:
        session.exitstatus = 1
    run_cache = getattr(session.config, "tf_mpt_run_cache", None)
    if run_cache:
        shutil.rmtree(run_cache, ignore_errors=True)
