"""The dispatch check (issue "measured, not predicted", item 5): where the graph runs on this
machine, an op type whose half kernel TensorFlow runs several times slower than float32 (a
float16 Conv2DBackpropFilter on oneDNN's reference path: 195x on a Sapphire Rapids; a float16
MatMul fused with its BiasAdd: 620x) stays float32, with one WARNING naming the op and the
ratio, whatever the dtype and target; for another machine nothing changes.

The numerics check beside it: an op type whose half kernel errs several times the rounding
of float32's result (Eigen's bfloat16 Conv2DBackpropFilter with oneDNN off: 14x) stays
float32 too, with one WARNING naming the remedy where one exists (TF_ENABLE_ONEDNN_OPTS=1).

The ratios come from the table standing in for this CPU (its "dispatch" entry: the Sapphire
Rapids figures of the issue; its "numerics" entry), never from this machine, except in the
tests marked measures_this_cpu, which assert what holds on every CPU kind.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt import _cpu
from tf_mpt.costs import dispatch
from support import half_ops, helpers
from support.helpers import cli_main
from support.helpers import tf1

F16 = tf.float16.as_datatype_enum
BF16 = tf.bfloat16.as_datatype_enum
SAPPHIRE_RAPIDS = {"Conv2DBackpropFilter": 195.0, "MatMul": 1.0, "MatMul+BiasAdd": 620.0,
                   "Conv2D": 0.5, "Conv2D+BiasAdd+Relu": 0.6}
# error ratios of Eigen's bfloat16 kernels (oneDNN off) at the patterns' shapes; the
# Conv2DBackpropInput's under INACCURATE
EIGEN_BFLOAT16 = {"Conv2DBackpropFilter": 13.9, "Conv2DBackpropInput": 3.5, "MatMul": 2.0,
                  "MatMul+BiasAdd": 2.2, "Conv2D": 1.0, "Relu": 0.0}
SKYLAKE_FLAGS = "avx2 fma avx512f avx512bw"  # oneDNN runs bfloat16 (emulated), not natively


def _table(tmp_path, dtype="float16", ratios=SAPPHIRE_RAPIDS, numerics=None):
    """The suite's table with a "dispatch" entry for `dtype` (and a "numerics" entry where
    given)."""
    with open(os.environ["TF_MPT_OP_COSTS"]) as f:
        tables = json.load(f)
    for table in tables:
        if table["dtype"] == dtype:
            table["dispatch"] = ratios
            if numerics is not None:
                table["numerics"] = numerics
    path = tmp_path / "table_with_dispatch.json"
    path.write_text(json.dumps(tables))
    return str(path)


def _training_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [16, 15, 15, 32], name="x")
        labels = tf1.placeholder(tf.int64, [16], name="labels")
        kernel = tf1.get_variable("kernel", [3, 3, 32, 32])
        h = tf.nn.relu(tf.nn.conv2d(x, kernel, 1, "VALID"))
        flat = tf.reshape(h, [16, 13 * 13 * 32])
        w, b = tf1.get_variable("w", [13 * 13 * 32, 64]), tf1.get_variable("b", [64])
        logits = tf.nn.bias_add(tf.matmul(flat, w), b)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits), name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return graph


def _half(graph_def, op, half=F16):
    return [n.name for n in graph_def.node if n.op == op and n.attr["T"].type == half]


def _of(graph_def, op):
    return [n.name for n in graph_def.node if n.op == op]


def _only_decision(result, op):
    """The report's decision for the graph's one node of type `op`."""
    (decision,) = [d for d in result.report.decisions.values() if d.op == op]
    return decision


def test_patterns_named_are_the_patterns_built():
    with tf.Graph().as_default():
        built, _ = dispatch._patterns(tf, "float16")  # pylint: disable=protected-access
    assert tuple(sorted(built)) == dispatch.PATTERNS


def test_slow_half_kernels_stay_float32_where_the_graph_runs_here(tmp_path, monkeypatch,
                                                                  caplog):
    monkeypatch.setenv("TF_MPT_OP_COSTS", _table(tmp_path))
    graph_def = _training_graph().as_graph_def()
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        result = tf_mpt.rewrite_graph_def(graph_def, dtype="float16", target="here",
                                          fetches=["loss", "train"])
    gd = result.graph_def
    assert _of(gd, "Conv2DBackpropFilter") and not _half(gd, "Conv2DBackpropFilter")
    assert len(_of(gd, "MatMul")) == 3 and not _half(gd, "MatMul")  # forward and gradients
    assert _half(gd, "Conv2D")  # 0.5x: as fast as float32 or faster, half
    assert result.report.dispatch_kept == {"Conv2DBackpropFilter": 195.0, "MatMul": 620.0}
    decision = _only_decision(result, "Conv2DBackpropFilter")
    assert decision.reason == ("dispatch check: TensorFlow's float16 kernel for "
                               "Conv2DBackpropFilter (Conv2DBackpropFilter) ran 195x slower "
                               "than float32 on this CPU: kept float32")
    assert "kept float32 by the dispatch check (float16 kernel that many times slower here): " \
        "Conv2DBackpropFilter (195x), MatMul (620x)" in result.report.summary()
    warnings = [r.getMessage() for r in caplog.records if "keeps" in r.getMessage()]
    assert warnings == [
        "tf_mpt keeps Conv2DBackpropFilter float32: TensorFlow's float16 kernel for it on this "
        "CPU (Conv2DBackpropFilter, as the remapper fuses it) ran 195x slower than float32",
        "tf_mpt keeps MatMul float32: TensorFlow's float16 kernel for it on this CPU "
        "(MatMul+BiasAdd, as the remapper fuses it) ran 620x slower than float32"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):  # once per process
        tf_mpt.rewrite_graph_def(graph_def, dtype="float16", target="here",
                                 fetches=["loss", "train"])
    assert not [r for r in caplog.records if "keeps" in r.getMessage()]


def test_for_another_machine_nothing_changes(tmp_path, monkeypatch):
    """--target rules or FILE: the graph is for another machine; the table's ratios (this
    CPU's: slow and inaccurate kernels) change nothing: the same graph as from the same table
    without them."""
    table = _table(tmp_path, numerics={"Conv2DBackpropFilter": 14.0, "Conv2D": 9.0})
    without = tmp_path / "without" / "table.json"
    without.parent.mkdir()
    without.write_text(open(_table(tmp_path, ratios={})).read())
    monkeypatch.setenv("TF_MPT_OP_COSTS", table)
    graph_def = _training_graph().as_graph_def()
    rules = tf_mpt.rewrite_graph_def(graph_def, dtype="float16", target="rules",
                                     fetches=["loss", "train"])
    assert _half(rules.graph_def, "Conv2DBackpropFilter") and _half(rules.graph_def, "Conv2D")
    assert len(_half(rules.graph_def, "MatMul")) == 3
    assert rules.report.dispatch_kept == {} and rules.report.numerics_kept == {}
    for_table = tf_mpt.rewrite_graph_def(graph_def, dtype="float16", target=table,
                                         fetches=["loss", "train"])
    monkeypatch.setenv("TF_MPT_OP_COSTS", str(without))
    plain = tf_mpt.rewrite_graph_def(graph_def, dtype="float16", target=str(without),
                                     fetches=["loss", "train"])
    assert for_table.graph_def == plain.graph_def and for_table.report.dispatch_kept == {}
    assert for_table.report.numerics_kept == {}


def test_bfloat16_is_checked_too_and_a_table_without_ratios_checks_nothing(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("TF_MPT_OP_COSTS", _table(tmp_path, "bfloat16", {"Conv2D": 4.0}))
    result = tf_mpt.rewrite_graph_def(_training_graph().as_graph_def(), dtype="bfloat16",
                                      target="here", fetches=["loss", "train"])
    assert result.report.dispatch_kept == {"Conv2D": 4.0}
    # the suite's own table has no "dispatch" entry: nothing is checked, nothing measured
    monkeypatch.setenv("TF_MPT_OP_COSTS", _table(tmp_path, "float16", {}))
    result = tf_mpt.rewrite_graph_def(_training_graph().as_graph_def(), dtype="float16",
                                      target="here", fetches=["loss", "train"])
    assert result.report.dispatch_kept == {}


REMEDY = ("oneDNN is off in this process: set TF_ENABLE_ONEDNN_OPTS=1 (before TensorFlow "
          "starts) for oneDNN's bfloat16 kernels, which accumulate in float32")


@pytest.mark.parametrize("onednn", [False, True], ids=["oneDNN off", "oneDNN on"])
def test_inaccurate_half_kernels_stay_float32_where_the_graph_runs_here(tmp_path, monkeypatch,
                                                                        caplog, onednn):
    """The table's error ratios (Eigen's bfloat16 kernels): Conv2DBackpropFilter's 13.9x its
    rounding stays float32, with the remedy where oneDNN is off; Conv2DBackpropInput's 3.5x
    and Conv2D's 1x go half. The same table without them: all three half."""
    monkeypatch.setenv("TF_MPT_CPU_FLAGS", SKYLAKE_FLAGS)
    monkeypatch.setattr(dispatch, "onednn_on", lambda: onednn)
    from tf_mpt._process import state  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(state.STATE, "warned", set())
    graph_def = _training_graph().as_graph_def()
    monkeypatch.setenv("TF_MPT_OP_COSTS", _table(tmp_path, "bfloat16", {}))
    plain = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", target="here",
                                     fetches=["loss", "train"])
    for op in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"):
        assert _half(plain.graph_def, op, BF16) == _of(plain.graph_def, op), op
    monkeypatch.setenv("TF_MPT_OP_COSTS", _table(tmp_path, "bfloat16", {}, EIGEN_BFLOAT16))
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        result = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", target="here",
                                          fetches=["loss", "train"])
    gd = result.graph_def
    assert _of(gd, "Conv2DBackpropFilter") and not _half(gd, "Conv2DBackpropFilter", BF16)
    assert _half(gd, "Conv2D", BF16) == ["Conv2D"]
    assert _half(gd, "Conv2DBackpropInput", BF16) == ["gradients/Conv2D_grad/Conv2DBackpropInput"]
    assert result.report.numerics_kept == {"Conv2DBackpropFilter": 13.9}
    assert result.report.dispatch_kept == {}
    assert result.report.to_dict()["numerics_kept"] == {"Conv2DBackpropFilter": 13.9}
    decision = _only_decision(result, "Conv2DBackpropFilter")
    assert decision.reason == ("numerics check: TensorFlow's bfloat16 kernel for "
                               "Conv2DBackpropFilter (Conv2DBackpropFilter) erred 14x bfloat16 "
                               "rounding against float32 on this CPU: kept float32")
    assert "; kept float32 by the numerics check (bfloat16 kernel error that many times " \
        "bfloat16 rounding here): Conv2DBackpropFilter (14x)" in result.report.summary()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "tf_mpt keeps Conv2DBackpropFilter float32: TensorFlow's bfloat16 kernel for it on "
        "this CPU (Conv2DBackpropFilter, as the remapper fuses it) erred 14x the rounding of "
        "float32's result to bfloat16" + ("" if onednn else "; " + REMEDY)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):  # once per process
        again = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", target="here",
                                         fetches=["loss", "train"])
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert again.graph_def == gd


