"""The automatic path in-process: Sessions run rewritten graphs, inside their own graph
optimisation (grappler, the default) or as a shadow copy (copy, the fallback); optimizers
scale the loss. Half ops are checked in what the runtime ran (RunMetadata partition graphs)."""

import dataclasses
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt._process import patches as _patches
from tf_mpt._process.state import STATE
from tf_mpt.automatic import sessions as _sessions
from tf_mpt.automatic import switch as _autoenable
from tf_mpt.automatic.native import rewriter as _session_rewrite
from support.helpers import tf1


PATHS = ["grappler", "copy"]


@pytest.fixture(params=PATHS)
def path(request):
    return request.param


@pytest.fixture
def enabled(request, path):
    dtype = getattr(request, "param", "bfloat16")
    # the cost model off: on a CPU it keeps these 4x4 graphs float32 (test_cost_model.py);
    # here the Session paths are under test, so the lists' ops run half
    config = tf_mpt.Config.from_env({"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": dtype,
                                     "TF_MPT_SESSION_REWRITE": path,
                                     "TF_MPT_TARGET": "rules"})
    settings = _autoenable.enable(config, gpu_visible=False, native_bfloat16=True)
    assert settings.session_rewrite == path  # the native optimizer builds on CI machines
    yield settings
    _autoenable.disable()


def _ran_dtypes(sess, fetches, feed_dict=None):
    """(result, {node name: dtype of its T attr} over what the runtime ran)."""
    metadata = tf1.RunMetadata()
    result = sess.run(fetches, feed_dict, options=tf1.RunOptions(output_partition_graphs=True),
                      run_metadata=metadata)
    ran = {node.name: tf.as_dtype(node.attr["T"].type)
           for graph in metadata.partition_graphs for node in graph.node if "T" in node.attr}
    return result, ran


def _graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        sparse = tf1.sparse_placeholder(tf.float32, name="sp")
        w = tf1.get_variable("w", [4, 4], use_resource=False,
                             initializer=tf1.random_uniform_initializer(-1, 1, seed=2))
        y = tf.matmul(x, w, name="y")
        z = tf.sparse.sparse_dense_matmul(sparse, y, name="z")
        loss = tf.reduce_sum(tf.square(y), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, name="train")
        init = tf1.global_variables_initializer()
    return graph, dict(x=x, sp=sparse, w=w, y=y, z=z, loss=loss, train=train, init=init)


FEED_X = np.eye(4, dtype=np.float32)


def test_session_runs_a_rewritten_graph_and_fetches_keep_dtypes(enabled):
    graph, t = _graph()
    feed = {t["x"]: FEED_X, t["sp"]: tf1.SparseTensorValue([[0, 0]], [2.0], [1, 4])}
    with tf1.Session(graph=graph) as sess:
        sess.run(t["init"])
        out, ran = _ran_dtypes(sess, {"z": t["z"], "w": t["w"], "y": [t["y"]],
                                      "by_name": "y:0", "loss": t["loss"]}, feed)
        assert graph.get_operation_by_name("y").get_attr("T") == tf.float32  # input untouched
    # in place, a fetched node keeps its dtype (unfetched, y runs half: next test); the copy
    # rewrites without knowing the fetches and casts y back for the fetch
    in_place = enabled.session_rewrite == "grappler"
    assert ran["y"] == (tf.float32 if in_place else tf.bfloat16)
    assert out["z"].dtype == out["w"].dtype == out["y"][0].dtype == out["by_name"].dtype
    assert out["z"].dtype == np.float32
    np.testing.assert_allclose(out["y"][0], out["w"], rtol=1e-2, atol=1e-2)


def test_unfetched_matmul_runs_half(enabled):
    graph, t = _graph()
    with tf1.Session(graph=graph) as sess:
        sess.run(t["init"])
        loss, ran = _ran_dtypes(sess, t["loss"], {t["x"]: FEED_X})
        w = sess.run(t["w"])
    assert ran["y"] == tf.bfloat16 and loss.dtype == np.float32
    np.testing.assert_allclose(loss, np.sum(np.square(w)), rtol=2e-2)


