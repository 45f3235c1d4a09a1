"""Measured op costs: the table's interpolation, a bad table's error, node specs, and the
measurement itself (a child process, cached; a failure turns the model off with a warning)."""

import base64
import json
import logging
import re
import signal

import numpy as np
import pytest
import tensorflow as tf

from tf_mpt import _cpu
from tf_mpt._process import state as _state
from tf_mpt import config as _config
from tf_mpt.costs import op_costs


def _table(**times):
    points = {"Relu": ((1000, 1e-6), (2000, 3e-6), (4000, 5e-6))}
    points.update(times)
    return op_costs.OpCosts(dtype="bfloat16", source="test", float32=points,
                            half={"Relu": ((1000, 2e-6), (4000, 8e-6))},
                            cast=((1000, 1e-6), (2000, 2e-6)))


def test_times_interpolate_between_points_and_extend_the_last_slope():
    costs = _table()
    assert costs.time("Relu", 500, False) == 1e-6  # below the first point: its time
    assert costs.time("Relu", 1500, False) == pytest.approx(2e-6)
    assert costs.time("Relu", 3000, False) == pytest.approx(4e-6)
    assert costs.time("Relu", 6000, False) == pytest.approx(7e-6)  # slope 1e-9 / element
    assert costs.half_minus_float32("Relu", 4000) == pytest.approx(3e-6)
    assert costs.cast_time(3000) == pytest.approx(3e-6)
    assert costs.time("Sigmoid", 1000, True) is None and not costs.knows("Sigmoid")
    assert costs.time("Reshape", 10 ** 9, True) == 0.0  # moves no data: free


def test_a_table_round_trips_through_json():
    costs = _table()
    again = op_costs.OpCosts.from_json(costs.to_json())
    assert again == costs


@pytest.mark.parametrize("text, message", [
    ("not json", "is not a readable op-cost table .*JSONDecodeError"),
    ('{"dtype": "bfloat16", "source": "x", "float32": {"Relu": [[1, 2]]}, "half": {}, '
     '"cast": [[1, 1], [2, 2]]}', "is not a readable op-cost table .*need two points or more"),
])
def test_a_bad_table_names_the_variable_the_file_and_the_fix(tmp_path, text, message):
    path = tmp_path / "table.json"
    path.write_text(text)
    config = _config.Config.from_env({_config.TF_MPT_OP_COSTS: str(path)})
    with pytest.raises(ValueError, match=rf"the cost table '{path}' \(TF_MPT_TARGET or "
                       rf"TF_MPT_OP_COSTS\) {message}"):
        op_costs.costs_for(config, "bfloat16")
    with pytest.raises(ValueError, match="write one with `tf-mpt measure --out FILE` on the "
                       "target machine"):
        op_costs.costs_for(config, "bfloat16")


def _conv_backprop_input():
    graph = tf.Graph()
    with graph.as_default():
        kernel = tf.constant(np.zeros([3, 3, 8, 16], np.float32))
        grad = tf.compat.v1.placeholder(tf.float32, [4, 8, 8, 16])
        tf.raw_ops.Conv2DBackpropInput(input_sizes=[4, 16, 16, 8], filter=kernel,
                                       out_backprop=grad, strides=[1, 2, 2, 1],
                                       padding="SAME", name="dx")
    return graph.as_graph_def()


def test_a_node_spec_holds_what_its_kernel_time_depends_on():
    node = next(n for n in _conv_backprop_input().node if n.name == "dx")
    key = op_costs.node_spec(node, [(4,), (3, 3, 8, 16), (4, 8, 8, 16)], (4, 16, 16, 8),
                             [True, True, False])
    spec = json.loads(key)
    assert spec["op"] == "Conv2DBackpropInput"
    assert spec["inputs"] == [["int", [4, 16, 16, 8], True], ["float", [3, 3, 8, 16], True],
                              ["float", [4, 8, 8, 16], False]]
    assert sorted(spec["attrs"]) == ["data_format", "dilations", "explicit_paddings",
                                     "padding", "strides"]
    assert op_costs.node_spec(node, [(4,), (3, 3, 8, 16), (-1, 8, 8, 16)], (4, 16, 16, 8),
                              [True, True, False]) is None  # a size unknown: not timed
    other = json.loads(key)
    other["attrs"].pop("strides")
    assert json.dumps(other, sort_keys=True) != key