def test_a_kernel_both_slow_and_inaccurate_is_reported_by_both_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_MPT_OP_COSTS", _table(
        tmp_path, "float16", SAPPHIRE_RAPIDS, {"Conv2DBackpropFilter": 14.0, "MatMul": 1.0}))
    result = tf_mpt.rewrite_graph_def(_training_graph().as_graph_def(), dtype="float16",
                                      target="here", fetches=["loss", "train"])
    assert result.report.dispatch_kept == {"Conv2DBackpropFilter": 195.0, "MatMul": 620.0}
    assert result.report.numerics_kept == {"Conv2DBackpropFilter": 14.0}
    decision = _only_decision(result, "Conv2DBackpropFilter")
    assert decision.reason.startswith("dispatch check: ")  # the first check's reason


@pytest.mark.parametrize("dtype, onednn, flags, fixed", [
    ("bfloat16", False, SKYLAKE_FLAGS, True),
    ("bfloat16", False, "avx2 avx_ne_convert", True),
    ("bfloat16", True, SKYLAKE_FLAGS, False),  # oneDNN's kernels already run
    ("bfloat16", False, "avx2 fma f16c", False),  # Zen 3: oneDNN falls back to Eigen's
    ("float16", False, SKYLAKE_FLAGS, False),  # oneDNN's float16: AVX512_FP16 only, slow
], ids=["skylake", "avx_ne_convert", "oneDNN on", "zen3", "float16"])
def test_the_remedy_is_named_where_it_exists(dtype, onednn, flags, fixed):
    assert dispatch.remedy(dtype, onednn, frozenset(flags.split())) == (REMEDY if fixed else "")


def test_the_error_ratio_counts_in_units_of_the_outputs_rounding():
    full = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    exactly = 1e-6  # (differences taken in float32: ten times a rounding is rounded too)
    for half in (tf.bfloat16.as_numpy_dtype, np.float16):
        rounded = full.astype(half)
        assert dispatch.error_ratio(rounded, full, half) == 1.0
        # ten times the rounding's error: 10
        worse = full.astype(np.float64) + 10 * (rounded.astype(np.float64) - full)
        assert dispatch.error_ratio(worse, full, half) == pytest.approx(10.0, rel=exactly)
    assert dispatch.error_ratio(full, full, np.float16) == 0.0
    # an output exact in the half type (a max pool): its rounding counts as eps / 8
    exact = full.astype(np.float16).astype(np.float32)
    off = exact.copy()
    off[0] += 2.0 ** -10
    floor = np.finfo(np.float16).eps / 8 * np.linalg.norm(exact.astype(np.float64))
    assert dispatch.error_ratio(off, exact, np.float16) == pytest.approx(2.0 ** -10 / floor,
                                                                         rel=exactly)


