"""A converted model goes back to float32 and across to the other half type
(`tf-mpt convert converted/ out/ --dtype float32|float16|bfloat16`): signatures, names and
io dtypes unchanged, op dtypes those of the float32 original, outputs within the tolerances;
a model made half by something else is refused with what can and cannot be undone."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from tf_mpt import cli
from support.helpers import cli_main, write_frozen
from support.tolerances import TOLERANCES

FLOAT = tf.float32.as_datatype_enum
HALF = {tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum}
# the op lists decide: this small model converts on every machine (the cost model, measured
# or the suite's injected Zen 4 table, would keep it float32)
RULES = ("--target", "rules")


class _ConvNet(tf.Module):
    """x[?, 16, 16, 3] -> conv 3x3 (8) -> relu -> mean -> dense 4 (+ bias)."""

    def __init__(self):
        super().__init__()
        def init(shape, seed):
            return tf.random.stateless_uniform(shape, seed=(seed, 0), minval=-0.3, maxval=0.3)
        self.k = tf.Variable(init([3, 3, 3, 8], 1), name="k")
        self.w = tf.Variable(init([8, 4], 2), name="w")
        self.b = tf.Variable(init([4], 3), name="b")

    @tf.function(input_signature=[tf.TensorSpec([None, 16, 16, 3], tf.float32, name="x")])
    def serve(self, x):
        h = tf.nn.relu(tf.nn.conv2d(x, self.k, 1, "SAME"))
        return {"y": tf.nn.bias_add(tf.matmul(tf.reduce_mean(h, [1, 2]), self.w), self.b)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("retarget")
    module = _ConvNet()
    tf.saved_model.save(module, str(root / "sm"), signatures={"serving_default": module.serve})
    write_frozen(module.serve.get_concrete_function(), root / "frozen.pb")
    return root


def _x():
    return np.random.RandomState(0).uniform(-1, 1, (4, 16, 16, 3)).astype(np.float32)


def _graph_def(path):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(path.read_bytes())
    return graph_def


def _op_dtypes(graph_def):
    """{node name: (op, every type attr)} of the graph and its functions."""
    out = {}
    for prefix, nodes in [("", graph_def.node)] + [(f.signature.name + "/", f.node_def)
                                                    for f in graph_def.library.function]:
        for n in nodes:
            out[prefix + n.name] = (n.op, tuple(sorted(
                (k, v.type, tuple(v.list.type)) for k, v in n.attr.items()
                if v.type or v.list.type)))
    return out


def _frozen_output(graph_def):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    out = [n.name for n in graph_def.node if n.op == "Identity"][-1]
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run(f"{out}:0", {"x:0": _x()})


def _serve(path):
    return tf.saved_model.load(str(path)).signatures["serving_default"](x=tf.constant(_x()))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_converted_frozen_graph_goes_back_to_float32_and_across(models, tmp_path, capsys,
                                                                  dtype):
    original = models / "frozen.pb"
    half = tmp_path / "half.pb"
    assert cli_main(capsys, "convert", original, half, "--dtype", dtype, *RULES)[0] == 0
    assert any(n.attr["T"].type in HALF for n in _graph_def(half).node)
    back = tmp_path / "back.pb"
    code, out, err = cli_main(capsys, "convert", half, back, "--dtype", "float32")
    assert code == 0 and "tf_mpt's conversion undone" in out, err
    back_graph = _graph_def(back)
    assert not any(n.name.endswith("-TfMpt") for n in back_graph.node)
    assert _op_dtypes(back_graph) == _op_dtypes(_graph_def(original))
    # the half-stored constants were rounded once
    np.testing.assert_allclose(_frozen_output(back_graph), _frozen_output(_graph_def(original)),
                               **TOLERANCES[dtype])
    # across: the other half type, decided as for the float32 original
    other = "bfloat16" if dtype == "float16" else "float16"
    across, direct = tmp_path / "across.pb", tmp_path / "direct.pb"
    assert cli_main(capsys, "convert", half, across, "--dtype", other, *RULES)[0] == 0
    assert cli_main(capsys, "convert", original, direct, "--dtype", other, *RULES)[0] == 0
    assert _op_dtypes(_graph_def(across)) == _op_dtypes(_graph_def(direct))


def test_a_converted_saved_model_goes_back_to_float32_and_across(models, tmp_path, capsys):
    original = models / "sm"
    half = tmp_path / "bf16"
    assert cli_main(capsys, "convert", original, half, "--dtype", "bfloat16", *RULES)[0] == 0
    back = tmp_path / "back"
    code, out, err = cli_main(capsys, "convert", half, back, "--dtype", "float32")
    assert code == 0 and f"wrote {back}" in out, err
    loaded, reference = (tf.saved_model.load(str(p)).signatures["serving_default"]
                         for p in (back, original))
    assert loaded.structured_input_signature == reference.structured_input_signature
    assert loaded.structured_outputs == reference.structured_outputs
    protos = []
    for path in (back, original):
        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString((path / "saved_model.pb").read_bytes())
        protos.append(proto.meta_graphs[0].graph_def)
    assert _op_dtypes(protos[0]) == _op_dtypes(protos[1])
    np.testing.assert_allclose(_serve(back)["y"].numpy(), _serve(original)["y"].numpy(),
                               rtol=1e-6, atol=1e-6)  # variables stayed float32: exact
    across, direct = tmp_path / "fp16", tmp_path / "direct_fp16"
    assert cli_main(capsys, "convert", half, across, "--dtype", "float16", *RULES)[0] == 0
    assert cli_main(capsys, "convert", original, direct, "--dtype", "float16", *RULES)[0] == 0
    assert (across / "saved_model.pb").read_bytes() == (direct / "saved_model.pb").read_bytes()
    np.testing.assert_allclose(_serve(across)["y"].numpy(), _serve(original)["y"].numpy(),
                               **TOLERANCES["float16"])


def test_variables_stored_in_half_come_back_in_float32(models, tmp_path, capsys):
    stored, back = tmp_path / "stored", tmp_path / "back"
    assert cli_main(capsys, "convert", models / "sm", stored, "--dtype", "bfloat16",
                    "--variables", "half", *RULES)[0] == 0
    reader = tf.train.load_checkpoint(str(stored / "variables" / "variables"))
    assert tf.bfloat16 in reader.get_variable_to_dtype_map().values()
    code, out, err = cli_main(capsys, "convert", stored, back, "--dtype", "float32")
    assert code == 0, err
    reader = tf.train.load_checkpoint(str(back / "variables" / "variables"))
    values = {k: v for k, v in reader.get_variable_to_dtype_map().items()
              if k.endswith("VARIABLE_VALUE")}
    assert set(values.values()) == {tf.float32} and len(values) == 3, values
    loaded = tf.saved_model.load(str(back))
    assert [v.dtype.name for v in (loaded.k, loaded.w, loaded.b)] == ["float32"] * 3
    np.testing.assert_allclose(_serve(back)["y"].numpy(), _serve(models / "sm")["y"].numpy(),
                               **TOLERANCES["bfloat16"])  # the weights were rounded once
    # across from there: float32 variables again, the float16 graph
    code, _, err = cli_main(capsys, "convert", stored, tmp_path / "fp16", "--dtype", "float16",
                            *RULES)
    assert code == 0, err
    np.testing.assert_allclose(_serve(tmp_path / "fp16")["y"].numpy(),
                               _serve(models / "sm")["y"].numpy(), **TOLERANCES["bfloat16"])
    code, _, err = cli_main(capsys, "convert", stored, tmp_path / "again", "--dtype",
                            "float16", "--variables", "half", *RULES)
    assert code == cli.EXIT_BAD_INPUT and "write it in float32 first" in err


def test_what_tf_mpt_cannot_undo_is_refused_saying_why(models, tmp_path, capsys):
    # a float32 model: nothing to undo
    code, _, err = cli_main(capsys, "convert", models / "sm", tmp_path / "b", "--dtype",
                            "float32")
    assert code == cli.EXIT_BAD_INPUT and "computes in float32 already" in err
    # a model made half by a Keras mixed policy, not by tf_mpt
    import keras
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        # its last layer float32, as Keras advises for the outputs: that part tf_mpt converts
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                                  keras.layers.Dense(4, dtype="float32")])
        model.export(str(tmp_path / "keras_mixed"), verbose=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    code, _, err = cli_main(capsys, "convert", tmp_path / "keras_mixed", tmp_path / "c",
                            "--dtype", "float32")
    assert code == cli.EXIT_BAD_INPUT and "tf_mpt did not convert it" in err and "float16" in err
    # ... and converted by tf_mpt on top: its Casts are marked 'mixed'
    code, _, err = cli_main(capsys, "convert", tmp_path / "keras_mixed", tmp_path / "mixed",
                            "--dtype", "float16", *RULES)
    assert code == 0, err
    code, _, err = cli_main(capsys, "convert", tmp_path / "mixed", tmp_path / "d", "--dtype",
                            "float32")
    assert code == cli.EXIT_BAD_INPUT and \
        "computed in half in places before tf_mpt converted it" in err, err
    # a graph rewritten by the API, not by `tf-mpt convert`: its Casts carry no mark
    import tf_mpt
    rewritten = tf_mpt.rewrite_graph_def(_graph_def(models / "frozen.pb"), dtype="float16",
                                         target="rules").graph_def
    (tmp_path / "api.pb").write_bytes(rewritten.SerializeToString())
    code, _, err = cli_main(capsys, "convert", tmp_path / "api.pb", tmp_path / "e.pb",
                            "--dtype", "float32")
    assert code == cli.EXIT_BAD_INPUT and "without the mark `tf-mpt convert` now writes" in err, err
    for name in ("b", "c", "d", "e.pb"):
        assert not os.path.exists(tmp_path / name)


def _tf1_saved_model(path):
    """A TF1 SavedModel (Builder, a signature by name, ref variables, a saver)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        w = tf.compat.v1.get_variable("w", [16, 8], use_resource=False,
                                      initializer=tf.compat.v1.glorot_uniform_initializer(1))
        y = tf.nn.softmax(tf.nn.relu(tf.matmul(x, w)), name="y")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(path))
            signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(
                sess, [tf.compat.v1.saved_model.SERVING], signature_def_map={"serve": signature})
            builder.save()


def test_a_converted_tf1_saved_model_goes_back_with_its_signature(tmp_path, capsys):
    original = tmp_path / "tf1"
    _tf1_saved_model(original)
    half, back = tmp_path / "half", tmp_path / "back"
    assert cli_main(capsys, "convert", original, half, "--dtype", "float16", *RULES)[0] == 0
    assert cli_main(capsys, "convert", half, back, "--dtype", "float32")[0] == 0
    metas = []
    for path in (back, original):
        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString((path / "saved_model.pb").read_bytes())
        metas.append(proto.meta_graphs[0])
    assert metas[0].signature_def == metas[1].signature_def
    assert _op_dtypes(metas[0].graph_def) == _op_dtypes(metas[1].graph_def)
    x = np.random.RandomState(1).uniform(-1, 1, (5, 16)).astype(np.float32)
    outputs = []
    for path in (back, original):
        with tf.compat.v1.Session(graph=tf.Graph()) as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(path))
            sig = meta.signature_def["serve"]
            outputs.append(sess.run(sig.outputs["y"].name, {sig.inputs["x"].name: x}))
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6, atol=1e-6)
