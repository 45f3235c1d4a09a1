"""Graph timing of the automatic path's TF1 Session graphs (issue "measured, not predicted",
item 2): where the decisions are for this CPU (target here), each graph a Session runs has
its candidate colourings timed in sandbox Sessions (random copies of its variables, made-up
inputs of the fed batch) and the Session runs the fastest; inference graphs and training
graphs alike, on both Session paths (in the Session's own Grappler pass, and the copy).

The verdicts come from the tests' Timer (tests/support/fake_timing.py: a GraphTimer with the
test's sandbox and clock): each run advances the clock by a cost function of the candidate's
GraphDef, so every pick is the test's, never this CPU's. One test runs the real sandbox
(@pytest.mark.measures_this_cpu) on a training graph and asserts only what holds whichever
way this machine's clock goes: the script's variables trained exactly the steps it ran.
"""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.automatic import switch as _autoenable
from support import fake_timing as _fake_timing
from support import half_ops
from support.helpers import tf1
from support.tolerances import FINAL_LOSS_RTOL

BF16 = tf.bfloat16.as_datatype_enum
WIDTH, BATCH = 1024, 16


def _enable(path, tmp_path, budget="5"):
    config = tf_mpt.Config.from_env({
        "TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "bfloat16", "TF_MPT_TARGET": "here",
        "TF_MPT_SESSION_REWRITE": path, "TF_MPT_TIMING_BUDGET": budget,
        "TF_MPT_OP_COSTS": os.environ["TF_MPT_OP_COSTS"],
        "TF_MPT_CACHE_DIR": str(tmp_path / "cache")})
    settings = _autoenable.enable(config, gpu_visible=False, native_bfloat16=True)
    assert settings.session_rewrite == path
    return settings


@pytest.fixture
def fake_timing(monkeypatch):
    """An injected clock and sandbox; returns a setter for the cost function (GraphDef ->
    seconds per run), its `made` the (GraphDef, inputs, fetches) of every sandbox."""
    fakes = _fake_timing.install(monkeypatch)

    def set_cost(cost):
        fakes.cost = lambda graph_def, index: cost(graph_def)
    set_cost.made = fakes.made
    return set_cost


def _half(graph_def, op):
    return sum(1 for n in graph_def.node if n.op == op and n.attr["T"].type == BF16)