def test_the_ratios_round_trip_and_a_bad_layout_is_refused():
    found = dispatch.Ratios({"MatMul": 1.5}, {"MatMul": 2.0})
    assert dispatch.Ratios.from_json(json.loads(found.to_json())) == found
    assert dispatch.Ratios.from_json({}) == dispatch.Ratios()
    with pytest.raises(ValueError, match=r"must be a JSON object \{\"dispatch\".*"
                       r"Received: \[1.5\]"):
        dispatch.Ratios.from_json([1.5])


@pytest.mark.parametrize("onednn", [False, True], ids=["oneDNN off", "oneDNN on"])
def test_the_cache_and_the_child_follow_onednn_in_this_process(tmp_path, monkeypatch, onednn):
    """oneDNN's kernels and Eigen's differ in speed and accuracy: one cache each, and the child
    measures what this process runs, whatever os.environ says now."""
    monkeypatch.setattr(dispatch, "onednn_on", lambda: onednn)
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0" if onednn else "1")
    config = tf_mpt.Config.from_env({"TF_MPT_CACHE_DIR": str(tmp_path)})
    path = dispatch._cache_path(config, "bfloat16")  # pylint: disable=protected-access
    assert path.endswith(f"-v{dispatch.VERSION}-onednn-{'on' if onednn else 'off'}.json")
    assert os.path.dirname(path) == str(tmp_path)
    env = dispatch._child_env()  # pylint: disable=protected-access
    assert env["TF_ENABLE_ONEDNN_OPTS"] == ("1" if onednn else "0")


def test_tf_mpt_cpu_says_what_the_checks_found(tmp_path, monkeypatch, capsys):
    table = _table(tmp_path, "bfloat16", {"MatMul": 1.0}, {"MatMul": 1.0})
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    monkeypatch.setenv("TF_MPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TF_MPT_CPU_FLAGS", SKYLAKE_FLAGS)
    monkeypatch.setattr(dispatch, "onednn_on", lambda: False)
    config = tf_mpt.Config.from_env(os.environ)
    cache = dispatch._cache_path(config, "bfloat16")  # pylint: disable=protected-access
    with open(cache, "w") as f:
        f.write(dispatch.Ratios({"Conv2DBackpropFilter": 15.9, "MatMul": 1.0, "Relu": 1.2},
                                {"Conv2DBackpropFilter": 13.9, "MatMul": 2.0}).to_json())
    code, out, err = cli_main(capsys, "cpu")
    assert code == 0, err
    assert "TensorFlow's oneDNN kernels: off in this process (TF_ENABLE_ONEDNN_OPTS)\n" in out
    assert out.endswith(
        "bfloat16 kernels (oneDNN off, measured here): 3/25 patterns checked; kept float32 "
        "where a graph runs here:\n"
        "  over 3x slower than float32: Conv2DBackpropFilter 15.9x (Conv2DBackpropFilter)\n"
        "  error over 4x bfloat16 rounding: Conv2DBackpropFilter 13.9x (Conv2DBackpropFilter)\n"
        f"  remedy: {REMEDY}\n"
        "float16 kernels (oneDNN off, measured here): not measured yet (the first rewrite to "
        "float16 of a graph that runs here measures them, once)\n"), out
    # a table standing in for this CPU: its entries, or none
    monkeypatch.setenv("TF_MPT_OP_COSTS", table)
    code, out, err = cli_main(capsys, "cpu")
    assert code == 0, err
    assert out.endswith(
        "bfloat16 kernels (from table_with_dispatch.json (TF_MPT_OP_COSTS)): 1/25 patterns "
        "checked; kept float32 where a graph runs here:\n"
        "  over 3x slower than float32: none\n"
        "  error over 4x bfloat16 rounding: none\n"
        "float16 kernels (from table_with_dispatch.json (TF_MPT_OP_COSTS)): nothing checked "
        "(the table has no \"dispatch\" entry)\n"), out


_SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    x = tf1.placeholder(tf.float32, [16, 15, 15, 32])
    labels = tf1.placeholder(tf.int64, [16])
    kernel = tf1.get_variable("kernel", [3, 3, 32, 32])
    h = tf.nn.relu(tf.nn.conv2d(x, kernel, 1, "VALID"))
    logits = tf.matmul(tf.reshape(h, [16, 13 * 13 * 32]), tf1.get_variable("w", [5408, 10]))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf1.Session() as session:
        session.run(tf1.global_variables_initializer())
        feed = {x: np.random.rand(16, 15, 15, 32).astype(np.float32),
                labels: np.zeros(16, np.int64)}
        for _ in range(2):
            session.run([loss, train], feed)
    print("loss dtype", loss.dtype.name)