def test_graph_growth_after_the_first_run_keeps_variable_values(enabled):
    graph, t = _graph()
    with tf1.Session(graph=graph) as sess:
        sess.run(t["init"])
        for _ in range(3):
            sess.run(t["train"], {t["x"]: FEED_X})
        before = sess.run(t["w"])
        with graph.as_default():
            doubled = tf.identity(t["y"] * 2.0, name="doubled")
        value = sess.run(doubled, {t["x"]: FEED_X})
        after = sess.run(t["w"])
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(value, 2 * before, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("enabled", ["float16"], indirect=True)
def test_float16_optimizers_get_dynamic_loss_scaling(enabled):
    assert enabled.loss_scaling is True
    graph, t = _graph()
    with graph.as_default():
        names = [v.op.name for v in tf1.global_variables()]
    assert "tf_mpt/current_loss_scale" in names
    with tf1.Session(graph=graph) as sess:
        sess.run(t["init"])
        start = sess.run(t["w"])
        sess.run(t["train"], {t["x"]: FEED_X * np.nan})  # a non-finite step is skipped
        np.testing.assert_array_equal(sess.run(t["w"]), start)
        with graph.as_default():
            scale = [v for v in tf1.global_variables()
                     if v.op.name == "tf_mpt/current_loss_scale"][0]
        assert sess.run(scale) == 2.0 ** 14


def test_disable_removes_every_patch(enabled):
    assert _autoenable.is_enabled()
    assert _autoenable.enabled_settings() is enabled and enabled.dtype == "bfloat16"
    with pytest.raises(dataclasses.FrozenInstanceError):
        enabled.dtype = "float16"  # the settings in force cannot drift
    base_session = tf1.Session.__mro__[1]
    originals = _patches.originals(base_session)
    # one patch per method, whichever concerns use it (copy path, loss scaling, signals)
    calls = {"run", "make_callable", "partial_run_setup", "partial_run"}
    expected = calls | ({"__init__"} if enabled.session_rewrite == "grappler" else {"close"})
    assert set(originals) == expected
    _autoenable.disable()
    assert not _autoenable.is_enabled()
    assert all(getattr(base_session, name) is original for name, original in originals.items())
    graph, t = _graph()
    with tf1.Session(graph=graph) as sess:
        sess.run(t["init"])
        assert sess not in STATE.shadows
        assert not sess._config.graph_options.rewrite_options.custom_optimizers
        _, ran = _ran_dtypes(sess, t["loss"], {t["x"]: FEED_X})
    assert ran["y"] == tf.float32
    assert tf.function is tf_mpt.rewrite.tf_functions._TF_FUNCTION


def test_saver_checkpoints_interchange_with_float32_runs(enabled, tmp_path):
    graph, t = _graph()
    with graph.as_default():
        saver = tf1.train.Saver()
    with tf1.Session(graph=graph) as sess:
        sess.run(t["init"])
        sess.run(t["train"], {t["x"]: FEED_X})
        trained = sess.run(t["w"])
        path = saver.save(sess, str(tmp_path / "mixed"))
    _autoenable.disable()  # a float32 run restores the mixed run's checkpoint
    graph32, t32 = _graph()
    with graph32.as_default():
        saver32 = tf1.train.Saver()
    with tf1.Session(graph=graph32) as sess:
        saver32.restore(sess, path)
        restored = sess.run(t32["w"])
    assert restored.dtype == np.float32
    np.testing.assert_array_equal(restored, trained)


def test_monitored_training_session_with_hooks_and_a_dataset(enabled, tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.RandomState(0)
        x_np = rng.rand(256, 16).astype(np.float32)
        y_np = (x_np.sum(1) > 8).astype(np.int32)
        dataset = tf.data.Dataset.from_tensor_slices((x_np, y_np)).repeat().batch(32)
        x, y = tf1.data.make_one_shot_iterator(dataset).get_next()
        logits = tf.matmul(x, tf1.get_variable("w", [16, 2]), name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                            logits=logits))
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
        losses, ran = [], {}
        with tf1.train.MonitoredTrainingSession(
                checkpoint_dir=str(tmp_path), save_summaries_steps=None,
                log_step_count_steps=None,
                hooks=[tf1.train.StopAtStepHook(last_step=100)]) as sess:
            while not sess.should_stop():
                metadata = tf1.RunMetadata()
                losses.append(sess.run(
                    [loss, train], options=tf1.RunOptions(output_partition_graphs=True),
                    run_metadata=metadata)[0])
                ran.update((node.name, node.attr["T"].type) for g in metadata.partition_graphs
                           for node in g.node if node.name == "logits")
    # in place the one Session ran the half graph; a copy would duplicate the iterator, so
    # the copy path leaves this Session float32 (with a warning) rather than guess
    expected = tf.bfloat16 if enabled.session_rewrite == "grappler" else tf.float32
    assert ran == {"logits": expected.as_datatype_enum}
    assert len(losses) == 100 and np.mean(losses[-10:]) < np.mean(losses[:10])
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-100")


def test_a_fed_half_intermediate_reaches_its_consumers_whatever_the_key_form(enabled):
    graph, t = _graph()
    with graph.as_default():
        doubled = tf.identity(t["y"] * 2.0, name="doubled")
    fed = np.full([4, 4], 3.0, np.float32)
    with tf1.Session(graph=graph) as sess:
        sess.run(t["init"])
        sess.run(t["y"], {t["x"]: FEED_X})  # y's fetch now has a dtype-restoring Cast
        by_tensor = sess.run(doubled, {t["y"]: fed})
        by_tuple = sess.run(doubled, {(t["y"],): (fed,)})
        by_name = sess.run(doubled, {"y:0": fed})
    for value in (by_tensor, by_tuple, by_name):
        np.testing.assert_array_equal(value, np.full([4, 4], 6.0, np.float32))


# --- the in-place (grappler) path: Session configs and failures ----------------------------

def _config_with(**rewrite_options):
    config = tf1.ConfigProto()
    for name, value in rewrite_options.items():
        setattr(config.graph_options.rewrite_options, name, value)
    return config


@pytest.mark.parametrize("path", ["grappler"])
def test_session_config_adds_tf_mpt_and_moves_the_remapper_after_it(enabled):
    from tensorflow.core.protobuf import rewriter_config_pb2
    off = rewriter_config_pb2.RewriterConfig.OFF
    tf1.Session(graph=tf.Graph()).close()  # the first Session installs the native optimizer
    user = _config_with()
    config = _session_rewrite.session_config(user, tf.Graph())
    options = config.graph_options.rewrite_options
    assert [c.name for c in options.custom_optimizers] == ["TfMpt", "remap"]
    assert options.remapping == off and options.min_graph_nodes == -1
    assert options.custom_optimizers[0].parameter_map["dtype"].s == b"bfloat16"
    assert not user.graph_options.rewrite_options.custom_optimizers  # the caller's is untouched
    explicit = _config_with()
    explicit.graph_options.rewrite_options.optimizers.extend(["constfold", "remap", "layout"])
    options = _session_rewrite.session_config(explicit, tf.Graph()).graph_options.rewrite_options
    assert list(options.optimizers) == ["constfold", "layout"]
    assert [c.name for c in options.custom_optimizers] == ["TfMpt", "remap"]
    no_remap = _config_with(remapping=off)
    options = _session_rewrite.session_config(no_remap, tf.Graph()).graph_options.rewrite_options
    assert [c.name for c in options.custom_optimizers] == ["TfMpt"]


@pytest.mark.parametrize("path", ["grappler"])
@pytest.mark.parametrize("setting,message", [
    (dict(disable_meta_optimizer=True), r"switches Grappler off \(graph_options\."
                                        r"rewrite_options\.disable_meta_optimizer\)"),
    (dict(auto_mixed_precision_onednn_bfloat16=1),
     r"switches Grappler's own AMP on \(graph_options\.rewrite_options\."
     r"auto_mixed_precision_onednn_bfloat16\)")])
def test_a_config_that_rules_the_rewrite_out_keeps_the_session_float32_with_a_warning(
        enabled, setting, message, caplog):
    graph, t = _graph()
    with caplog.at_level("WARNING", logger="tf_mpt"):
        with tf1.Session(graph=graph, config=_config_with(**setting)) as sess:
            assert not sess._config.graph_options.rewrite_options.custom_optimizers
            sess.run(t["init"])
            _, ran = _ran_dtypes(sess, t["loss"], {t["x"]: FEED_X})
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and re.search("a Session stays float32: its ConfigProto "
                                            + message, warnings[0])
    if "disable_meta_optimizer" in setting:
        assert ran["y"] == tf.float32  # (Grappler's own bfloat16 pass may convert the other)


@pytest.mark.parametrize("path", ["grappler"])
def test_an_internal_rewrite_error_leaves_the_graph_float32_with_one_warning(
        enabled, monkeypatch, caplog):
    from tf_mpt import rewrite as rewrite_module

    def fail(*args, **kwargs):
        raise RuntimeError("injected failure")
    monkeypatch.setattr(rewrite_module, "rewrite_with_library", fail)
    graph, t = _graph()
    with caplog.at_level("WARNING", logger="tf_mpt"):
        with tf1.Session(graph=graph) as sess:
            sess.run(t["init"])
            for _ in range(2):
                loss, ran = _ran_dtypes(sess, [t["loss"], t["train"]], {t["x"]: FEED_X})
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["could not rewrite a graph of this Session (RuntimeError: injected "
                        "failure); that graph runs in float32."]
    assert ran["y"] == tf.float32 and loss[0].dtype == np.float32


def _layers_fed_any_batch(width, depth):
    """x [None, width] -> depth x (MatMul by a constant -> Relu -> Exp): Exp (deny) puts a
    Cast pair around every half MatMul, so the cost model weighs each layer."""
    graph = tf.Graph()
    rng = np.random.default_rng(0)
    with graph.as_default():
        h = x = tf1.placeholder(tf.float32, [None, width], name="x")
        for k in range(depth):
            w = tf.constant(rng.standard_normal((width, width)).astype(np.float32) / width)
            h = tf.math.exp(tf.nn.relu(tf.matmul(h, w, name=f"matmul_{k}")) * 0.01)
        y = tf.identity(h, name="y")
    return graph, x, y


def _converted_matmuls(batch, width, depth):
    """The MatMuls the cost model converts in the same graph with the batch known."""
    graph = tf.Graph()
    with graph.as_default():
        h = tf1.placeholder(tf.float32, [batch, width], name="x")
        rng = np.random.default_rng(0)
        for k in range(depth):
            w = tf.constant(rng.standard_normal((width, width)).astype(np.float32) / width)
            h = tf.math.exp(tf.nn.relu(tf.matmul(h, w, name=f"matmul_{k}")) * 0.01)
        tf.identity(h, name="y")
    report = tf_mpt.rewrite_graph_def(graph.as_graph_def(add_shapes=True), dtype="bfloat16",
                                      fetches=["y"]).report
    return {f"matmul_{k}" for k in range(depth) if report.decisions[f"matmul_{k}"].converted}


@pytest.mark.parametrize("path", ["grappler"])
def test_the_cost_model_weighs_a_session_graph_at_the_batch_its_first_run_feeds(
        enabled, monkeypatch):
    """A placeholder [None, 64]: the Session's rewrite (inside its first run) costs the batch
    that run feeds, not TF_MPT_COST_BATCH's guess."""
    width, depth = 64, 20
    small, large = _converted_matmuls(16, width, depth), _converted_matmuls(4096, width, depth)
    assert not small and len(large) == depth  # the batch decides (Zen 4 costs, conftest)
    _autoenable.disable()
    # the injected Zen 4 table, as _converted_matmuls uses (not this machine's probes)
    config = dataclasses.replace(enabled.config, target="auto", cost_model="auto",
                                 op_costs=os.environ["TF_MPT_OP_COSTS"])
    _autoenable.enable(config, gpu_visible=False, native_bfloat16=True)
    for batch, expected in ((16, small), (4096, large)):
        graph, x, y = _layers_fed_any_batch(width, depth)
        feed = np.ones((batch, width), np.float32)
        with tf1.Session(graph=graph) as sess:
            out, ran = _ran_dtypes(sess, y, {x: feed})
        assert out.dtype == np.float32 and out.shape == (batch, width)
        assert {k for k in ran if k.startswith("matmul_") and ran[k] == tf.bfloat16} == \
            expected, batch


@pytest.mark.parametrize("text, names", [
    ("with tf.compat.v1.Session() as sess:\n    sess.run(y)\n", True),
    ("tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks)\n", True),
    ("estimator = tf.estimator.Estimator(model_fn)\n", True),
    ("model.fit(x, y)\n@tf.function\ndef step(x):\n    return x\n", False)])
def test_the_optimizer_build_starts_early_for_a_script_that_names_sessions(
        text, names, tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import tensorflow as tf\n" + text)
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(script), raising=False)
    assert _sessions._script_names_sessions() is names