def _mlp(train=False):
    """x [None, WIDTH] -> two MatMul + Sigmoid layers (variables) -> y; with `train`, a
    softmax cross-entropy loss and a GradientDescent step."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, WIDTH], name="x")
        h = x
        for k in range(2):
            w = tf1.get_variable(f"w{k}", [WIDTH, WIDTH], use_resource=False,
                                 initializer=tf1.random_normal_initializer(0.0, 0.03, seed=k))
            h = tf.nn.sigmoid(tf.matmul(h, w, name=f"matmul_{k}"), name=f"sigmoid_{k}")
        y = tf.identity(h, name="y")
        parts = {"x": x, "y": y, "init": tf1.global_variables_initializer()}
        if train:
            labels = tf1.placeholder(tf.int32, [None], name="labels")
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=h), name="loss")
            parts.update(labels=labels, loss=loss,
                         train=tf1.train.GradientDescentOptimizer(0.5).minimize(loss))
            parts["init"] = tf1.global_variables_initializer()
    return graph, parts


def _ran(sess, fetches, feed):
    """(result, {op type: set of T dtypes} over what the runtime ran)."""
    metadata = tf1.RunMetadata()
    result = sess.run(fetches, feed, options=tf1.RunOptions(output_partition_graphs=True),
                      run_metadata=metadata)
    ran = {}
    for graph in metadata.partition_graphs:
        for node in graph.node:
            if "T" in node.attr:  # (oneDNN's kernels named as the op, a fusion as its product)
                op = half_ops.op_type(node.op).replace("_Fused", "")
                ran.setdefault(op, set()).add(tf.as_dtype(node.attr["T"].type))
    return result, ran


FEED = np.random.RandomState(0).randn(BATCH, WIDTH).astype(np.float32)


@pytest.mark.parametrize("path", ["grappler", "copy"])
@pytest.mark.parametrize("fastest, matmul, sigmoid", [
    ("float32", {tf.float32}, {tf.float32}),
    ("contractions only", {tf.bfloat16}, {tf.float32}),
    ("rules", {tf.bfloat16}, {tf.bfloat16}),
])
def test_an_inference_graph_runs_the_candidate_timed_fastest(fake_timing, tmp_path, caplog,
                                                             path, fastest, matmul, sigmoid):
    # cost: half MatMuls save (float32 0.1 ms each more), half Sigmoids cost or save by case
    def cost(graph_def):
        mm, sg = _half(graph_def, "MatMul"), _half(graph_def, "Sigmoid")
        if fastest == "float32":
            return 1e-3 + 1e-4 * (mm + sg)
        if fastest == "contractions only":
            return 1e-3 - 1e-4 * mm + 2e-4 * sg
        return 1e-3 - 1e-4 * mm - 1e-4 * sg
    fake_timing(cost)
    graph, t = _mlp()
    _enable(path, tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="tf_mpt"), tf1.Session(graph=graph) as sess:
            sess.run(t["init"])
            out, ran = _ran(sess, t["y"], {t["x"]: FEED})
    finally:
        _autoenable.disable()
    assert out.dtype == np.float32 and out.shape == (BATCH, WIDTH)
    assert ran.get("MatMul") == matmul and ran.get("Sigmoid") == sigmoid, sorted(ran.items())
    # the sandbox ran the fetch (the feed x given; not the variables' initializers), with
    # made-up inputs of the fed batch
    timed = [m for m in fake_timing.made if "x" in m[1]]
    assert timed and all(set(m[2]) - {"x"} == {"y"} for m in timed), [m[2] for m in timed]
    # (the copy is rewritten before any batch is fed: the cost model's batch)
    batch = BATCH if path == "grappler" else tf_mpt.Config().cost_batch
    assert all(m[1]["x"].shape == (batch, WIDTH) for m in timed)
    lines = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("graph timing (median of")]
    assert lines, [r.getMessage() for r in caplog.records]
    for line in lines:  # (a candidate whose graph equals another's is timed as that one)
        same = [other for other in ("cost model", "rules", "float32")
                if f"{fastest} = {other}" in line]
        assert f"; picked {same[0] if same else fastest}" in line, line
    # the graph the user built is untouched
    assert graph.get_operation_by_name("matmul_0").get_attr("T") == tf.float32


@pytest.mark.parametrize("path", ["grappler", "copy"])
def test_a_training_graph_is_timed_and_the_session_trains_the_pick(fake_timing, tmp_path,
                                                                     path):
    """Contractions only is fastest: the training step runs its matrix products (forward and
    gradient) half and its Sigmoids float32, and trains as float32 does."""
    fake_timing(lambda g: 1e-3 - 1e-4 * _half(g, "MatMul") + 2e-4 * _half(g, "Sigmoid"))
    labels = np.arange(BATCH) % 10

    def train(enabled):
        graph, t = _mlp(train=True)
        if enabled:
            _enable(path, tmp_path)
        try:
            with tf1.Session(graph=graph) as sess:
                sess.run(t["init"])
                losses, ran = [], {}
                for _ in range(5):
                    (loss, _), step = _ran(sess, [t["loss"], t["train"]],
                                           {t["x"]: FEED, t["labels"]: labels})
                    losses.append(loss)
                    for op, types in step.items():
                        ran.setdefault(op, set()).update(types)
        finally:
            if enabled:
                _autoenable.disable()
        return losses, ran
    float32_losses, _ = train(False)
    losses, ran = train(True)
    assert ran["MatMul"] == {tf.bfloat16} and ran["Sigmoid"] == {tf.float32}, ran
    assert ran.get("SigmoidGrad", {tf.float32}) == {tf.float32}, ran
    # the timing ran candidates with variables (the fake sandbox got the training fetches)
    assert any(any("GradientDescent" in f or "train" in f.lower() for f in m[2])
               for m in fake_timing.made), [m[2] for m in fake_timing.made]
    np.testing.assert_allclose(losses[-1], float32_losses[-1], rtol=FINAL_LOSS_RTOL["bfloat16"])
    assert losses[-1] < losses[0]


@pytest.mark.measures_this_cpu
def test_the_real_sandbox_trains_copies_never_the_scripts_variables(tmp_path, caplog):
    """Timed for real (this CPU's clock picks whichever it picks): the Session's variables
    after N steps are those of N steps of the version that ran, within bfloat16's tolerance
    of float32's N steps; the sandboxes' runs trained only their copies."""
    labels = np.arange(BATCH) % 10
    steps = 4

    def train(enabled):
        graph, t = _mlp(train=True)
        if enabled:
            _enable("grappler", tmp_path, budget="10")
        try:
            with caplog.at_level(logging.INFO, logger="tf_mpt"), \
                    tf1.Session(graph=graph) as sess:
                sess.run(t["init"])
                initial = sess.run("w0:0")
                for _ in range(steps):
                    sess.run(t["train"], {t["x"]: FEED, t["labels"]: labels})
                return initial, sess.run("w0:0")
        finally:
            if enabled:
                _autoenable.disable()
    start32, end32 = train(False)
    start, end = train(True)
    np.testing.assert_array_equal(start, start32)  # the same initial values (seeded)
    lines = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith(("graph timing", "graph not timed"))]
    assert any(line.startswith("graph timing (median of") for line in lines), lines
    # N steps of updates, not N plus the sandboxes' runs: the change is float32's within
    # bfloat16's tolerance (a sandbox training the real w0 would move it several times as far)
    moved32, moved = end32 - start32, end - start
    np.testing.assert_allclose(np.linalg.norm(moved), np.linalg.norm(moved32), rtol=0.2)