""")


def _run_cache(tmp_path):
    """The run's cache directory, where the suite builds the Grappler optimizer once (a
    directory of the test's own would build it again: 4 s of a Zen 4 core); the table stands
    in for this CPU, so the script measures nothing and the cache holds no ratio of it."""
    return os.environ.get(helpers.RUN_CACHE) or str(tmp_path / "cache")


# under -m heavy (float16 convolutions run oneDNN's reference kernels on a CPU: 7 s of a Zen 4
# core): the automatic path reading the check's ratios and keeping a kernel float32 with its
# WARNING is test_the_automatic_path_keeps_an_inaccurate_kernel_float32's in the default run
@pytest.mark.heavy
@pytest.mark.parametrize("target", ["rules", "auto"])
def test_the_automatic_path_checks_whatever_the_target(tmp_path, target):
    """TF_MPT_ENABLE=1 TF_MPT_DTYPE=float16: the Session's graph runs here, so the table's
    195x Conv2DBackpropFilter stays float32 (the Conv2D runs half), with the WARNING."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, TF_MPT_ENABLE="1", TF_MPT_DTYPE="float16", TF_MPT_TARGET=target,
               TF_MPT_OP_COSTS=_table(tmp_path), TF_CPP_MIN_LOG_LEVEL="2",
               TF_MPT_CACHE_DIR=_run_cache(tmp_path))
    proc = subprocess.run([sys.executable, str(script)], env=half_ops.observed_env(env),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss dtype float32" in proc.stdout
    counts = half_ops.parse(proc.stderr)
    assert counts is not None, proc.stderr[-2000:]
    assert counts["half_types"].get("Conv2D", 0) >= 1, counts
    assert counts["half_types"].get("Conv2DBackpropFilter", 0) == 0, counts
    assert "tf_mpt keeps Conv2DBackpropFilter float32: TensorFlow's float16 kernel for it " \
        "on this CPU (Conv2DBackpropFilter, as the remapper fuses it) ran 195x slower" in \
        proc.stderr


def test_the_automatic_path_keeps_an_inaccurate_kernel_float32(tmp_path):
    """TF_MPT_ENABLE=1 TF_MPT_DTYPE=bfloat16: the table's 13.9x Conv2DBackpropFilter runs
    float32, the Conv2D (1x) and the MatMuls (2.2x) run bfloat16, with the WARNING."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, TF_MPT_ENABLE="1", TF_MPT_DTYPE="bfloat16", TF_MPT_TARGET="rules",
               TF_MPT_OP_COSTS=_table(tmp_path, "bfloat16", {}, EIGEN_BFLOAT16),
               TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_CACHE_DIR=_run_cache(tmp_path))
    proc = subprocess.run([sys.executable, str(script)], env=half_ops.observed_env(env),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = half_ops.parse(proc.stderr)
    assert counts is not None, proc.stderr[-2000:]
    assert counts["half_types"].get("Conv2D", 0) == 1, counts
    assert counts["half_types"].get("MatMul", 0) == 3, counts  # forward and gradients
    assert counts["half_types"].get("Conv2DBackpropFilter", 0) == 0, counts
    assert "tf_mpt keeps Conv2DBackpropFilter float32: TensorFlow's bfloat16 kernel for it " \
        "on this CPU (Conv2DBackpropFilter, as the remapper fuses it) erred 14x the rounding " \
        "of float32's result to bfloat16" in proc.stderr


# under -m heavy (a child measuring this CPU): the early child measuring and caching stays in
# the default run, and the child's reading of the cache (it measures only what it lacks)
@pytest.mark.heavy
@pytest.mark.measures_this_cpu
def test_the_ratio_is_measured_in_a_child_once_then_cached(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    config = tf_mpt.Config.from_env(dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path)))
    found = dispatch.ratios(config, "float16", {"Relu"})
    assert set(found.dispatch) == {"Relu"} and found.dispatch["Relu"] > 0
    # a Relu of float16 values is exact in float16: the half output is float32's
    assert found.numerics == {"Relu": 0.0}
    monkeypatch.setattr(dispatch, "_in_child", lambda dtype, ops: pytest.fail("measured"))
    assert dispatch.ratios(config, "float16", {"Relu"}) == found


class _FakeEarly:
    """An early child that has measured `measured` (a dispatch.Ratios)."""

    def __init__(self, measured):
        self.measured, self.asked = measured, []

    def wait_for(self, patterns, timeout=None):
        self.asked.append(sorted(patterns))
        return self.measured


def test_a_rewrite_waits_for_the_early_child_and_measures_only_what_it_lacks(tmp_path,
                                                                           monkeypatch):
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    config = tf_mpt.Config.from_env(dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path)))
    early = _FakeEarly(dispatch.Ratios(
        {"MatMul": 1.0, "MatMul+BiasAdd": 620.0, "MatMul+BiasAdd+Relu": 2.0},
        {"MatMul": 5.0, "MatMul+BiasAdd": 1.0, "MatMul+BiasAdd+Relu": 1.0}))
    monkeypatch.setitem(dispatch._EARLY, "float16", early)  # pylint: disable=protected-access
    asked = []

    def in_child(dtype, ops):
        asked.append(ops)
        return {"dispatch": {"Relu": 1.5}, "numerics": {"Relu": 0.0}}
    monkeypatch.setattr(dispatch, "_in_child", in_child)
    found = dispatch.ratios(config, "float16", {"MatMul", "Relu"})
    assert dispatch.slow_ops(found, {"MatMul", "Relu"}) == {"MatMul": (620.0, "MatMul+BiasAdd")}
    assert dispatch.inaccurate_ops(found, {"MatMul", "Relu"}) == {"MatMul": (5.0, "MatMul")}
    # it waited for the MatMul and Relu patterns; the early child had not measured Relu
    assert early.asked == [["MatMul", "MatMul+BiasAdd", "MatMul+BiasAdd+Relu", "Relu"]]
    assert asked == [["Relu"]]
    # both are cached: a second rewrite waits for nothing and measures nothing
    monkeypatch.setattr(dispatch, "_in_child", lambda dtype, ops: pytest.fail("measured"))
    monkeypatch.setitem(dispatch._EARLY, "float16", None)  # pylint: disable=protected-access
    assert dispatch.ratios(config, "float16", {"MatMul", "Relu"}) == dispatch.Ratios(
        {"MatMul": 1.0, "MatMul+BiasAdd": 620.0, "MatMul+BiasAdd+Relu": 2.0, "Relu": 1.5},
        {"MatMul": 5.0, "MatMul+BiasAdd": 1.0, "MatMul+BiasAdd+Relu": 1.0, "Relu": 0.0})


def test_the_automatic_path_starts_the_check_when_switched_on_and_not_with_a_table(
        tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(dispatch, "_spawn", lambda dtype, ops, cache: started.append(
        (dtype, ops, cache)))
    monkeypatch.setattr(dispatch, "_EARLY", {})
    with_table = tf_mpt.Config.from_env(dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path)))
    dispatch.start_early(with_table, "float16")
    assert started == []  # the suite's table stands in for this CPU: nothing is measured
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    config = tf_mpt.Config.from_env(dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path)))
    dispatch.start_early(config, "float16")
    (dtype, ops, cache), = started
    assert dtype == "float16" and cache.startswith(str(tmp_path))
    assert sorted(ops) == sorted(dispatch.CHECKED_OPS)
    assert ops[:3] == ["MatMul", "AddV2", "Mul"]  # the common op types first
    # a cache that has every pattern: nothing starts
    started.clear()
    with open(cache, "w") as f:
        f.write(dispatch.Ratios({p: 1.0 for p in dispatch.PATTERNS}).to_json())
    monkeypatch.setattr(dispatch, "_EARLY", {})
    dispatch.start_early(config, "float16")
    assert started == []


def test_a_failing_check_warns_once_and_keeps_nothing_float32(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    config = tf_mpt.Config.from_env(dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path)))

    def failing(dtype, ops):
        raise ValueError("the child exited with 1: ['ImportError: no tensorflow']")
    monkeypatch.setattr(dispatch, "_in_child", failing)
    from tf_mpt._process import state  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(state.STATE, "warned", set())
    caplog.set_level(logging.WARNING, logger="tf_mpt")
    for _ in range(2):
        assert dispatch.ratios(config, "float16", {"MatMul", "Conv2D"}) == dispatch.Ratios()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "tf_mpt could not check how TensorFlow runs float16 kernels on this CPU (ValueError: "
        "the child exited with 1: ['ImportError: no tensorflow']); no op is kept float32 for "
        "a slow or inaccurate half kernel"], warnings


@pytest.mark.measures_this_cpu
def test_the_early_child_writes_each_ratio_as_it_is_done_and_caches_them(tmp_path):
    cache = str(tmp_path / "cache" / "dispatch.json")
    early = dispatch._spawn("float16", ["Relu", "Tanh"], cache)  # pylint: disable=protected-access
    try:
        first = early.wait_for(["Tanh"], timeout=300)  # the child is told to measure it next
        assert "Tanh" in first.dispatch and first.dispatch["Tanh"] > 0
        wanted = os.path.join(early.directory, dispatch._WANTED)  # pylint: disable=protected-access
        with open(wanted) as f:
            assert json.load(f) == ["Tanh"]
        early.proc.wait(timeout=300)
        assert early.proc.returncode == 0
        with open(cache) as f:
            written = json.load(f)
        assert set(written["dispatch"]) == set(written["numerics"]) == {"Relu", "Tanh"}
    finally:
        early.stop()
    assert not os.path.exists(early.directory)


@pytest.mark.measures_this_cpu
def test_the_patterns_a_rewrite_waits_for_are_measured_next():
    order = []
    asked = iter([set(), {"Tanh"}, set()])  # before the first pattern, nothing yet
    dispatch.measure("bfloat16", ["Relu", "Mul", "Tanh"],
                     done=lambda ratios: order.append(sorted(ratios.dispatch)),
                     wanted=lambda: next(asked))
    assert order == [["Relu"], ["Relu", "Tanh"], ["Mul", "Relu", "Tanh"]]


def _child_ratios(tmp_path, dtype, ops, onednn):
    """The Ratios a child measures with TF_ENABLE_ONEDNN_OPTS=`onednn` (its own variable: the
    check's children follow this process's oneDNN)."""
    out = str(tmp_path / f"ratios-{onednn}.json")
    # pylint: disable=protected-access
    env = dict(dispatch._child_env(), TF_ENABLE_ONEDNN_OPTS=onednn)
    proc = subprocess.run(dispatch._command(dtype, ops, out), env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return dispatch.Ratios.from_json(json.load(f))


@pytest.mark.heavy
@pytest.mark.measures_this_cpu
def test_eigens_bfloat16_filter_gradient_is_inaccurate_and_onednns_is_not(tmp_path):
    """On this CPU, bfloat16, with oneDNN off: Eigen's Conv2DBackpropFilter accumulates in
    bfloat16, over INACCURATE times its output's rounding (14x at the pattern's shapes), and
    the remedy is named where oneDNN runs bfloat16; with oneDNN on, there, every pattern is at
    rounding level (elsewhere TensorFlow falls back to Eigen's kernels: the same errors)."""
    ops = ["Conv2DBackpropFilter", "MatMul"]
    patterns = {"Conv2DBackpropFilter", "MatMul", "MatMul+BiasAdd", "MatMul+BiasAdd+Relu"}
    off = _child_ratios(tmp_path, "bfloat16", ops, "0")
    on = _child_ratios(tmp_path, "bfloat16", ops, "1")
    for found in (off, on):
        assert set(found.dispatch) == set(found.numerics) == patterns, found
    assert off.numerics["Conv2DBackpropFilter"] > dispatch.INACCURATE, off
    assert dispatch.inaccurate_ops(off, set(ops))["Conv2DBackpropFilter"] == (
        off.numerics["Conv2DBackpropFilter"], "Conv2DBackpropFilter")
    flags = _cpu.real_cpu_flags()  # TensorFlow's gate reads the real CPU
    if _cpu.grappler_bfloat16_runs(flags):
        assert dispatch.remedy("bfloat16", False, flags) == REMEDY
        for pattern, ratio in on.numerics.items():
            assert 0.5 < ratio < dispatch.INACCURATE, (pattern, on)
        assert dispatch.inaccurate_ops(on, set(ops)) == {}
    else:
        assert dispatch.remedy("bfloat16", False, flags) == ""
        for pattern, ratio in on.numerics.items():
            assert ratio == pytest.approx(off.numerics[pattern], rel=0.05), (pattern, on, off)


# float16 under -m heavy (the patterns are the same graphs in either half type)
@pytest.mark.parametrize("dtype", [pytest.param("float16", marks=pytest.mark.heavy), "bfloat16"])
def test_every_pattern_runs_its_op_as_tensorflow_runs_it(dtype):
    """What is timed is the pattern: a run's trace has a node of the op type checked (or the
    kernel the remapper fused it into), not only the fetch (a NoOp target grouping the
    pattern was pruned by Grappler, and the ratios were of empty runs). What the numerics
    check compares is finite (a batch norm gradient with a negative variance was NaN)."""
    tf1 = tf.compat.v1
    with tf.Graph().as_default():
        patterns, f32 = dispatch._patterns(tf, dtype)  # pylint: disable=protected-access
    for pattern in dispatch.PATTERNS:
        graph, init, target, out = dispatch.pattern_graph(tf, patterns[pattern], f32,
                                                          tf.as_dtype(dtype))
        with tf1.Session(graph=graph) as session:
            session.run(init)
            metadata = tf1.RunMetadata()
            session.run(target, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                        run_metadata=metadata)
            # the whole output is finite: its error ratio means something
            assert np.isfinite(session.run(out).astype(np.float32)).all(), pattern
        ran = " ".join(n.timeline_label for d in metadata.step_stats.dev_stats
                       for n in d.node_stats)
        op = dispatch.op_of(pattern)
        kernels = {"MatMul": "MatMul", "Conv2D": "Conv2D", "Relu": "Relu", "Softmax": "Softmax",
                   "FusedBatchNormV3": "FusedBatchNorm", "AddV2": "Add"}.get(op, op)
        assert kernels in ran, (pattern, ran[:2000])


def test_switched_off_nothing_is_checked_and_a_bad_value_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_MPT_OP_COSTS", _table(tmp_path))
    monkeypatch.setenv("TF_MPT_DISPATCH_CHECK", "0")
    result = tf_mpt.rewrite_graph_def(_training_graph().as_graph_def(), dtype="float16",
                                      target="here", fetches=["loss", "train"])
    assert result.report.dispatch_kept == {}
    # the graph of the same table without ratios: nothing kept for a slow kernel
    monkeypatch.setenv("TF_MPT_OP_COSTS", _table(tmp_path / "..", ratios={}))
    plain = tf_mpt.rewrite_graph_def(_training_graph().as_graph_def(), dtype="float16",
                                     target="here", fetches=["loss", "train"])
    assert result.graph_def == plain.graph_def
    started = []
    monkeypatch.setattr(dispatch, "_spawn", lambda *args: started.append(args))
    monkeypatch.setattr(dispatch, "_EARLY", {})
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    dispatch.start_early(tf_mpt.Config.from_env(os.environ), "float16")
    assert started == []
    with pytest.raises(ValueError, match="TF_MPT_DISPATCH_CHECK.*'sometimes'"):
        tf_mpt.Config.from_env({"TF_MPT_DISPATCH_CHECK": "sometimes"})


class _FakeProc:
    """A child that never runs: poll() None until killed."""

    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode

    def kill(self):
        self.returncode = -9

    def wait(self, timeout=None):
        return self.returncode


@pytest.fixture
def launched(monkeypatch):
    """start_beside_import's children recorded, not run: [(command, env)]; no GPU device."""
    children = []

    def popen(command, env=None, **kwargs):
        children.append((command, env))
        return _FakeProc()
    monkeypatch.setattr(dispatch.subprocess, "Popen", popen)
    monkeypatch.setattr(dispatch, "_STARTED", {})
    monkeypatch.setattr(dispatch, "_EARLY", {})
    monkeypatch.setattr(_cpu, "gpu_device_present", lambda: False)
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    return children


def _switched_on(tmp_path, **extra):
    return tf_mpt.Config.from_env(dict(dict(TF_MPT_ENABLE="1", TF_MPT_DTYPE="bfloat16",
                                            TF_MPT_CACHE_DIR=str(tmp_path)), **extra))


def test_the_check_starts_beside_tensorflows_import_where_its_graphs_run_here(
        tmp_path, launched, monkeypatch):
    """The child of the dtype the automatic path will use, told this CPU's cache directory
    and identity (it keys the file by its own TensorFlow's version and oneDNN), in the
    script's environment (no TF_MPT_ switch: never rewritten; oneDNN as the script's
    TensorFlow will read it)."""
    monkeypatch.setenv("TF_MPT_ENABLE", "1")
    config = _switched_on(tmp_path)
    dispatch.start_beside_import(config)
    ((command, env),) = launched
    assert command[command.index("--dtype") + 1] == "bfloat16"
    assert command[command.index("--cache-dir") + 1] == str(tmp_path)
    assert command[command.index("--machine") + 1] == _cpu.identity(config)
    assert "--cache" not in command
    assert not any(name.startswith("TF_MPT_") and name != "TF_MPT_CACHE_DIR" for name in env)
    assert env.get("TF_ENABLE_ONEDNN_OPTS") == os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    dispatch.start_beside_import(config)  # once per dtype
    assert len(launched) == 1


@pytest.mark.parametrize("why, extra", [
    ("a table stands in for this CPU", {"TF_MPT_OP_COSTS": "table.json"}),
    ("the check is off", {"TF_MPT_DISPATCH_CHECK": "0"}),
    ("no graph rewrite (loss scaling alone)", {"TF_MPT_GRAPH_REWRITE": "0"}),
    ("auto without native bfloat16", {"TF_MPT_DTYPE": "auto", "TF_MPT_CPU_FLAGS": "avx2"}),
    ("a GPU device", {})])
def test_the_check_does_not_start_beside_the_import_where_that_is_unsure(
        tmp_path, launched, monkeypatch, why, extra):
    if why == "a GPU device":
        monkeypatch.setattr(_cpu, "gpu_device_present", lambda: True)
    config = _switched_on(tmp_path, **extra)
    dispatch.start_beside_import(config)
    assert launched == [], why


def test_the_automatic_path_adopts_the_child_or_stops_it(tmp_path, launched, monkeypatch):
    spawned = []
    monkeypatch.setattr(dispatch, "_spawn", lambda dtype, ops, cache: spawned.append(cache))
    config = _switched_on(tmp_path)
    dispatch.start_beside_import(config)
    started = dispatch._STARTED["bfloat16"]  # pylint: disable=protected-access
    dispatch.start_early(config, "bfloat16")
    # pylint: disable=protected-access
    assert dispatch._EARLY["bfloat16"] is started and spawned == []
    assert started.onednn == dispatch.onednn_on() and started.proc.poll() is None
    # started for another cache directory (the script changed TF_MPT_CACHE_DIR): stopped,
    # and a child of the right one started
    monkeypatch.setattr(dispatch, "_EARLY", {})
    dispatch.start_beside_import(config)
    other = dispatch._STARTED["bfloat16"]  # pylint: disable=protected-access
    dispatch.start_early(_switched_on(tmp_path / "elsewhere"), "bfloat16")
    assert other.proc.poll() == -9 and not os.path.exists(other.directory)
    assert len(spawned) == 1 and spawned[0].startswith(str(tmp_path / "elsewhere"))
    # the automatic path found a GPU (or no half type): stop_started ends what is left
    dispatch.start_beside_import(_switched_on(tmp_path, TF_MPT_DTYPE="float16"))
    left = dispatch._STARTED["float16"]  # pylint: disable=protected-access
    dispatch.stop_started()
    assert left.proc.poll() == -9 and dispatch._STARTED == {}  # pylint: disable=protected-access


def test_a_child_running_other_kernels_than_the_script_is_not_read(tmp_path):
    """The script set TF_ENABLE_ONEDNN_OPTS itself before importing TensorFlow: the child
    started beside the import runs the other kernels; its ratios are not this process's."""
    early = dispatch._Early(_FakeProc(), str(tmp_path))  # pylint: disable=protected-access
    early.onednn = True
    with open(early.out, "w") as f:
        json.dump({"onednn": True, "dispatch": {"MatMul": 1.5}, "numerics": {}}, f)
    assert early.wait_for(["MatMul"], timeout=5) == dispatch.Ratios({"MatMul": 1.5}, {})
    with open(early.out, "w") as f:
        json.dump({"onednn": False, "dispatch": {"MatMul": 1.5}, "numerics": {}}, f)
    assert early.done() == dispatch.Ratios()
    assert early.wait_for(["MatMul"], timeout=5) == dispatch.Ratios()
    assert early.proc.poll() == -9  # stopped: the rewrite measures in a child of its own


@pytest.mark.measures_this_cpu
def test_the_child_reads_this_cpus_cache_and_measures_only_what_it_lacks(tmp_path,
                                                                         monkeypatch):
    machine = "a CPU: avx512_bf16"
    cache = dispatch._cache_file(  # pylint: disable=protected-access
        str(tmp_path), machine, "bfloat16", dispatch.onednn_on())
    lacking = "Relu"
    known = dispatch.Ratios({p: 1.25 for p in dispatch.PATTERNS if p != lacking},
                            {p: 2.0 for p in dispatch.PATTERNS if p != lacking})
    with open(cache, "w") as f:
        f.write(known.to_json())
    built = []
    patterns = dispatch._patterns  # pylint: disable=protected-access

    def recorded(tf, dtype):
        found, f32 = patterns(tf, dtype)
        for name, (shapes, build) in list(found.items()):
            found[name] = (shapes, lambda held, name=name, build=build: (
                built.append(name), build(held))[1])
        return found, f32
    monkeypatch.setattr(dispatch, "_patterns", recorded)
    out = str(tmp_path / "run" / "dispatch.json")
    os.makedirs(os.path.dirname(out))
    dispatch._main([  # pylint: disable=protected-access
        "--dtype", "bfloat16", "--out", out, "--cache-dir", str(tmp_path), "--machine", machine])
    assert built == [lacking, lacking]  # float32 and bfloat16, nothing else
    with open(out) as f:
        written = json.load(f)
    assert written["onednn"] == dispatch.onednn_on()
    measured = dispatch.Ratios.from_json(written)
    assert set(measured.dispatch) == set(dispatch.PATTERNS) and measured.dispatch[lacking] > 0
    assert {p: r for p, r in measured.dispatch.items() if p != lacking} == known.dispatch
    # the cache now holds it too
    assert dispatch._read(cache).dispatch == measured.dispatch  # pylint: disable=protected-access
    # the parent's path for the same machine and directory is the child's
    config = tf_mpt.Config.from_env({"TF_MPT_CACHE_DIR": str(tmp_path)})
    monkeypatch.setattr(_cpu, "identity", lambda config=None: machine)
    assert dispatch._cache_path(config, "bfloat16") == cache  # pylint: disable=protected-access


def test_a_cache_holding_every_pattern_starts_no_child_beside_the_import(
        tmp_path, launched, monkeypatch):
    """The runs after the first: read without importing TensorFlow (its version from the
    installed distribution), for oneDNN on or off; one pattern missing starts the child."""
    config = _switched_on(tmp_path)
    machine = _cpu.identity(config)
    cache = dispatch._cache_file(  # pylint: disable=protected-access
        str(tmp_path), machine, "bfloat16", not dispatch.onednn_on())
    everything = {p: 1.0 for p in dispatch.PATTERNS}
    with open(cache, "w") as f:
        f.write(dispatch.Ratios(everything, everything).to_json())
    dispatch.start_beside_import(config)
    assert launched == []
    partial = {p: 1.0 for p in dispatch.PATTERNS if p != "Relu"}
    with open(cache, "w") as f:
        f.write(dispatch.Ratios(partial, partial).to_json())
    dispatch.start_beside_import(config)
    assert len(launched) == 1


@pytest.mark.parametrize("dtype, compiling, in_place", [
    ("bfloat16", True, True), ("bfloat16", False, False), ("float16", True, False)])
def test_a_tf1_script_compiling_its_optimizer_checks_bfloat16_in_its_own_process(
        tmp_path, launched, monkeypatch, dtype, compiling, in_place):
    """Where the Grappler optimizer compiles beside TensorFlow's import (a TF1 script's first
    run), the compiler holds the second core: no child starts for bfloat16 (its TensorFlow
    import was the largest part of the first run's overhead), neither beside the import nor
    when the automatic path is switched on; the Sessions check it in this process. float16
    keeps its child (a kernel on oneDNN's reference path can be killed there)."""
    monkeypatch.setattr(dispatch, "_HERE", set())
    spawned = []
    monkeypatch.setattr(dispatch, "_spawn", lambda dtype, ops, cache: spawned.append(dtype))
    config = _switched_on(tmp_path, TF_MPT_DTYPE=dtype)
    dispatch.start_beside_import(config, compiling=compiling)
    dispatch.start_early(config, dtype)
    assert (dispatch._HERE == {dtype}) is in_place  # pylint: disable=protected-access
    assert (launched == [] and spawned == []) is in_place
    assert len(launched) == (0 if in_place else 1) and spawned == []  # (adopted)


class _Measured:
    """dispatch.measure injected: records (dtype, ops, session_config, bypassing) and returns
    ratio 1.0 for the patterns of `ops`."""

    def __init__(self):
        self.calls = []

    def __call__(self, dtype, ops, done=None, wanted=None, known=None, session_config=None):
        from tf_mpt._process import state
        self.calls.append((dtype, list(ops), session_config, state.bypassing()))
        found = {p: 1.0 for p in dispatch.PATTERNS if dispatch.op_of(p) in ops}
        return (known or dispatch.Ratios()).merged(dispatch.Ratios(found, found))


def test_a_session_checks_its_graphs_op_types_in_place_once_with_the_users_threads(
        tmp_path, monkeypatch):
    """measure_in_place: the patterns of the op types the graph holds that the cache lacks,
    measured with the thread settings of the user's ConfigProto only (TensorFlow sizes its
    process-wide pools by the first Session's), tf_mpt's patches bypassed, cached; nothing
    again for the same graph; only the new op types once the graph grows."""
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    monkeypatch.setattr(dispatch, "_HERE", {"bfloat16"})
    measured = _Measured()
    monkeypatch.setattr(dispatch, "measure", measured)
    config = tf_mpt.Config.from_env(dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path)))
    path = dispatch._cache_path(config, "bfloat16")  # pylint: disable=protected-access
    with open(path, "w") as f:  # an earlier run measured the MatMul patterns
        matmuls = {p: 2.0 for p in dispatch.PATTERNS if dispatch.op_of(p) == "MatMul"}
        f.write(dispatch.Ratios(matmuls, matmuls).to_json())
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8])
        h = tf.nn.relu(tf.matmul(x, tf.ones([8, 8])))
    user = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2,
                           log_device_placement=True, allow_soft_placement=True)
    dispatch.measure_in_place(config, "bfloat16", graph, user)
    ((dtype, ops, threads, bypassing),) = measured.calls
    assert (dtype, ops, bypassing) == ("bfloat16", ["Relu"], True)
    assert (threads.intra_op_parallelism_threads, threads.inter_op_parallelism_threads) == (1, 2)
    assert not threads.log_device_placement and not threads.allow_soft_placement
    cached = dispatch._read(path)  # pylint: disable=protected-access
    assert cached.dispatch["Relu"] == 1.0 and cached.dispatch["MatMul+BiasAdd"] == 2.0
    dispatch.measure_in_place(config, "bfloat16", graph)  # the same graph: nothing
    assert len(measured.calls) == 1
    with graph.as_default():
        tf.tanh(h) + h  # pylint: disable=expression-not-assigned
    dispatch.measure_in_place(config, "bfloat16", graph)
    assert [call[1] for call in measured.calls[1:]] == [["AddV2", "Tanh"]]
    # and the rewrite inside the Session's graph optimisation reads them, measuring nothing
    monkeypatch.setattr(dispatch, "_in_child", lambda dtype, ops: pytest.fail("measured"))
    found = dispatch.ratios(config, "bfloat16", {"MatMul", "Relu", "Tanh", "AddV2"})
    assert found.dispatch["Tanh"] == 1.0 and found.dispatch["MatMul"] == 2.0


