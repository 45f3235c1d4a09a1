"""`tf-mpt convert` on SavedModels, --validate / --inputs / --auto-deny, and `tf-mpt inspect`
--numerics / --tensorboard. The command runs in this process (cli.main) to keep the suite fast;
test_cli.py runs the real console entry point in subprocesses."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tf_mpt import cli
from support.tolerances import TOLERANCES
from support.helpers import cli_main, write_frozen


class _Dense(tf.Module):
    """x[?, 8] -> relu(x @ w1) -> {'y': ...}: a tf.Module with variables."""

    def __init__(self):
        super().__init__()
        init = tf.random.stateless_uniform([8, 16], seed=(1, 2), minval=-0.5, maxval=0.5)
        self.w1 = tf.Variable(init, name="w1")
        self.w2 = tf.Variable(tf.random.stateless_uniform([16, 4], seed=(3, 4), minval=-0.5,
                                                          maxval=0.5), name="w2")

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(self, x):
        hidden = tf.nn.relu(tf.matmul(x, self.w1))
        return {"y": tf.matmul(hidden, self.w2, name="logits")}


class _Overflows(tf.Module):
    """Overflows float16 at exactly one op: the MatMul named 'overflow' makes values around 1e5
    (float16's largest is 65504); the Sum after it is float16-deny, so float32 there is enough."""

    def __init__(self):
        super().__init__()
        self.small = tf.Variable(tf.eye(8) * 0.5, name="small")
        self.big = tf.Variable(tf.fill([8, 8], 3e4), name="big")

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(self, x):
        hidden = tf.matmul(x, self.small, name="safe")
        large = tf.matmul(tf.abs(hidden) + 1.0, self.big, name="overflow")
        return {"y": tf.reduce_sum(large, axis=1) * 1e-5}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    for name, module in (("dense", _Dense()), ("overflows", _Overflows())):
        tf.saved_model.save(module, str(root / name), signatures={"serving_default": module.serve})
    return root


def _half_ops(signature, dtype, op=None):
    """Op types (one entry per node) that run in `dtype` in a loaded signature's graph and
    functions; with `op`, the names of those nodes of that type."""
    graph_def = signature.graph.as_graph_def()
    nodes = list(graph_def.node)
    for fdef in graph_def.library.function:
        nodes.extend(fdef.node_def)
    enum = tf.as_dtype(dtype).as_datatype_enum
    half = [n for n in nodes if n.attr["T"].type == enum]
    if op is not None:
        return sorted(n.name for n in half if n.op == op)
    return sorted(n.op for n in half)


def _x(rows=5, seed=0):
    return tf.constant(np.random.RandomState(seed).uniform(-1, 1, (rows, 8)).astype(np.float32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_converted_tf_module_loads_with_same_signature_and_numbers(saved, tmp_path, capsys,
                                                                   dtype, no_cost_model):
    dst = tmp_path / "half"
    code, out, err = cli_main(capsys, "convert", saved / "dense", dst, "--dtype", dtype)
    assert code == 0, err
    assert f"nodes to {dtype} using" in out
    before = tf.saved_model.load(str(saved / "dense"))
    after = tf.saved_model.load(str(dst))
    assert list(after.signatures) == ["serving_default"]
    old, new = before.signatures["serving_default"], after.signatures["serving_default"]
    assert new.structured_input_signature == old.structured_input_signature
    assert new.structured_outputs == old.structured_outputs  # names, dtypes (float32), shapes
    assert _half_ops(new, dtype, op="MatMul") == ["MatMul", "logits"]
    assert "Relu" in _half_ops(new, dtype)
    assert _half_ops(old, dtype) == []
    expected, actual = old(x=_x())["y"], new(x=_x())["y"]
    assert actual.dtype == tf.float32
    np.testing.assert_allclose(actual.numpy(), expected.numpy(), **TOLERANCES[dtype])
    # The variables are the source's (float32, restored from the copied checkpoint).
    np.testing.assert_array_equal(after.w1.numpy(), before.w1.numpy())
    assert after.w1.dtype == tf.float32


def test_converted_keras_model_serves_in_half(tmp_path, capsys, no_cost_model):
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    model.export(str(tmp_path / "keras"), verbose=False)
    code, _, err = cli_main(capsys, "convert", tmp_path / "keras", tmp_path / "half",
                         "--dtype", "bfloat16", "--validate", "3")
    assert code == 0, err
    served = tf.saved_model.load(str(tmp_path / "half"))
    signature = served.signatures["serving_default"]
    assert _half_ops(signature, "bfloat16").count("MatMul") == 2
    (name, spec), = signature.structured_input_signature[1].items()
    assert spec.dtype == tf.float32
    actual = next(iter(signature(**{name: _x()}).values()))
    assert actual.dtype == tf.float32
    np.testing.assert_allclose(actual.numpy(), model(_x()).numpy(), **TOLERANCES["bfloat16"])


def test_validate_reports_errors_and_fails_past_the_tolerance(saved, tmp_path, capsys):
    code, out, _ = cli_main(capsys, "convert", saved / "dense", tmp_path / "ok", "--validate", "4")
    assert code == 0
    assert "validation passed on 4 sample(s)" in out
    row = [line for line in out.splitlines() if line.startswith("serving_default/y")][0]
    max_abs = float(row.split()[1])
    assert 0 < max_abs < TOLERANCES["float16"]["atol"]  # half really ran, and within tolerance
    code, out, err = cli_main(capsys, "convert", saved / "dense", tmp_path / "strict",
                           "--validate", "4", "--rtol", "0", "--atol", "1e-9")
    assert code == cli.EXIT_VALIDATION_FAILED == 1
    assert "validation failed: y differ(s) from float32" in err and "FAIL" in out
    assert not (tmp_path / "strict").exists()


def test_inputs_file_feeds_the_given_arrays(saved, tmp_path, capsys):
    np.savez(tmp_path / "in.npz", x=np.full((2, 8), 300.0, np.float32))
    code, out, err = cli_main(capsys, "convert", saved / "dense", tmp_path / "ok",
                           "--inputs", tmp_path / "in.npz")
    assert code == 0, err
    assert "validation passed on 1 sample(s)" in out
    np.savez(tmp_path / "wrong.npz", z=np.zeros((2, 8), np.float32))
    code, _, err = cli_main(capsys, "convert", saved / "dense", tmp_path / "no",
                         "--inputs", tmp_path / "wrong.npz")
    assert code == cli.EXIT_BAD_INPUT and "has no array for input 'x'" in err and \
        "keys: z" in err


def test_auto_deny_finds_the_overflowing_op(saved, tmp_path, capsys):
    dst = tmp_path / "fixed"
    code, out, err = cli_main(capsys, "convert", saved / "overflows", tmp_path / "plain",
                           "--validate", "4")
    assert code == cli.EXIT_VALIDATION_FAILED and "validation failed" in err  # (inf != 1e5)
    code, out, err = cli_main(capsys, "convert", saved / "overflows", dst, "--validate", "4",
                           "--auto-deny")
    assert code == 0, err
    kept = out.split("--auto-deny kept ")[1].splitlines()
    assert kept[0] == "1 node(s) in float32:"
    assert kept[1].strip().endswith("/overflow (MatMul)")
    served = tf.saved_model.load(str(dst)).signatures["serving_default"]
    assert _half_ops(served, "float16", op="MatMul") == ["safe"]
    expected = tf.saved_model.load(str(saved / "overflows")).signatures["serving_default"]
    np.testing.assert_allclose(served(x=_x())["y"].numpy(), expected(x=_x())["y"].numpy(),
                               **TOLERANCES["float16"])


def test_auto_deny_needs_samples(saved, tmp_path, capsys):
    code, _, err = cli_main(capsys, "convert", saved / "dense", tmp_path / "x", "--auto-deny")
    assert code == 2 and "--auto-deny needs sample inputs" in err


def test_numerics_names_the_first_overflow(saved, capsys):
    code, out, err = cli_main(capsys, "inspect", "--numerics", saved / "overflows", "--samples", "3")
    assert code == 0, err
    first = [line for line in out.splitlines() if line.startswith("first overflow:")][0]
    assert "/overflow:0 (MatMul, runs in half)" in first
    code, out, _ = cli_main(capsys, "inspect", saved / "overflows", "--numerics", "--samples", "3",
                         "--dtype", "bfloat16")
    assert "no tensor overflows bfloat16." in out
    code, out, _ = cli_main(capsys, "inspect", saved / "dense", "--numerics")
    assert "no tensor overflows float16." in out and "on 8 sample(s)" in out


def test_inspect_shows_flop_share_and_writes_an_annotated_tensorboard_graph(saved, tmp_path,
                                                                           capsys):
    code, out, err = cli_main(capsys, "inspect", saved / "dense", "--tensorboard", tmp_path / "tb")
    assert code == 0, err
    assert "half-precision share of MatMul/Conv FLOPs in serving_default: 100.0%" in out
    code, out, _ = cli_main(capsys, "inspect", saved / "dense", "--deny", "MatMul")
    assert "share of MatMul/Conv FLOPs in serving_default: 0.0%" in out
    events = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "tb") for f in files]
    assert events
    graph_def = None
    for event in tf.compat.v1.train.summary_iterator(events[0]):
        if event.graph_def:
            graph_def = tf.compat.v1.GraphDef.FromString(event.graph_def)
    assert graph_def is not None
    nodes = {n.name: n for f in graph_def.library.function for n in f.node_def}
    matmuls = [n for n in nodes.values() if n.op == "MatMul"]
    assert len(matmuls) == 2
    for node in matmuls:
        assert node.attr["_tf_mpt_colour"].s == b"allow"
        assert node.attr["_tf_mpt_reason"].s == b"op MatMul is on the allow list"
    casts = [n for n in nodes.values() if n.op == "Cast"]
    assert casts and all(n.attr["_tf_mpt_colour"].s == b"cast" for n in casts)


def test_frozen_graph_with_half_inputs_and_outputs(saved, tmp_path, capsys):
    module = _Dense()  # alive while its function is frozen
    write_frozen(module.serve.get_concrete_function(), tmp_path / "f.pb")
    code, out, err = cli_main(capsys, "convert", tmp_path / "f.pb", tmp_path / "half.pb",
                           "--no-keep-io-types", "--validate", "2")
    assert code == 0, err
    assert "validation passed on 2 sample(s)" in out
    graph_def = tf.compat.v1.GraphDef.FromString((tmp_path / "half.pb").read_bytes())
    nodes = {n.name: n for n in graph_def.node}
    assert nodes["x"].attr["dtype"].type == tf.float16.as_datatype_enum
    assert [n for n in graph_def.node if n.op == "Cast"] == []  # weights are half constants
    output = [n for n in graph_def.node if n.op == "Identity"][-1]
    assert output.attr["T"].type == tf.float16.as_datatype_enum


def test_saved_model_options_and_errors(saved, tmp_path, capsys):
    code, _, err = cli_main(capsys, "convert", saved / "dense", tmp_path / "a", "--no-keep-io-types")
    assert code == 2 and "works on frozen graphs only" in err
    code, _, err = cli_main(capsys, "convert", saved / "dense", tmp_path / "b", "--keep-fp32",
                         "no_such_node")
    assert code == 2 and "not in the model: no_such_node" in err
    code, _, err = cli_main(capsys, "convert", saved / "dense", tmp_path / "c", "--keep-fp32",
                         "logits")
    assert code == 0, err
    kept = tf.saved_model.load(str(tmp_path / "c")).signatures["serving_default"]
    assert _half_ops(kept, "float16", op="MatMul") == ["MatMul"]  # not 'logits'
    assert "Relu" in _half_ops(kept, "float16")
    code, _, _ = cli_main(capsys, "convert", saved / "dense", tmp_path / "d")
    # a converted model is converted from its float32 self again: the same model
    code, out, err = cli_main(capsys, "convert", tmp_path / "d", tmp_path / "e")
    assert code == 0 and "tf_mpt's conversion undone" in out, err
    assert (tmp_path / "e" / "saved_model.pb").read_bytes() == \
        (tmp_path / "d" / "saved_model.pb").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["c", "d", "e"]


def test_malformed_graph_gets_a_clear_error_and_nothing_is_written(tmp_path, capsys):
    graph_def = tf.compat.v1.GraphDef()
    node = graph_def.node.add(name="y", op="Relu", input=["missing"])
    node.attr["T"].type = tf.float32.as_datatype_enum
    (tmp_path / "bad.pb").write_bytes(graph_def.SerializeToString())
    code, _, err = cli_main(capsys, "convert", tmp_path / "bad.pb", tmp_path / "out.pb")
    assert code == cli.EXIT_BAD_INPUT and "holds a malformed graph" in err and "missing" in err
    assert not (tmp_path / "out.pb").exists()


def test_numerics_marks_half_what_convert_writes_for_the_target(saved, tmp_path, capsys):
    """--numerics says which tensors run in half from the model `convert` writes for the
    target: on a target whose half kernels are all 50x slower nothing converts, so the
    overflowing MatMul stays float32 (with the op lists it runs in half)."""
    import json  # pylint: disable=import-outside-toplevel
    from conftest import OP_COSTS_TABLE  # pylint: disable=import-outside-toplevel
    with open(OP_COSTS_TABLE) as f:
        tables = json.load(f)
    for table in tables:
        table["half"] = {op: [[n, t * 50] for n, t in points]
                         for op, points in table["half"].items()}
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(tables))
    for target, where in ((str(slow), "stays float32 after conversion"),
                          ("rules", "runs in half")):
        code, out, err = cli_main(capsys, "inspect", saved / "overflows", "--numerics",
                                  "--samples", "3", "--target", target)
        assert code == 0, err
        first = [line for line in out.splitlines() if line.startswith("first overflow:")][0]
        assert f"/overflow:0 (MatMul, {where})" in first, out
