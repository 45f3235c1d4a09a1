"""`tf-mpt convert --variables half`: a SavedModel's variables stored in half precision where only
half ops read them (object graph, functions, the TF1 saver graph and the checkpoint edited
together), the others kept float32 with the reason."""

import numpy as np
import pytest
import tensorflow as tf

from tf_mpt import cli
from support.helpers import cli_main, write_frozen
from support.helpers import child_env

DTYPES = ["float16", "bfloat16"]


class _Mixed(tf.Module):
    """w1, w2 feed only MatMuls (half); `scale` feeds Exp, float32 in both dtypes' lists (deny);
    `shared` feeds a MatMul and the float32 output; `calls` is int32; `update` assigns w2."""

    def __init__(self):
        super().__init__()

        def uniform(shape, seed):
            return tf.random.stateless_uniform(shape, seed=(seed, 1), minval=-0.5, maxval=0.5)

        self.w1 = tf.Variable(uniform([8, 16], 1), name="w1")
        self.w2 = tf.Variable(uniform([16, 4], 2), name="w2")
        self.scale = tf.Variable(uniform([4], 3), name="scale")
        self.shared = tf.Variable(uniform([4, 4], 4), name="shared")
        self.calls = tf.Variable(0, name="calls")

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(self, x):
        hidden = tf.nn.relu(tf.matmul(x, self.w1))
        logits = tf.matmul(tf.matmul(hidden, self.w2), self.shared)
        return {"y": logits * tf.exp(self.scale) + tf.reduce_sum(self.shared)}