# every op type timed (~13 s on a Zen 4): under -m heavy; the probe child in the default run:
# test_one_child_process_measures_everything_a_process_asks (one op type and one node)
@pytest.mark.heavy
@pytest.mark.measures_this_cpu
def test_this_cpu_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch, caplog):
    config = _config.Config.from_env({_config.TF_MPT_CACHE_DIR: str(tmp_path)})
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
    with caplog.at_level(logging.INFO, logger="tf_mpt"):
        costs = op_costs.costs_for(config, "bfloat16")
    assert costs is not None and costs.source.startswith("measured on ")
    assert re.search(r"is measuring every op type in float32 and bfloat16 on this CPU",
                     caplog.text), caplog.text
    for op in ("MatMul", "Conv2D", "Relu", "Sigmoid", "FusedBatchNormV3", "Swish"):
        assert costs.knows(op) and costs.time(op, 10 ** 6, True) > 0
    assert len(costs.cast) == 4
    # a node at its own shapes: timed in a second child, then cached
    graph = _conv_backprop_input()
    node = next(n for n in graph.node if n.name == "dx")
    key = op_costs.node_spec(node, [(4,), (3, 3, 8, 16), (4, 8, 8, 16)], (4, 16, 16, 8),
                             [True, True, False])
    assert costs.node_seconds({key}) == {}  # reading never measures
    costs.measure_nodes({key})
    times = costs.node_seconds({key})
    assert set(times) == {key} and all(t > 0 for t in times[key])

    def no_child(*args, **kwargs):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(op_costs, "_in_child", no_child)
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
    again = op_costs.costs_for(config, "bfloat16")
    assert again == costs
    assert again.node_seconds({key}) == times


@pytest.mark.measures_this_cpu
def test_a_failed_measurement_turns_the_model_off_with_one_warning(tmp_path, monkeypatch,
                                                                   caplog):
    config = _config.Config.from_env({_config.TF_MPT_CACHE_DIR: str(tmp_path)})
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
    monkeypatch.setattr(_state.STATE, "probe_server", None)  # a new child: it fails
    monkeypatch.setattr(op_costs.sys, "executable", "false")
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        assert op_costs.costs_for(config, "bfloat16") is None
        assert op_costs.costs_for(config, "bfloat16") is None  # remembered: tried once
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "could not measure op costs on this CPU" in warnings[0].getMessage()
    assert "set TF_MPT_OP_COSTS to a table" in warnings[0].getMessage()


def test_every_copy_of_a_node_probe_chain_runs_as_its_own_kernel():
    """The probe Session runs without Grappler, whose optimizers would merge the chain's
    identical copies into one kernel and drop its control edges (they did: one MatMul ran)."""
    from tf_mpt.costs import probes  # pylint: disable=import-outside-toplevel
    spec = {"op": "MatMul", "attrs": {}, "inputs": [["float", [64, 32], False],
                                                   ["float", [32, 16], True]]}
    run = probes._NodeRun(tf.compat.v1, probes._node_graph(tf, spec, tf.float32))
    try:
        kernels = probes._traced_run(tf.compat.v1, run.session, run.probe, run.feeds)
        assert {f"probe_{k}" for k in range(probes.CHAIN)} <= set(kernels)
        assert run.traced_seconds() > 0
    finally:
        run.session.close()


