"""tf_mpt against TensorFlow's Grappler auto mixed precision pass, on the same graphs.

For each graph and each half dtype, Grappler's AMP pass runs alone in a subprocess (see
`grappler_oracle`), with the same fetches as tf_mpt, and the tests check that

* Grappler really rewrote the graph (Casts inserted), else the comparison is skipped with
  the reason (a no-op pass, e.g. bfloat16 on a CPU without AVX512F, or a crash);
* tf_mpt converts every node of a Grappler allow-list op that Grappler converts (same type
  attrs set to the half dtype);
* tf_mpt adds no more Casts than Grappler.

Graphs are TF1-style: MatMul chains with BiasAdd/Relu/Tanh/Exp, a conv2d + fused batch
norm + relu + dense + sparse softmax cross-entropy network trained by Momentum (reference and
resource variables), and a while_loop + cond trained by gradient descent in control flow v1
and v2. Nodes inside library functions (control flow v2 bodies) are compared too, for the
functions the graph calls (Grappler drops the others from its output).
"""

import dataclasses
import functools

import pytest
import tensorflow as tf

from support import grappler_oracle
import tf_mpt

BATCH = 8
IMAGE_SIZE = 8
CHANNELS = 3
FILTERS = 4
CLASSES = 5
FEATURES = 16
LEARNING_RATE = 0.1
MOMENTUM = 0.9
LOOP_ITERATIONS = 3
# Seconds before a Grappler subprocess is killed (one per dtype, about 5 s, mostly TF import).
GRAPPLER_TIMEOUT_S = 120.0

v1 = tf.compat.v1


@dataclasses.dataclass(frozen=True)
class Case:
    """A graph to rewrite with both tools.

    Attributes:
        name: test id.
        graph_def: the float32 GraphDef.
        fetches: node names fetched (kept in their dtype by both tools).
    """
    name: str
    graph_def: object
    fetches: tuple


def _variable(name, shape, use_resource, initializer=None):
    return v1.get_variable(name, shape, initializer=initializer, use_resource=use_resource)


def _mlp_chain(use_resource):
    """x -> MatMul -> BiasAdd -> Relu -> MatMul -> Tanh -> MatMul -> Exp -> MatMul -> BiasAdd."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, FEATURES], name="x")
        w = [_variable(f"w{k}", [FEATURES, FEATURES], use_resource) for k in range(4)]
        b = [_variable(f"b{k}", [FEATURES], use_resource, v1.zeros_initializer())
             for k in range(2)]
        h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w[0]), b[0]), name="relu")
        h = tf.tanh(tf.matmul(h, w[1]), name="tanh")
        h = tf.exp(tf.matmul(h, w[2]), name="exp")
        tf.nn.bias_add(tf.matmul(h, w[3]), b[1], name="logits")
    return graph.as_graph_def(), ("logits",)


def _mlp_with_constants():
    """Constant weights, a residual Add and two outputs (softmax and a Tanh head)."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, FEATURES], name="x")
        weights = [tf.constant(0.1, tf.float32, [FEATURES, FEATURES], name=f"w{k}")
                   for k in range(3)]
        h1 = tf.nn.relu(tf.matmul(x, weights[0]), name="relu")
        h2 = tf.add(tf.matmul(h1, weights[1]), h1, name="residual")
        tf.nn.softmax(tf.matmul(h2, weights[2]), name="probs")
        tf.tanh(h2, name="head")
    return graph.as_graph_def(), ("probs", "head")


