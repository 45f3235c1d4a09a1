"""`tf-mpt convert` and `tf-mpt inspect`: frozen graphs through the console entry point in
subprocesses, options and bad inputs through cli.main in this process, and inspect on both
kinds (SavedModel conversion, validation and the inspect options: test_cli_saved_model.py)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_mpt import cli
from support.tolerances import TOLERANCES
from support.helpers import cli_main, run, write_frozen

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c",
                           "import sys; from tf_mpt.cli import main; main(sys.argv[1:])", *args],
                          env=env, capture_output=True, text=True, timeout=300)


class _Model(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.random.stateless_uniform([8, 8], seed=(1, 2), minval=-0.5,
                                                         maxval=0.5))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w), name="y")}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    model = _Model()
    tf.saved_model.save(model, str(root / "sm"), signatures={"serving_default": model.serve})
    data = write_frozen(model.serve.get_concrete_function(), root / "frozen.pb")
    (root / "truncated.pb").write_bytes(data[:40])
    (root / "notes.txt").write_bytes(b"just some text, not a model\n")
    (root / "not_a_model").mkdir()
    (root / "not_a_model" / "README").write_bytes(b"nothing here\n")
    (root / "broken_sm").mkdir()
    (root / "broken_sm" / "saved_model.pb").write_bytes(
        (root / "sm" / "saved_model.pb").read_bytes()[:100])
    return root


def _run_graph_def(graph_def, x):
    out = [n.name for n in graph_def.node if n.op == "Identity"][-1]
    return run(graph_def, f"{out}:0", {"x:0": x})


# float16 under -m heavy (the SavedModel conversions in the default run cover it)
@pytest.mark.parametrize("dtype", [pytest.param("float16", marks=pytest.mark.heavy), "bfloat16"])
def test_convert_frozen_graph_keeps_io_types_and_numbers(models, tmp_path, dtype):
    root = models
    dst = tmp_path / "half.pb"
    # a [None, 8] x [8, 8] layer: the op lists convert it (the cost model would not)
    proc = _cli("convert", str(root / "frozen.pb"), str(dst), "--dtype", dtype,
                "--target", "rules")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "graph: Converted" in proc.stdout and f"nodes to {dtype} using" in proc.stdout
    before, after = tf.compat.v1.GraphDef(), tf.compat.v1.GraphDef()
    before.ParseFromString((root / "frozen.pb").read_bytes())
    after.ParseFromString(dst.read_bytes())
    matmul = [n for n in after.node if n.op == "MatMul"][0]
    assert matmul.attr["T"].type == tf.as_dtype(dtype).as_datatype_enum
    x = np.random.RandomState(0).uniform(-1, 1, (3, 8)).astype(np.float32)
    expected, actual = _run_graph_def(before, x), _run_graph_def(after, x)
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, **TOLERANCES[dtype])


def test_convert_options_deny_keep_fp32_and_force(models, tmp_path, capsys):
    root = models  # in-process (cli.main): the options, not the console start-up, are tested
    denied = tmp_path / "denied.pb"
    assert cli_main(capsys, "convert", root / "frozen.pb", denied, "--deny", "MatMul")[0] == 0
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(denied.read_bytes())
    assert all(n.attr["T"].type == tf.float32.as_datatype_enum
               for n in graph_def.node if n.op == "MatMul")
    matmul = [n.name for n in graph_def.node if n.op == "MatMul"][0]
    def read(path):
        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(path.read_bytes())
        return ({n.name: tf.as_dtype(n.attr["T"].type).name for n in graph_def.node
                 if n.op == "MatMul"}, sorted(n.name for n in graph_def.node if n.op == "Cast"))

    kept = tmp_path / "kept.pb"
    code, out, _ = cli_main(capsys, "convert", root / "frozen.pb", kept, "--keep-fp32", matmul)
    assert code == 0 and "Converted 0/" in out, out
    assert read(kept) == ({matmul: "float32"}, [])  # the one MatMul kept: nothing to convert
    half = tmp_path / "half.pb"
    assert cli_main(capsys, "convert", root / "frozen.pb", half)[0] == 0
    half_matmuls, half_casts = read(half)
    assert half_matmuls == {matmul: "float16"} and len(half_casts) == 2  # x in, y out
    # converting a converted model undoes its conversion first: no Cast of a Cast
    code, out, err = cli_main(capsys, "convert", half, tmp_path / "again.pb")
    assert code == 0 and "tf_mpt's conversion undone" in out, err
    assert (tmp_path / "again.pb").read_bytes() == half.read_bytes()
    # --force converts it as it is, on top of its conversion: nothing undone, its half nodes
    # counted as half already, no Cast added to its Casts
    code, out, err = cli_main(capsys, "convert", half, tmp_path / "forced.pb", "--force")
    assert code == 0 and "undone" not in out, err
    assert re.search(r"Converted 0/\d+ nodes to float16 using 0 cast\(s\) .*; [1-9]\d* more "
                     r"were float16 already", out), out
    assert read(tmp_path / "forced.pb") == (half_matmuls, half_casts)


@pytest.mark.parametrize("source, message", [
    ("missing.pb", "does not exist"),
    ("truncated.pb", "is not a GraphDef protocol buffer"),
    ("notes.txt", "is not a GraphDef protocol buffer|holds no graph nodes"),
    ("not_a_model", "is a directory without saved_model.pb"),
    ("broken_sm", "is not a SavedModel protocol buffer"),
])
def test_bad_sources_get_a_clear_error_and_nothing_is_written(models, tmp_path, capsys, source,
                                                              message):
    import re
    root = models
    dst = tmp_path / "out.pb"
    code, _, err = cli_main(capsys, "convert", root / source, dst)  # in-process: no start-up
    assert code == cli.EXIT_BAD_INPUT == 4
    assert re.search(message, err), err[-2000:]
    assert not dst.exists() and os.listdir(tmp_path) == []


def test_existing_destination_is_never_overwritten(models, tmp_path, capsys):
    root = models
    dst = tmp_path / "exists.pb"
    dst.write_bytes(b"keep me")
    code, _, err = cli_main(capsys, "convert", root / "frozen.pb", dst)
    assert code == cli.EXIT_USAGE == 2 and "already exists" in err
    assert dst.read_bytes() == b"keep me"


# (a frozen graph's conversion: test_convert_frozen_graph_keeps_io_types_and_numbers)
@pytest.mark.parametrize("source", [pytest.param("frozen.pb", marks=pytest.mark.heavy), "sm"])
def test_inspect_prints_a_table_and_json(models, source, no_cost_model):
    root = models
    proc = _cli("inspect", str(root / source), "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "nodes to bfloat16 using" in proc.stdout
    matmul_row = [line for line in proc.stdout.splitlines() if line.startswith("MatMul")]
    assert matmul_row and matmul_row[0].split()[1] == "1"  # one MatMul would run in half
    data = json.loads(_cli("inspect", str(root / source), "--json").stdout)
    report = next(iter(data.values()))
    assert any(d["op"] == "MatMul" and d["colour"] == "allow" for d in report["nodes"].values())


def test_convert_json_is_one_document_of_the_reports_and_what_was_written(models, tmp_path,
                                                                          capsys):
    """convert --json: stdout holds one JSON document (each report with its verdict, the
    destination); the lines convert prints otherwise go to stderr."""
    import json
    dst = tmp_path / "half.pb"
    code, out, err = cli_main(capsys, "convert", models / "frozen.pb", dst, "--json",
                              "--target", "rules", "--dtype", "bfloat16")
    assert code == 0, err
    found = json.loads(out)
    assert found["wrote"] == str(dst) and dst.exists()
    (report,) = found["reports"].values()
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(dst.read_bytes())
    half = [n for n in graph_def.node if n.op == "MatMul" and
            n.attr["T"].type == tf.bfloat16.as_datatype_enum]
    assert report["converted_nodes"] >= len(half) > 0 and report["dtype"] == "bfloat16"
    assert report["target"] == "rules" and "verdict" in report  # (rules: nothing timed)
    assert report["verdict"] is None
    assert f"wrote {dst}" in err