def test_a_node_probe_times_a_chain_of_copies_alternates_the_dtypes_keeps_the_fastest(
        monkeypatch):
    """...a convolution's runs back to back, the runs of matrix products going round them
    (each node's runs spread over the measurement)."""
    from tf_mpt.costs import probes  # pylint: disable=import-outside-toplevel
    spec = {"op": "MatMul", "attrs": {}, "inputs": [["float", [8, 4], False],
                                                   ["float", [4, 2], True]]}
    graph_def = probes._node_graph(tf, spec, tf.bfloat16)
    nodes = {n.name: n for n in graph_def.node}
    assert probes.CHAIN >= 2 and nodes["probe_0"].input[:] == ["input_0", "input_1"]
    for k in range(1, probes.CHAIN):  # each copy waits for the one before
        assert nodes[f"probe_{k}"].input[:] == ["input_0", "input_1", f"^probe_{k - 1}"]
    assert {nodes[f"probe_{k}"].attr["T"].type for k in range(probes.CHAIN)} == {tf.bfloat16}
    assert sorted(nodes) == ["input_0", "input_1"] + [f"probe_{k}" for k in range(probes.CHAIN)]

    order = []

    class Recorded:
        def __init__(self, tf1, graph_def):
            del tf1
            probe = next(n for n in graph_def.node if n.name == "probe_0")
            transposed = "transpose_a" in probe.attr and probe.attr["transpose_a"].b
            self.label = (tf.as_dtype(probe.attr["T"].type).name, probe.op, transposed)
            self.session = self

        def traced_seconds(self):  # each run slower than the one before: the first counts
            order.append(self.label)
            runs = order.count(self.label)
            return (2e-6 if self.label[0] == "float32" else 1e-6) * runs

        def close(self):
            order.append("closed")

    monkeypatch.setattr(probes, "_NodeRun", Recorded)
    key = json.dumps(spec, sort_keys=True)
    other = json.dumps(dict(spec, attrs={"transpose_a": base64.b64encode(
        tf.compat.v1.AttrValue(b=True).SerializeToString()).decode()}), sort_keys=True)
    conv = json.dumps({"op": "Conv2D", "attrs": {}, "inputs": [
        ["float", [1, 4, 4, 2], False], ["float", [1, 1, 2, 2], True]]}, sort_keys=True)
    assert probes.time_nodes([key, conv, other]) == {
        key: [2e-6, 1e-6], other: [2e-6, 1e-6], conv: [2e-6, 1e-6]}
    matmuls = [("float32", "MatMul", False), ("bfloat16", "MatMul", False),
               ("float32", "MatMul", True), ("bfloat16", "MatMul", True)]
    assert order == ([("float32", "Conv2D", False), ("bfloat16", "Conv2D", False)]
                     * probes.NODE_RUNS + ["closed"] * 2
                     + matmuls * probes.NODE_RUNS + ["closed"] * 4)


# --- the target as one value: measuring apart from deciding ---------------------------------

def _here(tmp_path, flags=None):
    """A Config for the target `here` with this CPU's cache in tmp_path (flags: injected)."""
    env = {_config.TF_MPT_CACHE_DIR: str(tmp_path), _config.TF_MPT_TARGET: "here"}
    if flags is not None:
        env[_config.TF_MPT_CPU_FLAGS] = flags
    return _config.Config.from_env(env)


def _seed_cache(tmp_path, config, dtype="bfloat16"):
    """This CPU's op table cached as if measured before (the suite's Zen 4 table), under the
    key of the CPU `config` stands for."""
    from conftest import OP_COSTS_TABLE  # pylint: disable=import-outside-toplevel
    with open(OP_COSTS_TABLE) as f:
        (table,) = [t for t in json.load(f) if t["dtype"] == dtype]
    key = op_costs.cache_key(dtype, _cpu.identity(config))
    (tmp_path / f"op_costs-{dtype}-{key}.json").write_text(json.dumps(table))


def _graph_with_a_function():
    """A MatMul in the graph and one in a tf.function body it calls."""

    @tf.function
    def layer(x, w):
        return tf.nn.relu(tf.matmul(x, w, name="mm_body"))

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 128], name="x")
        w = tf.constant(np.full((128, 128), 0.01, np.float32), name="w")
        h = tf.matmul(x, w, name="mm_main")
        tf.identity(layer(h, w), name="y")
    return graph.as_graph_def(add_shapes=True)


