"""One-pass blame (`tf-mpt convert --auto-deny`, `tf-mpt inspect --numerics --blame`): the
nodes whose own half error jumps, or that carry values beyond the half range, found from one
run of each model; against bisection on a model with planted faults."""

import re

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from support.helpers import cli_main
from tf_mpt.models import blame

LAYERS, WIDTH, BIG = 24, 32, (7, 16)  # layers BIG overflow float16: values around 1e6


def _mlp_graph_def():
    """A frozen 24-layer ReLU MLP (He init) whose layers 7 and 16 make values around 1e6 (float16's
    largest is 65504) and whose next layers scale them back."""
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default():
        h = tf.compat.v1.placeholder(tf.float32, [None, WIDTH], name="x")
        for k in range(LAYERS):
            w = rng.normal(0, np.sqrt(2 / WIDTH), (WIDTH, WIDTH)).astype(np.float32)
            w *= 1e6 if k in BIG else 1e-6 if k - 1 in BIG else 1.0
            with tf.name_scope(f"layer_{k}"):
                h = tf.nn.relu(tf.matmul(h, tf.constant(w), name="MatMul"), name="Relu")
        tf.identity(h, name="y")
    return graph.as_graph_def()


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = tmp_path_factory.mktemp("blame") / "mlp.pb"
    path.write_bytes(_mlp_graph_def().SerializeToString())
    return path


def _kept(out):
    lines = out.split("--auto-deny kept ")[1].splitlines()
    count = int(lines[0].split()[0])
    return sorted(line.strip().split(" ")[0] for line in lines[1:count + 1])


def test_auto_deny_blames_the_overflowing_stretches_in_one_trial(mlp, tmp_path, capsys,
                                                                 no_cost_model):
    """Blame keeps float32 each big layer's MatMul and Relu (values beyond 65504) and the next
    layer's subnormal weights with the MatMul that reads them, validated once; bisection needs
    many trials for the same model."""
    code, out, err = cli_main(capsys, "convert", mlp, tmp_path / "blamed.pb", "--validate",
                              "4", "--auto-deny")
    assert code == 0, err
    assert re.search(r"--auto-deny found them by one-pass blame, validated once: 1 trial\(s\)",
                     out), out
    # blamed: each big layer's MatMul and Relu (beyond 65504), and the next layer's weights
    # (1e-6: subnormal in float16, a second planted fault) with the MatMul that reads them;
    # kept: the MatMuls alone give that conversion (the Relu and the weights between them
    # stay float32 with nothing half beside them)
    blamed = sorted(f"layer_{k}/{op}" for b in BIG for k, op in
                    ((b, "MatMul"), (b, "Relu"), (b + 1, "Const"), (b + 1, "MatMul")))
    assert sorted(re.findall(r"^  (layer_\d+/\w+) \(\w+\): error", out, re.M)) == blamed
    expected = sorted(f"layer_{k}/MatMul" for b in BIG for k in (b, b + 1))
    assert _kept(out) == expected
    for b in BIG:  # each blamed node with its error before and once kept float32
        line = next(l for l in out.splitlines() if l.startswith(f"  layer_{b}/MatMul (MatMul)"
                                                               f": error"))
        assert re.fullmatch(r"  layer_\d+/MatMul \(MatMul\): error inf \(inputs (inf|[\d.e+-]+)\) "
                            r"-> [\d.e+-]+ kept float32", line), line
        assert float(line.split("-> ")[1].split()[0]) < blame.FLOOR["float16"]
    code, bisected, err = cli_main(capsys, "convert", mlp, tmp_path / "bisected.pb",
                                   "--validate", "4", "--auto-deny", "--bisect")
    assert code == 0, err
    trials = int(re.search(r"found them by bisection: (\d+) trial", bisected).group(1))
    assert trials > 8, bisected  # about log2(converted nodes) per needed node
    assert _kept(bisected) == expected, bisected  # the same nodes
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString((tmp_path / "blamed.pb").read_bytes())
    half = {n.name for n in graph_def.node if n.attr["T"].type == tf.float16.as_datatype_enum}
    assert "layer_0/MatMul" in half and not set(blamed) & half


def test_inspect_numerics_blame_names_the_nodes_without_converting(mlp, capsys, no_cost_model):
    code, out, err = cli_main(capsys, "inspect", mlp, "--numerics", "--blame", "--samples", "3")
    assert code == 0, err
    assert "one-pass blame: 8 node(s) whose own float16 error jumps" in out, out
    assert "--keep-fp32 layer_7/MatMul,layer_7/Relu,layer_8/Const,layer_8/MatMul," \
        "layer_16/MatMul,layer_16/Relu,layer_17/Const,layer_17/MatMul\n" in out, out
    code, out, err = cli_main(capsys, "inspect", mlp, "--numerics", "--blame", "--dtype",
                              "bfloat16", "--samples", "3")
    assert code == 0, err
    assert "one-pass blame: no node's own bfloat16 error jumps" in out
    code, _, err = cli_main(capsys, "inspect", mlp, "--blame")
    assert code == 2 and "--blame runs on --numerics' samples" in err


def test_the_first_divergence_is_blamed_not_the_error_it_propagates(no_cost_model):
    """(x + 1000) - 1000 in bfloat16: the Add rounds its output (error ~ roundoff), the Sub
    cancels and its relative error jumps; the ops after it only carry that error."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [16, 64], name="x")
        w = tf.constant(np.eye(64, dtype=np.float32), name="w")
        h = tf.matmul(x, w, name="mm")
        shifted = tf.add(h, 1000.0, name="shift")
        back = tf.subtract(shifted, 1000.0, name="back")
        tf.identity(tf.matmul(tf.nn.relu(back, name="relu"), w, name="mm2"), name="y")
    reference = graph.as_graph_def()
    converted = tf_mpt.rewrite_graph_def(reference, dtype="bfloat16", fetches=["y"],
                                         strict=True).graph_def
    feeds = [{"x": np.random.RandomState(s).uniform(0.1, 1, (16, 64)).astype(np.float32)}
             for s in range(2)]
    errors = blame.node_errors(reference, converted, feeds, "bfloat16")
    assert errors["shift"].half and errors["shift"].error < 4 * blame.ROUNDOFF["bfloat16"]
    assert errors["back"].error > 0.1 and errors["back"].input_error == errors["shift"].error
    assert [e.name for e in blame.blame(errors, "bfloat16", reference)] == ["back"]
    assert errors["mm2"].error > 0.1 and not errors["mm2"].jumps("bfloat16")