def _conv_net(use_resource):
    """conv2d + FusedBatchNormV3 + relu + dense + sparse softmax CE, one Momentum step."""
    graph = tf.Graph()
    with graph.as_default():
        images = v1.placeholder(tf.float32, [BATCH, IMAGE_SIZE, IMAGE_SIZE, CHANNELS], name="x")
        labels = v1.placeholder(tf.int32, [BATCH], name="labels")
        kernel = _variable("conv/kernel", [3, 3, CHANNELS, FILTERS], use_resource)
        gamma = _variable("bn/gamma", [FILTERS], use_resource, v1.ones_initializer())
        beta = _variable("bn/beta", [FILTERS], use_resource, v1.zeros_initializer())
        fc_kernel = _variable("fc/kernel", [IMAGE_SIZE * IMAGE_SIZE * FILTERS, CLASSES],
                              use_resource)
        fc_bias = _variable("fc/bias", [CLASSES], use_resource, v1.zeros_initializer())
        conv = tf.nn.conv2d(images, kernel, strides=1, padding="SAME", name="conv/Conv2D")
        normed, _, _ = v1.nn.fused_batch_norm(conv, gamma, beta, is_training=True, name="bn")
        flat = tf.reshape(tf.nn.relu(normed), [BATCH, -1])
        logits = tf.nn.bias_add(tf.matmul(flat, fc_kernel), fc_bias, name="fc/BiasAdd")
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
            name="loss")
        variables = [kernel, gamma, beta, fc_kernel, fc_bias]
        grads = tf.gradients(loss, variables)
        v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM).apply_gradients(
            zip(grads, variables), name="train")
    return graph.as_graph_def(), ("loss", "train")


def _loop_and_cond(control_flow_v2):
    """while_loop(MatMul + Tanh), cond(MatMul | Relu), mean square loss, one GD step."""
    was_v2 = v1.control_flow_v2_enabled()
    (v1.enable_control_flow_v2 if control_flow_v2 else v1.disable_control_flow_v2)()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = v1.placeholder(tf.float32, [BATCH, FEATURES], name="x")
            pred = v1.placeholder(tf.bool, [], name="pred")
            w = _variable("w", [FEATURES, FEATURES], use_resource=False)
            _, h = tf.while_loop(lambda i, h: i < LOOP_ITERATIONS,
                                 lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                                 [tf.constant(0), x])
            y = tf.cond(pred, lambda: tf.matmul(h, w), lambda: tf.nn.relu(h))
            loss = tf.reduce_mean(tf.square(y), name="loss")
            v1.train.GradientDescentOptimizer(LEARNING_RATE).minimize(loss, name="train")
    finally:
        (v1.enable_control_flow_v2 if was_v2 else v1.disable_control_flow_v2)()
    return graph.as_graph_def(), ("loss", "train")


def _lstm_tensor_array():
    """The v1 LSTM over a TensorArray (tests/integration/lstm.py) with its gradients."""
    from support import lstm  # pylint: disable=g-import-not-at-top
    return lstm.build_v1_graph().as_graph_def(), ("loss", "grad0", "grad1", "grad2")


def _call_and_cond():
    """A tf.function graph: MatMul -> call(MatMul, Tanh) -> If(MatMul | MatMul, Relu) -> MatMul."""
    w = tf.Variable(tf.random.stateless_uniform([FEATURES, FEATURES], seed=(1, 2)))

    @tf.function
    def inner(h):
        return tf.tanh(tf.matmul(h, w))

    @tf.function(input_signature=[tf.TensorSpec([BATCH, FEATURES], tf.float32, name="x"),
                                  tf.TensorSpec([], tf.bool, name="pred")])
    def f(x, pred):
        h = inner(tf.matmul(x, w))
        h = tf.cond(pred, lambda: tf.matmul(h, w), lambda: tf.nn.relu(tf.matmul(h, w)))
        return tf.matmul(h, w)

    cf = f.get_concrete_function()
    return cf.graph.as_graph_def(), tuple(t.op.name for t in cf.outputs)