def test_decisions_only_read_the_node_times_one_measuring_step_takes_before(
        tmp_path, monkeypatch):
    """For the target `here`, the matrix products of the graph and of its function bodies
    are timed in one child process before any decision (never from inside the cost model's
    cut), and a second rewrite reads them from the cache."""
    import inspect  # pylint: disable=import-outside-toplevel
    import tf_mpt  # pylint: disable=import-outside-toplevel
    config = _here(tmp_path)
    _seed_cache(tmp_path, config)
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
    calls = []

    def child(directory, dtype, nodes=None, ops=None):
        deciding = [f.function for f in inspect.stack()
                    if f.function == "choose_precision_by_measured_cost"]
        calls.append((sorted(json.loads(n)["op"] for n in nodes), deciding))
        return json.dumps({n: [4e-5, 2e-5] for n in nodes})

    monkeypatch.setattr(op_costs, "_in_child", child)
    result = tf_mpt.rewrite_graph_def(_graph_with_a_function(), dtype="bfloat16",
                                      fetches=["y"], config=config, strict=True)
    assert result.report.target == "here"
    assert calls == [(["MatMul", "MatMul"], [])]  # both graphs' shapes, one step, not deciding
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})  # a new process: the cache
    tf_mpt.rewrite_graph_def(_graph_with_a_function(), dtype="bfloat16", fetches=["y"],
                             config=config, strict=True)
    assert len(calls) == 1


def test_this_cpu_is_one_idea_the_cache_key_follows_injected_flags(tmp_path, monkeypatch):
    """TF_MPT_CPU_FLAGS stands for this CPU in the cache key as in `auto`: a table cached
    for one flag set is found under those flags and not under another's."""
    import tf_mpt  # pylint: disable=import-outside-toplevel
    from tf_mpt import _cpu as cpu  # pylint: disable=import-outside-toplevel
    zen4, cascade = "avx2 avx512f avx512_bf16", "avx2 avx512f avx512_vnni"
    assert "(flags injected): avx512f avx512_bf16" in cpu.identity(_here(tmp_path, zen4))
    keys = {op_costs.cache_key("bfloat16", cpu.identity(_here(tmp_path, f)))
            for f in (zen4, cascade, None)}
    assert len(keys) == 3
    _seed_cache(tmp_path, _here(tmp_path, zen4))
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
    measured = []
    monkeypatch.setattr(op_costs, "_in_child", lambda directory, dtype, nodes=None, ops=None:
                        measured.append(nodes) or json.dumps({n: [] for n in nodes or ()}))
    target = tf_mpt.rewrite.target_for(_here(tmp_path, zen4), "bfloat16")
    assert target.costs is not None and measured == []  # found under the injected flags
    assert target.machine == cpu.identity(_here(tmp_path, zen4))
    assert op_costs.costs_for(_here(tmp_path, cascade), "bfloat16") is None  # not found: measured
    assert measured == [None]  # (the fake measurement wrote no table: the model is off)


def test_a_table_carries_its_fusions_and_the_target_costs_by_them(tmp_path):
    """A table written on a machine whose remapper fuses nothing makes the target's fusions
    empty: a BiasAdd after a MatMul is then its own kernel; an unknown fusion is refused."""
    import tf_mpt  # pylint: disable=import-outside-toplevel
    from tf_mpt.rewrite import graph_view  # pylint: disable=import-outside-toplevel
    from tf_mpt.rewrite.paint import cost  # pylint: disable=import-outside-toplevel
    data = json.loads(_table().to_json())
    assert sorted(data["fusions"]) == sorted(_cpu.REMAPPER_FUSIONS)
    path = tmp_path / "unfused.json"
    path.write_text(json.dumps(dict(data, fusions=[], threads=8)))
    config = _config.Config.from_env({_config.TF_MPT_TARGET: str(path)})
    target = tf_mpt.rewrite.target_for(config, "bfloat16")
    assert target.kind == "table" and target.fusions == frozenset() and target.threads == 8
    assert target.where == "in unfused.json"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        h = tf.matmul(x, tf.ones([16, 16]), name="mm")
        tf.nn.relu(tf.nn.bias_add(h, tf.ones([16]), name="bias"), name="relu")
    view = graph_view.GraphView(graph.as_graph_def())
    assert cost.fusion(view, view.index["bias"]) == "both"
    assert cost.fusion(view, view.index["relu"]) == "both"
    assert cost.fusion(view, view.index["bias"], target.fusions) is None
    assert cost.fusion(view, view.index["relu"], target.fusions) is None
    path.write_text(json.dumps(dict(data, fusions=["swish", "winograd"])))
    with pytest.raises(ValueError, match=r"unknown fusions \['winograd'\]"):
        tf_mpt.rewrite.target_for(config, "bfloat16")