@pytest.mark.parametrize("why", ["not this process's", "a table", "check off"])
def test_no_check_in_place_where_it_is_not_this_processs(tmp_path, monkeypatch, why):
    measured = _Measured()
    monkeypatch.setattr(dispatch, "measure", measured)
    monkeypatch.setattr(dispatch, "_HERE", set() if why == "not this process's" else
                        {"bfloat16"})
    env = dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path))
    if why != "a table":
        env.pop("TF_MPT_OP_COSTS")
    if why == "check off":
        env["TF_MPT_DISPATCH_CHECK"] = "0"
    graph = tf.Graph()
    with graph.as_default():
        tf.nn.relu(tf.ones([2]))
    dispatch.measure_in_place(tf_mpt.Config.from_env(env), "bfloat16", graph)
    assert measured.calls == []


def test_a_failed_check_in_place_is_left_to_the_rewrites_child(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    monkeypatch.setattr(dispatch, "_HERE", {"bfloat16"})

    def failing(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "out of memory")
    monkeypatch.setattr(dispatch, "measure", failing)
    config = tf_mpt.Config.from_env(dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path)))
    graph = tf.Graph()
    with graph.as_default():
        tf.nn.relu(tf.ones([2]))
    with caplog.at_level(logging.DEBUG, logger="tf_mpt"):
        dispatch.measure_in_place(config, "bfloat16", graph)
    assert "could not check bfloat16 kernels in this process (ResourceExhaustedError" in \
        caplog.text
    assert dispatch._read(dispatch._cache_path(config, "bfloat16")) == \
        dispatch.Ratios()  # pylint: disable=protected-access
    in_child = []
    monkeypatch.setattr(dispatch, "_in_child", lambda dtype, ops: in_child.append(ops) or {})
    dispatch.ratios(config, "bfloat16", {"Relu"})
    assert in_child == [["Relu"]]


