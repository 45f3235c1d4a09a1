"""Cases of Grappler's own AMP tests (auto_mixed_precision_test.cc), rebuilt as TF graphs.

Each case checks structure first (per-node dtypes, op renames, the exact Casts tf_mpt adds, in
float16 and bfloat16), then numbers against float32, then Grappler's pass on the same graph:
tf_mpt converts every node Grappler converts and adds no more Casts. Grappler's bfloat16
pass is a no-op on CPUs without AVX512F; those comparisons skip with the reason.

Node names follow the upstream tests: allowN (allow list), inferN, denyN, clrN (clear),
tlN (TensorLists), fetchN.
"""

import dataclasses
import functools

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import gen_list_ops

from support import grappler_oracle
import tf_mpt
from support.tolerances import assert_close
from support.helpers import added_casts, half_tag, node_map, run

tf1 = tf.compat.v1
SIZE = 32
GRAPPLER_TIMEOUT_S = 180.0


@dataclasses.dataclass(frozen=True)
class Case:
    """graph_def, fetches, feeds; half/full: nodes whose `attr` must end half / float32;
    ops: {node: op after the rewrite}; casts: the Casts tf_mpt adds, as '<producer>-<Word>'
    with Word Half (the target) or Fp32."""
    graph_def: object
    fetches: tuple
    feeds: dict
    half: dict
    full: dict
    casts: tuple
    ops: dict = dataclasses.field(default_factory=dict)


def _feed(shape, seed=0, scale=1.0 / SIZE):
    return np.random.RandomState(seed).uniform(0.0, 1.0, shape).astype(np.float32) * scale


def _fused_batch_norm_v1():
    """Conv2D -> FusedBatchNorm (V1, T float32 only) -> FusedBatchNormGrad (V1) -> Add ->
    Conv2D: the V1 ops become their V2 form (T half, statistics U float32), as Grappler does."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8, 8, 16], name="input")
        weight = tf.constant(np.random.RandomState(0).randn(3, 3, 16, 16).astype(np.float32)
                             * 0.1, name="weight")
        scale = tf.constant(np.full(16, 3.0, np.float32), name="scale")
        offset = tf.constant(np.full(16, 4.0, np.float32), name="offset")
        empty = tf.constant(np.zeros(0, np.float32), name="empty")
        allow1 = tf.nn.conv2d(x, weight, 1, "SAME", name="allow1")
        fbn1 = tf.raw_ops.FusedBatchNorm(x=allow1, scale=scale, offset=offset, mean=empty,
                                         variance=empty, is_training=True, name="fbn1")
        bng1 = tf.raw_ops.FusedBatchNormGrad(
            y_backprop=fbn1.y, x=allow1, scale=scale, reserve_space_1=fbn1.reserve_space_1,
            reserve_space_2=fbn1.reserve_space_2, is_training=True, name="bng1")
        infer1 = tf.add(fbn1.y, bng1.x_backprop, name="infer1")
        allow2 = tf.nn.conv2d(infer1, weight, 1, "SAME", name="allow2")
        tf.identity(allow2, name="fetch")
    return Case(graph.as_graph_def(), ("fetch",), {"input:0": _feed([4, 8, 8, 16], scale=1.0)},
                half={"allow1": "T", "fbn1": "T", "bng1": "T", "infer1": "T", "allow2": "T",
                      "weight": "dtype"},
                full={"fbn1": "U", "bng1": "U", "input": "dtype", "scale": "dtype"},
                casts=("input-Half", "allow2-Fp32"),
                ops={"fbn1": "FusedBatchNormV2", "bng1": "FusedBatchNormGradV2"})


def _fused_batch_norm_v1_between_deny_ops():
    """A V1 batch norm that stays float32 keeps its op: nothing is renamed for nothing."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 8, 8, 16], name="input")
        scale = tf.constant(np.ones(16, np.float32), name="scale")
        offset = tf.constant(np.zeros(16, np.float32), name="offset")
        empty = tf.constant(np.zeros(0, np.float32), name="empty")
        deny1 = tf.exp(x, name="deny1")
        fbn1 = tf.raw_ops.FusedBatchNorm(x=deny1, scale=scale, offset=offset, mean=empty,
                                         variance=empty, is_training=True, name="fbn1")
        tf.identity(tf.math.log(fbn1.y + 2.0, name="deny2"), name="fetch")
    return Case(graph.as_graph_def(), ("fetch",), {"input:0": _feed([4, 8, 8, 16], scale=1.0)},
                half={}, full={"fbn1": "T", "deny1": "T"}, casts=(),
                ops={"fbn1": "FusedBatchNorm"})