def _dense_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 128], name="x")
        h = tf.matmul(x, tf.constant(np.full((128, 64), 0.01, np.float32)), name="mm")
        tf.identity(tf.nn.relu(h), name="y")
    return graph.as_graph_def(add_shapes=True)


def _conv_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16, 16, 8], name="x")
        k = tf.constant(np.full((3, 3, 8, 8), 0.01, np.float32))
        h = tf.nn.relu(tf.nn.conv2d(x, k, 1, "SAME", name="conv"))
        tf.identity(tf.nn.max_pool2d(h, 2, 2, "VALID"), name="y")
    return graph.as_graph_def(add_shapes=True)


def test_this_cpu_is_measured_by_the_op_types_each_graph_needs(tmp_path, monkeypatch):
    """The target `here` times only the op types of the graphs it rewrites: the first
    graph's, then those a second graph adds; the cache holds their union, and a new process
    reading it measures nothing."""
    import tf_mpt  # pylint: disable=import-outside-toplevel
    from conftest import OP_COSTS_TABLE  # pylint: disable=import-outside-toplevel
    from tf_mpt.costs import probe_ops  # pylint: disable=import-outside-toplevel
    with open(OP_COSTS_TABLE) as f:
        (table,) = [t for t in json.load(f) if t["dtype"] == "bfloat16"]
    config = _here(tmp_path)
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
    asked = []

    def child(directory, dtype, nodes=None, ops=None):
        if nodes is not None:
            return json.dumps({n: [4e-5, 2e-5] for n in nodes})
        asked.append(sorted(ops))
        part = {k: {op: v for op, v in table[k].items() if op in ops}
                for k in ("float32", "half")}
        return json.dumps(dict(table, probed=sorted(ops), **part))

    monkeypatch.setattr(op_costs, "_in_child", child)
    for graph in (_dense_graph, _conv_graph, _dense_graph):
        report = tf_mpt.rewrite_graph_def(graph(), dtype="bfloat16", fetches=["y"],
                                          config=config, strict=True).report
        assert report.target == "here" and report.error is None
    assert len(asked) == 2 and {"MatMul", "Relu"} <= set(asked[0]) and "Conv2D" not in asked[0]
    assert {"Conv2D", "MaxPool"} <= set(asked[1]) and not {"MatMul", "Relu"} & set(asked[1])
    assert set(asked[0] + asked[1]) <= probe_ops.PROBED_OPS  # never an op no probe times
    path = op_costs._table_path(str(tmp_path), "bfloat16", _cpu.identity(config))
    with open(path) as f:
        cached = op_costs.OpCosts.from_json(f.read())
    assert set(asked[0] + asked[1]) == set(cached.probed)
    assert {"MatMul", "Relu", "Conv2D", "MaxPool"} <= set(cached.half) and cached.cast
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})  # a new process: the cache
    for graph in (_conv_graph, _dense_graph):
        tf_mpt.rewrite_graph_def(graph(), dtype="bfloat16", fetches=["y"], config=config)
    assert len(asked) == 2


