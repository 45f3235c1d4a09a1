"""Measured op costs: the table's interpolation, a bad table's error, node specs, and the
measurement itself (a child process, cached; a failure turns the model off with a warning)."""

import base64
import json
import logging

import numpy as np
import pytest
import tensorflow as tf

from tf_mpt import _state
from tf_mpt import config as _config
from tf_mpt.rewrite.paint import op_costs


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


def test_this_cpu_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch, caplog):
    config = _config.Config.from_env({_config.TF_MPT_CACHE_DIR: str(tmp_path)})
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
    with caplog.at_level(logging.INFO, logger="tf_mpt"):
        costs = op_costs.costs_for(config, "bfloat16")
    assert costs is not None and costs.source.startswith("measured on ")
    assert "is measuring float32 and bfloat16 kernel times" in caplog.text
    for op in ("MatMul", "Conv2D", "Relu", "Sigmoid", "FusedBatchNormV3", "Swish"):
        assert costs.knows(op) and costs.time(op, 10 ** 6, True) > 0
    assert len(costs.cast) == 4
    # a node at its own shapes: timed in a second child, then cached
    graph = _conv_backprop_input()
    node = next(n for n in graph.node if n.name == "dx")
    key = op_costs.node_spec(node, [(4,), (3, 3, 8, 16), (4, 8, 8, 16)], (4, 16, 16, 8),
                             [True, True, False])
    times = costs.node_seconds({key})
    assert set(times) == {key} and all(t > 0 for t in times[key])

    def no_child(*args, **kwargs):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(op_costs, "_in_child", no_child)
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
    again = op_costs.costs_for(config, "bfloat16")
    assert again == costs
    assert again.node_seconds({key}) == times


def test_a_failed_measurement_turns_the_model_off_with_one_warning(tmp_path, monkeypatch,
                                                                   caplog):
    config = _config.Config.from_env({_config.TF_MPT_CACHE_DIR: str(tmp_path)})
    monkeypatch.setattr(_state.STATE, "op_cost_tables", {})
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
    from tf_mpt.rewrite.paint import probes  # pylint: disable=import-outside-toplevel
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
    from tf_mpt.rewrite.paint import probes  # pylint: disable=import-outside-toplevel
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