def test_a_session_checks_before_it_waits_for_the_compiler(monkeypatch):
    """The first Session's check runs while the optimizer may still compile (the Session
    waits for it in _native_ready), never inside the Session's graph optimisation."""
    from tf_mpt.automatic import sessions, state
    order = []
    settings = state.Settings(config=tf_mpt.Config(), dtype="bfloat16", rewrite=True,
                              loss_scaling=False, loss_scale="dynamic")
    monkeypatch.setattr(state.STATE, "settings", settings)
    monkeypatch.setattr(dispatch, "measure_in_place",
                        lambda config, dtype, graph, user=None: order.append(("check", user)))
    monkeypatch.setattr(sessions, "_native_ready", lambda: order.append("wait") and False)
    user = tf1.ConfigProto(intra_op_parallelism_threads=1)
    sessions._session_init(lambda *args: order.append("init"), object(), "", tf.Graph(), user)
    assert order == [("check", user), "wait", "init"]


@pytest.mark.measures_this_cpu
def test_the_check_in_place_measures_real_kernels_and_leaves_the_threads_as_asked(
        tmp_path, monkeypatch):
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    monkeypatch.setattr(dispatch, "_HERE", {"bfloat16"})
    config = tf_mpt.Config.from_env(dict(os.environ, TF_MPT_CACHE_DIR=str(tmp_path)))
    graph = tf.Graph()
    with graph.as_default():
        tf.nn.relu(tf.ones([2]))
    dispatch.measure_in_place(config, "bfloat16", graph,
                              tf1.ConfigProto(intra_op_parallelism_threads=1))
    found = dispatch._read(dispatch._cache_path(config, "bfloat16"))  # pylint: disable=W0212
    assert set(found.dispatch) == {"Relu"} and found.dispatch["Relu"] > 0
    assert found.numerics == {"Relu": 0.0}  # a Relu of bfloat16 values is exact in bfloat16


