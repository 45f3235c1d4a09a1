"""Cast placement by minimum cut (tf_mpt/rewrite/paint/cuts.py): clear ops between fixed
float32 and fixed half ends take the colouring whose Casts move the fewest elements; ties
keep the rules' (Grappler's) colours."""

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from support.helpers import added_casts, half_tag, node_map, run, tf1
from support.tolerances import TOLERANCES

HALF = "bfloat16"
_NO_COST_MODEL = tf_mpt.Config.from_env({"TF_MPT_TARGET": "rules"})


def _graph(build):
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph


def _rewrite(graph, fetches):
    # add_shapes: the static shapes the cut weighs Casts by (`_output_shapes` attrs). The
    # cost model off: it keeps these tiny graphs float32 (test_cost_model.py); here the
    # Cast-count cut is under test.
    return tf_mpt.rewrite_graph_def(graph.as_graph_def(add_shapes=True), dtype=HALF,
                                    fetches=fetches, strict=True, config=_NO_COST_MODEL)


def test_a_clear_op_that_grows_its_input_is_kept_float32_and_the_small_tensor_cast():
    """MatMul [64x4] -> Tile x64 [64x256] -> fetch: the rules paint the Tile half and cast its
    16384-element output; the cut casts the MatMul's 256 elements instead."""
    x_value = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)

    def build():
        x = tf1.placeholder(tf.float32, [64, 32], name="x")
        w = tf.constant(np.linspace(-1, 1, 32 * 4, dtype=np.float32).reshape(32, 4), name="w")
        y = tf.matmul(x, w, name="matmul")
        tf.identity(tf.tile(y, [1, 64], name="tile"), name="out")

    graph = _graph(build)
    result = _rewrite(graph, ["out"])
    nodes = node_map(result.graph_def)
    assert nodes["tile"].attr["T"].type == tf.float32.as_datatype_enum
    assert nodes["matmul"].attr["T"].type == tf.as_dtype(HALF).as_datatype_enum
    assert added_casts(result.graph_def) == sorted(
        [f"x-0-CastTo{half_tag(HALF)}-TfMpt", "matmul-0-CastToFp32-TfMpt"])
    reason = result.report.decisions["tile"].reason
    assert reason.startswith("minimum cut: float32 here") and "256 instead of 16384" in reason
    expected = run(graph.as_graph_def(), ["out:0"], {"x:0": x_value})[0]
    got = run(result.graph_def, ["out:0"], {"x:0": x_value})[0]
    np.testing.assert_allclose(got, expected, **TOLERANCES[HALF])


def test_a_tie_keeps_the_rules_colours():
    """MatMul -> Relu -> fetch: one Cast of the same size before or after the Relu; the rules
    paint the Relu half (as Grappler does) and the cut leaves it."""
    def build():
        x = tf1.placeholder(tf.float32, [16, 16], name="x")
        y = tf.matmul(x, x, name="matmul")
        tf.identity(tf.nn.relu(y, name="relu"), name="out")

    result = _rewrite(_graph(build), ["out"])
    decision = result.report.decisions["relu"]
    assert decision.colour == "allow" and not decision.reason.startswith("minimum cut")
    assert len(added_casts(result.graph_def)) == 2


def test_without_static_shapes_the_cut_counts_casts():
    """BidirectionalClearChain with unknown shapes: 2 Casts instead of 3, said in Casts."""
    def build():
        x = tf1.placeholder(tf.float32, None, name="x")
        clr1 = tf.nn.relu(x, name="clr1")
        clr2 = tf.nn.relu(x, name="clr2")
        tf.identity(tf.matmul(clr1, clr1, name="allow1"), name="fetch1")
        tf.shape_n([clr1, clr2], name="clr3")
        tf.identity(tf.nn.relu(clr2, name="clr4"), name="fetch2")

    result = _rewrite(_graph(build), ["fetch1", "fetch2"])
    assert len(added_casts(result.graph_def)) == 2
    assert "1 Cast(s) instead of 2 (shapes not static)" in result.report.decisions["clr1"].reason


def test_the_flow_finds_the_cheapest_colouring_of_random_regions():
    """The max-flow's cut against every colouring of small random regions: tensors with
    several consumers (one Cast per tensor and dtype), vertex costs either way, fixed half
    and float32 ends."""
    import itertools  # pylint: disable=import-outside-toplevel
    from tf_mpt.rewrite.paint import cuts  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 7))
        region = list(range(n))
        fixed_half = n  # and n + 1: a fixed float32 vertex
        tensors, weights = [], []
        for k in range(int(rng.integers(1, 9))):
            producer = int(rng.integers(0, n + 2))
            consumers = sorted({int(c) for c in rng.integers(0, n + 2, rng.integers(1, 4))}
                               - {producer})
            if consumers:
                tensors.append((producer, consumers, k, 0))
                weights.append(float(rng.integers(1, 10)))
        vertex_weights = {v: (float(rng.integers(0, 8)), float(rng.integers(0, 8)))
                          for v in region if rng.random() < 0.7}

        def is_half(c):
            return c == fixed_half

        best, half = cuts._minimum_cut(region, tensors, weights, is_half, vertex_weights)
        brute = min(
            cuts._cost_of(tensors, weights,
                          lambda c, h=set(choice): c in h or c == fixed_half, vertex_weights)
            for r in range(n + 1) for choice in itertools.combinations(region, r))
        assert best == pytest.approx(brute)
        found = cuts._cost_of(tensors, weights, lambda c: c in half or c == fixed_half,
                              vertex_weights)
        assert found == pytest.approx(brute)


def test_a_regions_prediction_sums_its_kernel_savings_and_casts_and_skips_the_unknown():
    """B saves 3 us over all float32 with 2 us more Casts (so 5 us of faster kernels, 4 us
    of them element-wise): it adds up 7 us; R saves 1 us with 1 us more Casts (0.5 us of
    element-wise kernels); a region whose float32 colouring cannot be priced (an allow op of
    unknown size pinned half) predicts nothing."""
    from tf_mpt.rewrite.paint import cuts  # pylint: disable=import-outside-toplevel
    casts = {"best": 3e-6, "rules": 2e-6, "float32": 1e-6}
    elementwise = {"best": 4e-6, "rules": 0.5e-6}
    region = cuts.RegionChoice([0, 1], 2e-6, {0}, {}, 3e-6, 10e-6, 1e-6, casts, elementwise)
    assert region.prediction("best") == pytest.approx((3e-6, 7e-6, 4e-6))
    assert region.prediction("rules") == pytest.approx((1e-6, 3e-6, 0.5e-6))
    assert region.prediction("float32") == (0.0, 0.0, 0.0)
    unknown = cuts.RegionChoice([0], 0.0, {0}, {}, float("inf"), 1e-6, float("inf"), casts,
                                elementwise)
    assert unknown.prediction("best") == unknown.prediction("rules") == (0.0, 0.0, 0.0)