BUILDERS = {
    "mlp_chain_ref_vars": lambda: _mlp_chain(use_resource=False),
    "mlp_chain_resource_vars": lambda: _mlp_chain(use_resource=True),
    "mlp_constants": _mlp_with_constants,
    "conv_net_ref_vars": lambda: _conv_net(use_resource=False),
    "conv_net_resource_vars": lambda: _conv_net(use_resource=True),
    "loop_and_cond_control_flow_v1": lambda: _loop_and_cond(control_flow_v2=False),
    "loop_and_cond_control_flow_v2": lambda: _loop_and_cond(control_flow_v2=True),
    "lstm_tensor_array_control_flow_v1": _lstm_tensor_array,
    "function_call_and_cond": _call_and_cond,
}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Both rewrites of one case in one dtype.

    Attributes:
        case: the Case.
        dtype: 'float16' or 'bfloat16'.
        grappler_graph_def: Grappler's output.
        grappler_info: the info dict of `grappler_oracle.run_grappler_amp`.
        tf_mpt_result: tf_mpt's RewriteResult.
    """
    case: Case
    dtype: str
    grappler_graph_def: object
    grappler_info: dict
    tf_mpt_result: object


@functools.lru_cache(maxsize=None)
def _cases():
    """{name: Case}, built once."""
    return {name: Case(name, *build()) for name, build in BUILDERS.items()}


@functools.lru_cache(maxsize=None)
def _grappler_results(dtype):
    """{case name: (GraphDef or None, info)}: every case in one Grappler subprocess."""
    cases = _cases()
    results = grappler_oracle.run_grappler_amp_batch(
        [(case.graph_def, case.fetches) for case in cases.values()], dtype,
        timeout=GRAPPLER_TIMEOUT_S, want_lists=True)
    return dict(zip(cases, results))


@functools.lru_cache(maxsize=None)
def _comparison(case_name, dtype):
    """(Comparison, None), or (None, why there is no Grappler result to compare with)."""
    case = _cases()[case_name]
    grappler_graph_def, info = _grappler_results(dtype)[case_name]
    if info["skip_reason"] is not None:
        return None, info["skip_reason"]
    # the rules and Cast placement against Grappler's: the cost model, which keeps ops
    # float32 where half is slower on this CPU (trading Casts for time), is off here and
    # tested in tests/unit/test_cost_model.py and benchmarks/real_models.py
    config = tf_mpt.Config.from_env({"TF_MPT_TARGET": "rules"})
    result = tf_mpt.rewrite_graph_def(case.graph_def, dtype=dtype, fetches=case.fetches,
                                      strict=True, config=config)
    return Comparison(case, dtype, grappler_graph_def, info, result), None


@pytest.fixture(params=sorted(BUILDERS))
def case_name(request):
    return request.param


@pytest.fixture
def comparison(case_name, half_dtype):
    """The Comparison; skips when Grappler gives nothing to compare with (no-op or crash)."""
    result, reason = _comparison(case_name, half_dtype)
    if result is None:
        pytest.skip(f"{case_name}/{half_dtype}: no Grappler result to compare with: {reason}")
    return result


def test_grappler_inserted_casts(comparison):
    info = comparison.grappler_info
    assert info["casts_added"] > 0, f"Grappler {info['mode']} inserted no Cast: {info}"
    assert info["lists"] is not None, "Grappler wrote no paintbuckets dump"


def test_tf_mpt_converts_every_allow_op_grappler_converts(comparison):
    """Every allow-op type attr Grappler sets to half, tf_mpt sets to half too."""
    case, dtype = comparison.case, comparison.dtype
    allow_ops = comparison.grappler_info["lists"]["allow"]
    ops = grappler_oracle.node_ops(case.graph_def)
    grappler = grappler_oracle.converted_attrs(case.graph_def, comparison.grappler_graph_def,
                                               dtype)
    ours = grappler_oracle.converted_attrs(case.graph_def, comparison.tf_mpt_result.graph_def,
                                           dtype)
    missed = {name: sorted(map(str, keys - ours.get(name, set())))
              for name, keys in grappler.items()
              if ops[name] in allow_ops and keys - ours.get(name, set())}
    assert any(ops[name] in allow_ops for name in grappler), (
        f"Grappler converted no allow op in {case.name}: {sorted(grappler)}")
    decisions = comparison.tf_mpt_result.report.decisions
    assert not missed, (
        f"{case.name}/{dtype}: tf_mpt leaves float32 these allow-op attrs Grappler converts: "
        f"{missed}; tf_mpt decisions: {[str(decisions.get(name, name)) for name in missed]}")


def test_tf_mpt_adds_no_more_casts_than_grappler(comparison):
    """Counted in the graph and the functions it calls (`grappler_oracle.all_nodes`)."""
    case, dtype = comparison.case, comparison.dtype
    result = comparison.tf_mpt_result
    ours = grappler_oracle.added_casts(case.graph_def, result.graph_def,
                                       grappler_oracle.TF_MPT_CAST_SUFFIX)
    theirs = comparison.grappler_info["casts"]
    assert len(ours) <= result.report.casts_added
    assert len(ours) <= len(theirs), (
        f"{case.name}/{dtype}: tf_mpt adds {len(ours)} Casts, Grappler {len(theirs)}.\n"
        f"tf_mpt: {sorted(ours)}\nGrappler: {sorted(theirs)}")


def test_same_fetches_keep_float32(comparison):
    """Both tools leave the fetched nodes' type attrs as they were."""
    case = comparison.case
    originals = {node.name: grappler_oracle.type_attrs(node) for node in case.graph_def.node}
    for graph_def in (comparison.grappler_graph_def, comparison.tf_mpt_result.graph_def):
        rewritten = {node.name: grappler_oracle.type_attrs(node) for node in graph_def.node}
        for name in case.fetches:
            assert rewritten[name] == originals[name], name