class _Trained(_Mixed):
    """The same with a signature that assigns w2."""

    @tf.function(input_signature=[tf.TensorSpec([16, 4], tf.float32, name="delta")])
    def update(self, delta):
        self.w2.assign_add(delta)
        return {"norm": tf.reduce_sum(self.w2)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("variables")
    mixed = _Mixed()
    tf.saved_model.save(mixed, str(root / "mixed"), signatures={"serving_default": mixed.serve})
    trained = _Trained()
    tf.saved_model.save(trained, str(root / "trained"),
                        signatures={"serving_default": trained.serve, "update": trained.update})
    return root


def _x(rows=5, seed=0):
    return np.random.RandomState(seed).uniform(-1, 1, (rows, 8)).astype(np.float32)


def _all_nodes(graph_def):
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return nodes


def _saved_graph_def(path):
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    with open(path / "saved_model.pb", "rb") as f:
        proto.ParseFromString(f.read())
    return proto.meta_graphs[0].graph_def


def _tf1_serve(path, x):
    """y of serving_default loaded with TF1's loader (the MetaGraph's own saver graph)."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta_graph = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(path))
        signature = meta_graph.signature_def["serving_default"]
        return sess.run(signature.outputs["y"].name, {signature.inputs["x"].name: x})


@pytest.mark.parametrize("dtype", DTYPES)
def test_variables_read_only_by_half_ops_are_stored_in_half(
        saved, tmp_path, capsys, dtype, no_cost_model):
    kept, half = tmp_path / "kept", tmp_path / "half"
    code, _, err = cli_main(capsys, "convert", saved / "mixed", kept, "--dtype", dtype)
    assert code == 0, err
    code, out, err = cli_main(capsys, "convert", saved / "mixed", half, "--dtype", dtype,
                           "--variables", "half", "--validate", "2")
    assert code == 0, err
    assert f"variables: 2 of 4 float32 variable(s) stored in {dtype}, 2 Cast(s)" in out
    assert "kept float32: scale: Exp" in out
    assert "kept float32: shared: " in out and "reads it as float32" in out

    # The checkpoint and the restored variables: w1, w2 half and equal to the float32 values
    # cast; the others as they were.
    half_dtype = tf.as_dtype(dtype)
    dtypes = tf.train.load_checkpoint(str(half / "variables" / "variables")) \
        .get_variable_to_dtype_map()
    assert {k.split("/")[0]: v for k, v in dtypes.items() if "VARIABLE_VALUE" in k} == {
        "w1": half_dtype, "w2": half_dtype, "scale": tf.float32, "shared": tf.float32,
        "calls": tf.int32}
    source, loaded = tf.saved_model.load(str(saved / "mixed")), tf.saved_model.load(str(half))
    assert loaded.w1.dtype == half_dtype and loaded.scale.dtype == tf.float32
    np.testing.assert_array_equal(loaded.w1.numpy(), tf.cast(source.w1, half_dtype).numpy())
    np.testing.assert_array_equal(loaded.shared.numpy(), source.shared.numpy())

    # Same numbers as the conversion with float32 variables (each read cast the same value),
    # with two Casts fewer: no Cast reads a half variable any more.
    with_float32 = tf.saved_model.load(str(kept)).signatures["serving_default"]
    with_half = loaded.signatures["serving_default"]
    assert with_half.structured_outputs == with_float32.structured_outputs
    x = tf.constant(_x())
    np.testing.assert_array_equal(with_half(x=x)["y"].numpy(), with_float32(x=x)["y"].numpy())
    casts = {path: sum(n.op == "Cast" for n in _all_nodes(_saved_graph_def(path)))
             for path in (kept, half)}
    assert casts[half] == casts[kept] - 2
    half_enum = half_dtype.as_datatype_enum
    reads = [n for n in _all_nodes(_saved_graph_def(half)) if n.op == "ReadVariableOp"
             and n.attr["dtype"].type == half_enum]
    assert reads, "no ReadVariableOp reads a half variable"

    # TF1's loader restores through the MetaGraph's saver graph: the same numbers.
    np.testing.assert_array_equal(_tf1_serve(half, _x()), _tf1_serve(kept, _x()))


def test_converted_saved_model_has_no_empty_attr_values(saved, tmp_path, capsys):
    """Regression: the cost model read MatMul's transpose_a through the attr map, which added
    an empty AttrValue where the attr was left at its default; TF1's loader refused the graph
    ('Failed to bind all placeholders in <Unknown AttrValue type>')."""
    code, _, err = cli_main(capsys, "convert", saved / "mixed", tmp_path / "half", "--dtype",
                         "bfloat16")
    assert code == 0, err
    empty = [(n.name, k) for n in _all_nodes(_saved_graph_def(tmp_path / "half"))
             for k, v in n.attr.items() if v.WhichOneof("value") is None]
    assert not empty
    assert _tf1_serve(tmp_path / "half", _x()).shape == (5, 4)


def test_variable_a_signature_assigns_stays_float32(saved, tmp_path, capsys, no_cost_model):
    code, out, err = cli_main(capsys, "convert", saved / "trained", tmp_path / "half", "--dtype",
                           "bfloat16", "--convert-variables")
    assert code == 0, err
    assert "variables: 1 of 4 float32 variable(s) stored in bfloat16" in out
    assert "kept float32: w2: " in out and "AssignAddVariableOp" in out
    loaded = tf.saved_model.load(str(tmp_path / "half"))
    assert loaded.w1.dtype == tf.bfloat16 and loaded.w2.dtype == tf.float32
    before = loaded.w2.numpy()
    delta = np.full([16, 4], 0.25, np.float32)
    loaded.signatures["update"](delta=tf.constant(delta))
    np.testing.assert_allclose(loaded.w2.numpy(), before + delta)


def test_keras_model_stores_dense_weights_in_half(tmp_path, capsys, no_cost_model):
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(4)])
    model.export(str(tmp_path / "keras"), verbose=False)
    code, _, err = cli_main(capsys, "convert", tmp_path / "keras", tmp_path / "kept", "--dtype",
                         "bfloat16")
    assert code == 0, err
    code, out, err = cli_main(capsys, "convert", tmp_path / "keras", tmp_path / "half", "--dtype",
                           "bfloat16", "--variables", "half", "--validate", "2")
    assert code == 0, err
    dtypes = tf.train.load_checkpoint(str(tmp_path / "half" / "variables" / "variables")) \
        .get_variable_to_dtype_map()
    # Keras exports each variable twice (its layers' and the archive's list); the Dense
    # kernels and biases are half in both, batch norm's four stay float32 (its arithmetic is).
    assert sum(d == tf.bfloat16 for d in dtypes.values()) == 8, dtypes
    assert sum(d == tf.float32 for d in dtypes.values()) == 8, dtypes
    assert "variables: 8 of 16 float32 variable(s) stored in bfloat16" in out
    x = np.random.RandomState(0).uniform(-1, 1, (3, 8)).astype(np.float32)
    outputs = []
    for name in ("kept", "half"):
        signature = tf.saved_model.load(str(tmp_path / name)).signatures["serving_default"]
        (key, _), = signature.structured_input_signature[1].items()
        outputs.append(signature(**{key: tf.constant(x)}))
    assert outputs[0].keys() == outputs[1].keys()
    for key in outputs[0]:
        np.testing.assert_array_equal(outputs[1][key].numpy(), outputs[0][key].numpy())


def test_frozen_graph_variables_option_says_there_are_none(saved, tmp_path, capsys):
    loaded = tf.saved_model.load(str(saved / "mixed"))  # holds the variables
    pb = tmp_path / "frozen.pb"
    write_frozen(loaded.signatures["serving_default"], pb)
    code, out, err = cli_main(capsys, "convert", pb, tmp_path / "half.pb", "--dtype", "bfloat16",
                           "--variables", "half")
    assert code == 0, err
    assert "a frozen graph has no variables" in out
    assert (tmp_path / "half.pb").exists()


def test_convert_example_serves_digits_in_half_with_half_the_checkpoint():
    """examples/convert_saved_model_digits.py: a Keras model trained on digits, exported and
    converted with --variables half, keeps its test accuracy within a point and halves its
    checkpoint."""
    import os
    import re
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = child_env()
    # the injected Zen 4 costs (conftest): the decisions do not depend on this machine
    env.update(PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2",
               TF_MPT_OP_COSTS=os.environ["TF_MPT_OP_COSTS"])
    proc = subprocess.run([sys.executable, "examples/convert_saved_model_digits.py",
                           "--epochs", "3"], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validation passed on 16 sample(s)" in proc.stdout
    assert "variables: 12 of 12 float32 variable(s) stored in bfloat16" in proc.stdout
    accuracy = {name: float(value) for name, value in
                re.findall(r"(\w+) SavedModel: test accuracy ([0-9.]+)%", proc.stdout)}
    assert accuracy["float32"] > 90.0, proc.stdout
    assert abs(accuracy["bfloat16"] - accuracy["float32"]) <= 1.0, proc.stdout
    (percent,) = re.findall(r"checkpoint: .* \((\d+)%\)", proc.stdout)
    assert 45 <= int(percent) <= 55, proc.stdout


def test_inspect_says_which_variables_convert_variables_would_store_in_half(
        saved, capsys, no_cost_model):
    import json
    code, out, err = cli_main(capsys, "inspect", saved / "mixed", "--dtype", "bfloat16")
    assert code == 0, err
    assert "with convert --variables half:" in out
    assert "variables: 2 of 4 float32 variable(s) stored in bfloat16" in out
    assert "kept float32: scale: Exp" in out
    code, out, err = cli_main(capsys, "inspect", saved / "mixed", "--dtype", "bfloat16",
                              "--json")
    assert code == 0, err
    variables = json.loads(out)["variables_half_with_convert_variables"]
    assert variables["converted"] == ["w1", "w2"]
    assert sorted(variables["kept_float32"]) == ["scale", "shared"]


def test_checkpoint_that_fails_validation_is_not_written(
        saved, tmp_path, capsys, monkeypatch, no_cost_model):
    """The model with half variables is validated again before it is written: a checkpoint
    whose converted values were wrong (here tripled) fails, and DST is not created."""
    from tf_mpt.models import saved_model_variables as _variables

    def tripled(source_prefix, target_prefix, choice):
        reader = tf.train.load_checkpoint(source_prefix)
        names = sorted(reader.get_variable_to_dtype_map())
        tensors = [tf.cast(reader.get_tensor(n) * 3, choice.dtype) if n in choice.converted
                   else tf.constant(reader.get_tensor(n)) for n in names]
        tf.raw_ops.SaveV2(prefix=target_prefix, tensor_names=names,
                          shape_and_slices=[""] * len(names), tensors=tensors)

    monkeypatch.setattr(_variables, "write_checkpoint", tripled)
    code, _, err = cli_main(capsys, "convert", saved / "mixed", tmp_path / "half", "--dtype",
                            "bfloat16", "--variables", "half", "--validate", "2")
    assert code == cli.EXIT_VALIDATION_FAILED
    assert "validation failed with the variables stored in half; nothing was written" in err
    assert not (tmp_path / "half").exists()


def test_several_metagraphs_get_a_clear_error(saved, tmp_path, capsys):
    """Several MetaGraphs share one checkpoint: --variables half refuses, says why, and writes
    nothing (the default --variables float32 still converts)."""
    import shutil
    from tensorflow.core.protobuf import saved_model_pb2
    two = tmp_path / "two"
    shutil.copytree(saved / "mixed", two)
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((two / "saved_model.pb").read_bytes())
    second = proto.meta_graphs.add()
    second.CopyFrom(proto.meta_graphs[0])
    del second.meta_info_def.tags[:]
    second.meta_info_def.tags.append("train")
    (two / "saved_model.pb").write_bytes(proto.SerializeToString())
    code, _, err = cli_main(capsys, "convert", two, tmp_path / "half", "--dtype", "bfloat16",
                            "--variables", "half")
    assert code == cli.EXIT_BAD_INPUT
    assert "has 2 MetaGraphs sharing one checkpoint" in err
    assert not (tmp_path / "half").exists()
    code, _, err = cli_main(capsys, "convert", two, tmp_path / "kept", "--dtype", "bfloat16")
    assert code == 0, err