@pytest.mark.measures_this_cpu
def test_one_child_process_measures_everything_a_process_asks(tmp_path, monkeypatch):
    """The ProbeServer: one child (one TensorFlow import) answers an op-table request and a
    node request, and is ended when this process discards it (at its exit)."""
    monkeypatch.setattr(_state.STATE, "probe_server", None)
    costs = op_costs.OpCosts.from_json(
        op_costs._in_child(str(tmp_path), "bfloat16", ops=["Relu", "NoSuchOp"]))
    server = _state.STATE.probe_server
    assert set(costs.half) == set(costs.float32) == {"Relu"} and len(costs.cast) == 4
    assert costs.probed == ("NoSuchOp", "Relu")  # asked for: never asked again
    graph = tf.Graph()
    with graph.as_default():
        tf.matmul(tf.compat.v1.placeholder(tf.float32, [64, 64]), tf.ones([64, 64]), name="mm")
    node = next(n for n in graph.as_graph_def().node if n.name == "mm")
    key = op_costs.node_spec(node, [(64, 64), (64, 64)], (64, 64), [False, True])
    times = json.loads(op_costs._in_child(str(tmp_path), "bfloat16", nodes=[key]))
    assert set(times) == {key} and all(t > 0 for t in times[key])
    assert _state.STATE.probe_server is server and server.process.poll() is None
    op_costs._discard_probe_server()
    assert server.process.returncode == -signal.SIGKILL and _state.STATE.probe_server is None


def test_a_probe_server_no_rewrite_used_is_killed_not_waited_for(tmp_path, monkeypatch):
    """Started early (its TensorFlow import under way) and never asked: the script's exit
    ends it at once (SIGKILL) instead of waiting for its import to finish."""
    monkeypatch.setattr(_state.STATE, "probe_server", None)
    server = op_costs._probe_server(str(tmp_path))
    op_costs._discard_probe_server()
    assert server.process.returncode == -signal.SIGKILL
    assert _state.STATE.probe_server is None and server.log.closed


def test_every_named_op_type_has_a_probe():
    from tf_mpt.costs import probe_ops  # pylint: disable=import-outside-toplevel
    from tf_mpt.costs import probes  # pylint: disable=import-outside-toplevel
    with tf.Graph().as_default():
        built = set(probes._probes(tf, tf.bfloat16, 0))
    assert built == probe_ops.PROBED_OPS | set(probe_ops.CASTS)


@pytest.mark.measures_this_cpu
def test_a_measurement_that_exits_says_how_with_its_last_stderr_line(tmp_path, monkeypatch):
    child = tmp_path / "python"
    child.write_text("#!/bin/sh\nread request\necho 'no TensorFlow here' >&2\nexit 3\n")
    child.chmod(0o755)
    monkeypatch.setattr(_state.STATE, "probe_server", None)
    monkeypatch.setattr(op_costs.sys, "executable", str(child))
    with pytest.raises(op_costs.MeasureFailed,
                       match=r"^the measurement exited with 3: no TensorFlow here$"):
        op_costs._in_child(str(tmp_path), "bfloat16", ops=["Relu"])
    assert _state.STATE.probe_server is None  # ended: the next measurement starts another


# under -m heavy: the child that measures what a process asks is in the default run
@pytest.mark.heavy
@pytest.mark.measures_this_cpu
def test_matrix_products_alone_are_measured_at_the_sizes_they_have():
    """A graph needing only BatchMatMulV2 (a Transformer's attention): its probes exist at
    three of the four element sizes; the fourth has nothing to run (it once raised
    IndexError, and the cost model went off for the whole process)."""
    from tf_mpt.costs import probes  # pylint: disable=import-outside-toplevel
    costs = probes.measure("bfloat16", ["BatchMatMulV2"])
    assert len(costs.float32["BatchMatMulV2"]) == len(probes.BATCH_MATMUL_SHAPES)
    assert len(costs.half["BatchMatMulV2"]) == len(probes.BATCH_MATMUL_SHAPES)
    assert costs.probed == ("BatchMatMulV2",)