def test_tf_mpt_converts_every_node_grappler_converts(comparison):
    """Stronger than the allow-op check: on these graphs no Grappler conversion is missed."""
    case, dtype = comparison.case, comparison.dtype
    grappler = grappler_oracle.converted_attrs(case.graph_def, comparison.grappler_graph_def,
                                               dtype)
    ours = grappler_oracle.converted_attrs(case.graph_def, comparison.tf_mpt_result.graph_def,
                                           dtype)
    missed = {name: sorted(map(str, keys - ours.get(name, set())))
              for name, keys in grappler.items() if keys - ours.get(name, set())}
    assert not missed, (
        f"{case.name}/{dtype}: tf_mpt leaves float32 what Grappler converts: {missed}")


# --- the oracle itself ------------------------------------------------------------------------


def _graph_without_allow_ops():
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, FEATURES], name="x")
        tf.tanh(tf.nn.relu(x), name="y")
    return graph.as_graph_def()


# under -m heavy: the oracle's other report of its child (a failing one) is in the default run
@pytest.mark.heavy
def test_oracle_reports_a_noop_as_a_skip_reason(monkeypatch):
    """With oneDNN off the bf16 pass silently does nothing, as on CPUs without AVX512F."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    graph_def, fetches = _mlp_chain(use_resource=False)
    optimized, info = grappler_oracle.run_grappler_amp(graph_def, fetches, "bfloat16",
                                                       timeout=GRAPPLER_TIMEOUT_S)
    assert optimized is not None
    assert info["casts_added"] == 0
    assert "no-op" in info["skip_reason"]
    assert "TF_ENABLE_ONEDNN_OPTS=0" in info["skip_reason"]


def test_oracle_reports_a_failing_child():
    graph_def, info = grappler_oracle.run_grappler_amp(
        _graph_without_allow_ops(), ["no_such_node"], "float16", timeout=GRAPPLER_TIMEOUT_S)
    assert graph_def is None
    assert "exited with status" in info["skip_reason"]


@pytest.mark.parametrize("flags, works, native", [
    ("fpu sse avx2", False, False),
    ("fpu avx2 avx512f", True, False),
    ("fpu avx2 avx512f avx512_bf16", True, True),
    ("fpu avx2 avx_ne_convert amx_bf16", True, True),
])
def test_native_bf16_reads_cpu_flags(tmp_path, flags, works, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n")
    support = grappler_oracle.native_bf16(str(cpuinfo), environ={})
    assert (support.grappler_bf16_works, support.native) == (works, native)
    assert support.cpu_model == "Test CPU"


def test_native_bf16_is_off_without_onednn(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: avx512f avx512_bf16\n")
    support = grappler_oracle.native_bf16(str(cpuinfo), environ={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert not support.grappler_bf16_works
    assert "TF_ENABLE_ONEDNN_OPTS" in support.reason