def test_gpu_device_files_are_what_says_a_gpu_may_be_there(tmp_path):
    (tmp_path / "nvidia0").write_text("")
    assert _cpu.gpu_device_present((str(tmp_path / "nvidia[0-9]*"),))
    assert _cpu.gpu_device_present((str(tmp_path / "nvidia0"),))
    assert not _cpu.gpu_device_present((str(tmp_path / "dxg"), str(tmp_path / "kfd[0-9]*")))


def _timed(monkeypatch, tmp_path, table):
    """Graph timing on (budget 5 s, TF_MPT_MEMORY=any: speed alone) with `table` and an
    injected clock and sandbox: each half node saves time, a half Conv2DBackpropFilter costs
    much more (a slow kernel). Returns the fakes (their `runs`: every GraphDef run)."""
    from support import fake_timing  # pylint: disable=import-outside-toplevel
    monkeypatch.setenv("TF_MPT_CPU_FLAGS", SKYLAKE_FLAGS)
    monkeypatch.setattr(dispatch, "onednn_on", lambda: False)
    monkeypatch.setenv("TF_MPT_OP_COSTS", table)
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "5")
    monkeypatch.setenv("TF_MPT_MEMORY", "any")
    monkeypatch.setenv("TF_MPT_CACHE_DIR", str(tmp_path / "cache"))
    fakes = fake_timing.install(monkeypatch)

    def half_nodes(graph_def):
        return sum(1 for n in graph_def.node if n.op != "Cast" and
                   any(v.type == BF16 for v in n.attr.values()))
    fakes.cost = lambda g, i: 1e-3 - 1e-5 * half_nodes(g) + \
        (0.5e-3 if _half(g, "Conv2DBackpropFilter", BF16) else 0.0)
    return fakes