def _tensor_list_set_get():
    """TensorListSetGet: list tl1 written by allow ops and read by an infer op goes half as a
    whole (TensorListResize on the way); tl2, written from the float32 input and fetched, stays
    float32."""
    graph = tf.Graph()
    with graph.as_default():
        shape = tf.constant([SIZE, SIZE], name="shape")
        tl1 = gen_list_ops.tensor_list_reserve(shape, 8, tf.float32, name="tl1")
        x = tf1.placeholder(tf.float32, [SIZE, SIZE], name="input")
        gen_list_ops.tensor_list_set_item(tl1, 1, x, name="tl1w1")
        allow1 = tf.matmul(x, x, name="allow1")
        tl1w2 = gen_list_ops.tensor_list_set_item(tl1, 2, allow1, name="tl1w2")
        tl1rs = gen_list_ops.tensor_list_resize(tl1w2, 6, name="tl1rs")
        tl1r1 = gen_list_ops.tensor_list_get_item(tl1rs, 2, shape, tf.float32, name="tl1r1")
        infer1 = tf.tanh(tl1r1, name="infer1")
        allow2 = tf.matmul(infer1, infer1, name="allow2")
        tl1w3 = gen_list_ops.tensor_list_set_item(tl1, 3, allow2, name="tl1w3")
        tl1r2 = gen_list_ops.tensor_list_get_item(tl1w3, 3, shape, tf.float32, name="tl1r2")
        tl2 = gen_list_ops.tensor_list_reserve(shape, 8, tf.float32, name="tl2")
        tl2w1 = gen_list_ops.tensor_list_set_item(tl2, 1, x, name="tl2w1")
        tl2r1 = gen_list_ops.tensor_list_get_item(tl2w1, 1, shape, tf.float32, name="tl2r1")
        tf.identity(tl1r2, name="fetch1")
        tf.identity(tl2r1, name="fetch2")
    key = "element_dtype"
    return Case(graph.as_graph_def(), ("fetch1", "fetch2"), {"input:0": _feed([SIZE, SIZE])},
                half={"tl1": key, "tl1w1": key, "allow1": "T", "tl1w2": key, "tl1r1": key,
                      "infer1": "T", "allow2": "T", "tl1w3": key, "tl1r2": key},
                full={"tl2": key, "tl2w1": key, "tl2r1": key, "input": "dtype"},
                casts=("input-Half", "tl1r2-Fp32"))


def _tensor_list_push_pop():
    """TensorListPushPop: the same with EmptyTensorList, PushBack and PopBack."""
    graph = tf.Graph()
    with graph.as_default():
        shape = tf.constant([SIZE, SIZE], name="shape")
        tl1 = gen_list_ops.empty_tensor_list(shape, 8, tf.float32, name="tl1")
        x = tf1.placeholder(tf.float32, [SIZE, SIZE], name="input")
        tl1w1 = gen_list_ops.tensor_list_push_back(tl1, x, name="tl1w1")
        allow1 = tf.matmul(x, x, name="allow1")
        tl1w2 = gen_list_ops.tensor_list_push_back(tl1w1, allow1, name="tl1w2")
        _, tl1r1 = gen_list_ops.tensor_list_pop_back(tl1w2, shape, tf.float32, name="tl1r1")
        infer1 = tf.tanh(tl1r1, name="infer1")
        allow2 = tf.matmul(infer1, infer1, name="allow2")
        tl1w3 = gen_list_ops.tensor_list_push_back(tl1, allow2, name="tl1w3")
        _, tl1r2 = gen_list_ops.tensor_list_pop_back(tl1w3, shape, tf.float32, name="tl1r2")
        tl2 = gen_list_ops.empty_tensor_list(shape, 8, tf.float32, name="tl2")
        tl2w1 = gen_list_ops.tensor_list_push_back(tl2, x, name="tl2w1")
        _, tl2r1 = gen_list_ops.tensor_list_pop_back(tl2w1, shape, tf.float32, name="tl2r1")
        tf.identity(tl1r2, name="fetch1")
        tf.identity(tl2r1, name="fetch2")
    key = "element_dtype"
    return Case(graph.as_graph_def(), ("fetch1", "fetch2"), {"input:0": _feed([SIZE, SIZE])},
                half={"tl1": key, "tl1w1": key, "allow1": "T", "tl1w2": key, "tl1r1": key,
                      "infer1": "T", "allow2": "T", "tl1w3": key, "tl1r2": key},
                full={"tl2": key, "tl2w1": key, "tl2r1": key},
                casts=("input-Half", "tl1r2:1-Fp32"))


def _tensor_list_from_tensor():
    """TensorListFromTensor: a list made from an allow op's output and stacked into an infer
    op; a second list made from it and pushed to from the float32 input follows as a whole."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [SIZE, SIZE], name="input")
        element = tf.constant([SIZE], name="element_shape")
        allow1 = tf.matmul(x, x, name="allow1")
        tl1 = gen_list_ops.tensor_list_from_tensor(allow1, element, name="tl1")
        tl1r1 = gen_list_ops.tensor_list_stack(tl1, element, tf.float32, name="tl1r1")
        infer1 = tf.tanh(tl1r1, name="infer1")
        allow2 = tf.matmul(infer1, infer1, name="allow2")
        tf.identity(allow2, name="fetch1")
        tl2 = gen_list_ops.tensor_list_from_tensor(allow1, element, name="tl2")
        gen_list_ops.tensor_list_push_back(tl2, x[0], name="tl2w1")
    key = "element_dtype"
    return Case(graph.as_graph_def(), ("fetch1",), {"input:0": _feed([SIZE, SIZE])},
                half={"allow1": "T", "tl1": key, "tl1r1": key, "infer1": "T", "allow2": "T",
                      "tl2": key, "tl2w1": key},
                full={"input": "dtype"},
                casts=("input-Half", "allow2-Fp32"))


def _tensor_list_push_back_batch_and_concat_lists():
    """TensorListPushBackBatchAndConcatLists: two lists packed into a batch of handles, pushed
    to by an allow op, split, reshaped and concatenated into one list that an infer op reads:
    one list group through Pack/Split/Reshape, all half."""
    graph = tf.Graph()
    with graph.as_default():
        shape = tf.constant([SIZE, SIZE], name="shape")
        tl1 = gen_list_ops.empty_tensor_list(shape, 8, tf.float32, name="tl1")
        tl2 = gen_list_ops.empty_tensor_list(shape, 8, tf.float32, name="tl2")
        x = tf1.placeholder(tf.float32, [SIZE, SIZE], name="input")
        allow1 = tf.matmul(x, x, name="allow1")
        handles = tf.stack([tl1, tl2], name="tl1_tl2")
        values = tf.stack([allow1, allow1], name="allow1_allow1")
        tl12w1 = gen_list_ops.tensor_list_push_back_batch(handles, values, name="tl12w1")
        halves = tf.split(tl12w1, 2, name="tl12w1_outputs")
        scalar = tf.constant([], tf.int32, name="scalar_shape")
        out0 = tf.reshape(halves[0], scalar, name="tl12w1_output0")
        out1 = tf.reshape(halves[1], scalar, name="tl12w1_output1")
        tl3 = gen_list_ops.tensor_list_concat_lists(out0, out1, tf.float32, name="tl3")
        _, tl3r1 = gen_list_ops.tensor_list_pop_back(tl3, shape, tf.float32, name="tl3r1")
        infer1 = tf.tanh(tl3r1, name="infer1")
        allow2 = tf.matmul(infer1, infer1, name="allow2")
        tf.identity(allow2, name="fetch1")
    key = "element_dtype"
    return Case(graph.as_graph_def(), ("fetch1",), {"input:0": _feed([SIZE, SIZE])},
                half={"allow1": "T", "allow2": "T", "infer1": "T", "tl1": key, "tl2": key,
                      "tl12w1": key, "tl3": key, "tl3r1": key},
                full={"input": "dtype"}, casts=("input-Half", "allow2-Fp32"))


def _bidirectional_clear_chain(fetch_shape_n):
    """BidirectionalClearChain: clear chains both sides of an allow op joined by ShapeN (N
    inputs, int outputs). Fetching the ShapeN (or leaving fetches to tf_mpt, which then fetches
    every node without consumers) keeps its int32 outputs, not its inputs' float dtype.

    Grappler (and tf_mpt's rules) paint the clear chains half: Casts input->half,
    allow1->float32, clr4->float32 (3). The minimum cut keeps them float32 and casts clr1's
    output for the MatMul alone: 2 Casts."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [SIZE, SIZE], name="input")
        clr1 = tf.nn.relu(x, name="clr1")
        clr2 = tf.nn.relu(x, name="clr2")
        allow1 = tf.matmul(clr1, clr1, name="allow1")
        tf.shape_n([clr1, clr2], name="clr3")
        clr4 = tf.nn.relu(clr2, name="clr4")
        tf.identity(allow1, name="fetch1")
        tf.identity(clr4, name="fetch2")
    fetches = ("fetch1", "fetch2", "clr3") if fetch_shape_n else ("fetch1", "fetch2")
    return Case(graph.as_graph_def(), fetches, {"input:0": _feed([SIZE, SIZE])},
                half={"allow1": "T"},
                full={"input": "dtype", "clr1": "T", "clr2": "T", "clr3": "T", "clr4": "T"},
                casts=("clr1-Half", "allow1-Fp32"))


def _batch_matmul():
    """BatchMatMul: three nodes (Grappler's meta-optimizer skips graphs under four nodes unless
    told not to; the oracle tells it)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(_feed([8, SIZE, SIZE]), name="input")
        allow1 = tf.linalg.matmul(x, x, name="allow1")
        tf.identity(allow1, name="fetch1")
    return Case(graph.as_graph_def(), ("fetch1",), {},
                half={"allow1": "T", "input": "dtype"}, full={"fetch1": "T"},
                casts=("allow1-Fp32",), ops={"allow1": "BatchMatMulV2"})


CASES = {
    "batch_matmul": _batch_matmul,
    "fused_batch_norm_v1": _fused_batch_norm_v1,
    "fused_batch_norm_v1_kept": _fused_batch_norm_v1_between_deny_ops,
    "tensor_list_set_get": _tensor_list_set_get,
    "tensor_list_push_pop": _tensor_list_push_pop,
    "tensor_list_from_tensor": _tensor_list_from_tensor,
    "tensor_list_push_back_batch_and_concat_lists": _tensor_list_push_back_batch_and_concat_lists,
    "bidirectional_clear_chain": functools.partial(_bidirectional_clear_chain, False),
    "bidirectional_clear_chain_shape_n_fetched": functools.partial(_bidirectional_clear_chain,
                                                                   True),
}


@pytest.fixture(autouse=True)
def _op_lists_decide(monkeypatch):
    """These are Grappler's own cases for its op-list algorithm: the op lists decide (TF_MPT_TARGET=rules). The cost model sizes any graph
    (TensorFlow's shape inference) and would keep these graphs of small matrices float32 in
    bfloat16; its decisions are tests/unit/test_cost_model.py's."""
    monkeypatch.setenv("TF_MPT_TARGET", "rules")


@functools.lru_cache(maxsize=None)
def _case(name):
    return CASES[name]()


@functools.lru_cache(maxsize=None)
def _rewritten(name, dtype):
    case = _case(name)
    return tf_mpt.rewrite_graph_def(case.graph_def, dtype=dtype, fetches=list(case.fetches),
                                    strict=True)


def _expected_cast_names(case, dtype):
    names = []
    for entry in case.casts:
        tensor, word = entry.rsplit("-", 1)
        producer, _, port = tensor.partition(":")
        word = f"CastTo{half_tag(dtype)}" if word == "Half" else "CastToFp32"
        names.append(f"{producer}-{port or 0}-{word}-TfMpt")
    return sorted(names)


@pytest.fixture(params=sorted(CASES))
def case_name(request):
    return request.param


def test_structure_dtypes_ops_and_exact_casts(case_name, half_dtype):
    case = _case(case_name)
    result = _rewritten(case_name, half_dtype)
    nodes = node_map(result.graph_def)
    half = tf.as_dtype(half_dtype).as_datatype_enum
    for name, attr in case.half.items():
        assert nodes[name].attr[attr].type == half, (name, attr, nodes[name].attr[attr])
    for name, attr in case.full.items():
        assert nodes[name].attr[attr].type == tf.float32.as_datatype_enum, (name, attr)
    for name, op in case.ops.items():
        assert nodes[name].op == op, (name, nodes[name].op)
    assert added_casts(result.graph_def) == _expected_cast_names(case, half_dtype)


def test_input_unchanged_and_a_second_rewrite_changes_nothing(case_name):
    case = _case(case_name)
    before = case.graph_def.SerializeToString(deterministic=True)
    first = _rewritten(case_name, "float16")
    assert case.graph_def.SerializeToString(deterministic=True) == before
    again = tf_mpt.rewrite_graph_def(first.graph_def, dtype="float16",
                                     fetches=list(case.fetches))
    assert added_casts(again.graph_def) == added_casts(first.graph_def)
    assert not again.modified


def test_numbers_match_float32(case_name, half_dtype):
    case = _case(case_name)
    result = _rewritten(case_name, half_dtype)
    fetches = [f"{name}:0" for name in case.fetches]
    expected = run(case.graph_def, fetches, case.feeds)
    actual = run(result.graph_def, fetches, case.feeds)
    for name, want, got in zip(case.fetches, expected, actual):
        assert np.asarray(got).dtype == np.asarray(want).dtype, name
        scale = max(float(np.abs(want).max()), 1e-6)
        # relative to the output's scale: batch norm centres values near zero
        assert_close(np.asarray(got) / scale, np.asarray(want) / scale, half_dtype)


# Cases with an allow op (Grappler's pass does nothing at all on the others).
GRAPPLER_CASES = sorted(set(CASES) - {"fused_batch_norm_v1_kept"})


@functools.lru_cache(maxsize=None)
def _grappler(dtype):
    items = [(_case(name).graph_def, list(_case(name).fetches)) for name in GRAPPLER_CASES]
    results = grappler_oracle.run_grappler_amp_batch(items, dtype, timeout=GRAPPLER_TIMEOUT_S)
    return dict(zip(GRAPPLER_CASES, results))


# Grappler runs each case in both half types; float16 under -m heavy (test_model_corpus.py's
# and test_grappler_compare.py's float16 comparisons stay in the default run)
@pytest.mark.parametrize("half_dtype", [
    "bfloat16", pytest.param("float16", marks=pytest.mark.heavy)])
@pytest.mark.parametrize("case_name", GRAPPLER_CASES)
def test_no_fewer_conversions_and_no_more_casts_than_grappler(case_name, half_dtype):
    """Every node Grappler converts, tf_mpt converts too, except clear ops the minimum cut
    keeps float32 because that needs strictly fewer Casts (they save no compute: a clear op
    runs as fast in float32); and never more Casts."""
    graph_def, info = _grappler(half_dtype)[case_name]
    if info["skip_reason"] is not None:
        pytest.skip(f"{case_name}/{half_dtype}: no Grappler result to compare with: "
                    f"{info['skip_reason']}")
    case = _case(case_name)
    ours = _rewritten(case_name, half_dtype)
    theirs_converted = grappler_oracle.converted_nodes(case.graph_def, graph_def, half_dtype)
    ours_converted = grappler_oracle.converted_nodes(case.graph_def, ours.graph_def, half_dtype)
    missing = {name for name in theirs_converted - ours_converted
               if not ours.report.decisions[name].reason.startswith("minimum cut:")}
    assert not missing, sorted(missing)
    assert len(added_casts(ours.graph_def)) <= info["casts_added"]


def test_oracle_rewrites_graphs_under_four_nodes():
    graph_def, info = _grappler("float16")["batch_matmul"]
    assert info["skip_reason"] is None and info["casts_added"] >= 1
    assert "allow1" in grappler_oracle.converted_nodes(_case("batch_matmul").graph_def, graph_def,
                                                       "float16")