def test_the_rules_colouring_with_the_flagged_op_types_float32_is_a_candidate(tmp_path,
                                                                             monkeypatch):
    """Graph timing (an injected clock and sandbox) where the dispatch check flagged
    Conv2DBackpropFilter's half kernel slow here: the op lists' colouring (target rules
    applies no check of this CPU) runs it half; a candidate of its own, 'rules checked', is
    that colouring with the flagged op types float32. Faster here than every other, it is
    kept: its graph holds the flagged op float32 (the reason says why), its report is its
    graph's, and a second rewrite replays it from the cache, the same bytes."""
    from support import report_check  # pylint: disable=import-outside-toplevel
    from tf_mpt.choose import candidates, recipes  # pylint: disable=import-outside-toplevel
    fakes = _timed(monkeypatch, tmp_path,
                   _table(tmp_path, "bfloat16", {"Conv2DBackpropFilter": 195.0}))
    graph_def = _training_graph().as_graph_def()

    def rewrite():
        return tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", target="here",
                                        fetches=["loss", "train"])
    result = rewrite()
    verdict = result.report.verdict
    assert candidates.CHECKED in verdict.times, verdict.describe()
    assert verdict.pick == candidates.CHECKED, verdict.describe()
    rules = [g for g in fakes.runs if _half(g, "Conv2DBackpropFilter", BF16)]
    assert rules  # (the op lists' colouring, timed beside it, runs the flagged op half)
    gd = result.graph_def
    assert _of(gd, "Conv2DBackpropFilter") and not _half(gd, "Conv2DBackpropFilter", BF16)
    assert _half(gd, "Conv2D", BF16) and _half(gd, "Relu", BF16)  # (the op lists' elsewhere)
    assert _only_decision(result, "Conv2DBackpropFilter").reason == recipes.CHECKED_WHY
    report_check.assert_report_is_the_graphs(result)
    again = rewrite()
    assert again.report.verdict.source == "cached" and again.graph_def == gd


def test_no_candidate_runs_an_op_type_the_numerics_check_flagged_half(tmp_path, monkeypatch):
    """Where the numerics check flagged Conv2DBackpropFilter's half kernel (its error 13.9x
    bfloat16 rounding here), no candidate timed runs it half, the op lists' and contractions
    only included (timing sees speed, not error): whichever is kept holds it float32."""
    fakes = _timed(monkeypatch, tmp_path, _table(tmp_path, "bfloat16", {},
                                                 {"Conv2DBackpropFilter": 13.9}))
    fakes.cost = lambda g, i: 1e-3 - 1e-5 * sum(1 for n in g.node if n.op == "Conv2D" and
                                                n.attr["T"].type == BF16)
    result = tf_mpt.rewrite_graph_def(_training_graph().as_graph_def(), dtype="bfloat16",
                                      target="here", fetches=["loss", "train"])
    verdict = result.report.verdict
    assert verdict.timed and len(verdict.times) >= 3, verdict.describe()
    assert len(fakes.runs) > 6 and \
        not [g for g in fakes.runs if _half(g, "Conv2DBackpropFilter", BF16)]
    assert any(_half(g, "Conv2D", BF16) for g in fakes.runs)  # (the rest half as the lists say)
    assert not _half(result.graph_def, "Conv2DBackpropFilter", BF16)
