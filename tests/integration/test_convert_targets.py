"""One model, any machine: `tf-mpt convert --target` gives the same bytes on every CPU kind
(flags injected), honours an explicit --dtype on CPUs without native bfloat16, and a table
written by `tf-mpt measure` decides on another machine without measuring."""

import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_mpt import cli
from support.helpers import cli_main, executed_function_graphs
from support.helpers import child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TABLE = os.environ["TF_MPT_OP_COSTS"]  # the Zen 4 table conftest.py injects
# (CPU kind, its flags as /proc/cpuinfo lists them)
CPUS = (("zen4", "avx2 avx512f avx512bw avx512_bf16"),
        ("cascade_lake", "avx2 avx512f avx512bw avx512_vnni"),
        ("zen3", "avx avx2 fma f16c"))
TIMEOUT_S = 300


class _ConvNet(tf.Module):
    """x[?, 32, 32, 3] -> conv 3x3 (16) -> relu -> conv 3x3 (32) -> relu -> mean -> dense 10."""

    def __init__(self):
        super().__init__()
        def init(shape, seed):
            return tf.random.stateless_uniform(shape, seed=(seed, 0), minval=-0.2, maxval=0.2)
        self.k1 = tf.Variable(init([3, 3, 3, 16], 1), name="k1")
        self.k2 = tf.Variable(init([3, 3, 16, 32], 2), name="k2")
        self.w = tf.Variable(init([32, 10], 3), name="w")
        self.b = tf.Variable(tf.zeros([10]), name="b")

    @tf.function(input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32, name="x")])
    def serve(self, x):
        h = tf.nn.relu(tf.nn.conv2d(x, self.k1, 1, "SAME", name="conv1"))
        h = tf.nn.relu(tf.nn.conv2d(h, self.k2, 1, "SAME", name="conv2"))
        return {"logits": tf.nn.bias_add(tf.matmul(tf.reduce_mean(h, [1, 2]), self.w), self.b)}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("targets") / "convnet")
    module = _ConvNet()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


# Each process converts the model for every target asked for, as `tf-mpt convert` does.
_CONVERT_ALL = """
import sys
from tf_mpt import cli
src, out, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
for target in targets:
    label = "table" if target.endswith(".json") else target
    cli.main(["convert", src, f"{out}/{label}", "--dtype", "bfloat16", "--target", target])
"""


def _digest(directory):
    with open(os.path.join(directory, "saved_model.pb"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _half_ops(directory):
    loaded = tf.saved_model.load(directory).signatures["serving_default"]
    graph_def = loaded.graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return sorted(n.op for n in nodes if n.op in ("Conv2D", "MatMul")
                  and n.attr["T"].type == tf.bfloat16.as_datatype_enum)


# Zen 4 (the table's verdicts) and Zen 3 (no native bfloat16) by default; Cascade Lake (no
# native bfloat16 either, AVX-512) as well under -m heavy
@pytest.mark.parametrize("kinds", [pytest.param(("zen4", "zen3"), id="zen4-zen3"), pytest.param(
    tuple(kind for kind, _ in CPUS), marks=pytest.mark.heavy, id="every-kind")])
def test_the_same_model_converts_to_the_same_bytes_on_every_cpu(saved_model, tmp_path, kinds):
    digests, outputs = {}, {}
    for seed, (kind, flags) in enumerate(cpu for cpu in CPUS if cpu[0] in kinds):
        out = tmp_path / kind
        out.mkdir()
        env = child_env()
        # another CPU's flags, and another order of Python's sets and dicts of strings
        env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_CPU_FLAGS=flags,
                   PYTHONHASHSEED=str(seed + 1))
        targets = ["rules", TABLE] + (["auto"] if kind != "zen4" else [])
        proc = subprocess.run([sys.executable, "-c", _CONVERT_ALL, saved_model, str(out),
                               *targets], env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[kind] = proc.stdout
        for target in ("rules", "table", "auto"):
            if (out / target).is_dir():
                digests[kind, target] = _digest(str(out / target))
    # rules and the table: one output whatever the CPU; auto without native bfloat16 is rules
    assert len({d for (_, target), d in digests.items() if target != "table"}) == 1, digests
    assert len({d for (_, target), d in digests.items() if target == "table"}) == 1, digests
    for kind in {"cascade_lake", "zen3"} & set(kinds):
        assert "target: rules (this CPU has no native bfloat16: its timings say nothing" in \
            outputs[kind], outputs[kind]
        assert "for target rules" in outputs[kind]
    assert "for target op_costs_zen4.json" in outputs["zen4"]
    # the dtype asked for is honoured: every convolution and the dense layer in bfloat16
    assert _half_ops(str(tmp_path / "zen3" / "auto")) == ["Conv2D", "Conv2D", "MatMul"]


# under -m heavy (it measures the model here): the table target's replay on other CPUs stays
# in the default run (test_graph_timing.py's, and the Zen 4 table above)
@pytest.mark.heavy
def test_a_measured_table_decides_on_another_machine_without_measuring(saved_model, tmp_path,
                                                                       capsys, monkeypatch):
    """`tf-mpt measure --model` on the serving machine (here), then `convert --target FILE`
    on machines of three kinds (flags injected): nothing measured, the model's node times
    read from the table, the same bytes on each."""
    table = tmp_path / "costs.json"
    from tf_mpt.costs import dispatch  # (its child is tests/unit/test_dispatch_check.py's)
    monkeypatch.setattr(dispatch, "_in_child", lambda dtype, ops: {
        "dispatch": {"MatMul": 1.25}, "numerics": {"MatMul": 2.5}})
    code, out, err = cli_main(capsys, "measure", "--dtype", "bfloat16", "--model", saved_model,
                              "--out", table)
    assert code == 0, err
    assert re.match(rf"wrote {table}: bfloat16 costs and 3 node shape\(s\) of {saved_model} "
                    "measured on ", out), out
    from tf_mpt.costs import op_costs
    (written,) = json.loads(table.read_text())
    costs = op_costs.OpCosts.from_dict(written)
    assert written["dispatch"] == {"MatMul": 1.25} and written["numerics"] == {"MatMul": 2.5}
    assert costs.dtype == "bfloat16" and {"MatMul", "Conv2D"} <= set(costs.half)
    ops = sorted(json.loads(spec)["op"] for spec in written["nodes"])
    assert ops == ["Conv2D", "Conv2D", "MatMul"]  # the model's two convolutions and its dense
    assert all(f > 0 and h > 0 for f, h in written["nodes"].values())

    def no_measuring(*args, **kwargs):
        raise AssertionError(f"measured with a table target: {args} {kwargs}")
    monkeypatch.setattr(op_costs, "_in_child", no_measuring)
    monkeypatch.delenv("TF_MPT_OP_COSTS")
    digests = set()
    for kind, flags in CPUS:
        monkeypatch.setenv("TF_MPT_CPU_FLAGS", flags)
        dst = tmp_path / f"converted_{kind}"
        with op_costs.recording_node_specs() as asked:
            code, out, err = cli_main(capsys, "convert", saved_model, dst, "--dtype",
                                      "bfloat16", "--target", table)
        assert code == 0, err
        assert out.startswith("target: costs.json\n") and "for target costs.json" in out, out
        assert asked == set(written["nodes"])  # every time the cost model asked, the table had
        digests.add(_digest(str(dst)))
    assert len(digests) == 1


def test_measure_into_an_unwritable_path_says_so(tmp_path, capsys, monkeypatch):
    from tf_mpt.costs import dispatch
    from tf_mpt.costs import probes
    monkeypatch.setattr(dispatch, "_in_child", lambda dtype, ops: {})
    measured = []
    monkeypatch.setattr(probes, "measure", lambda dtype: measured.append(dtype) or
                        op_costs_table(dtype))
    code, _, err = cli_main(capsys, "measure", "--dtype", "bfloat16", "--out",
                            tmp_path / "missing_dir" / "t.json")
    assert code == 2 and measured == ["bfloat16"]
    assert "tf-mpt measure: cannot write" in err and "pass a writable path with --out" in err


def op_costs_table(dtype):
    """The suite's injected table for `dtype` (what a measurement would return)."""
    from tf_mpt.costs import op_costs
    (table,) = [t for t in json.loads(open(TABLE).read()) if t["dtype"] == dtype]
    return op_costs.OpCosts.from_dict(table)


def test_a_bad_target_stops_the_command_with_the_fix(saved_model, tmp_path, capsys):
    code, _, err = cli_main(capsys, "convert", saved_model, tmp_path / "out", "--dtype",
                            "bfloat16", "--target", "zen4")
    assert code == cli.EXIT_BAD_INPUT and "no such file" in err and "tf-mpt measure --out FILE" in err
    assert not (tmp_path / "out").exists()


def _slow_half_table(path):
    """The Zen 4 table with every bfloat16 kernel 50x slower: a target where the cost model
    keeps everything float32."""
    import json
    with open(TABLE) as f:
        tables = json.load(f)
    for table in tables:
        table["half"] = {op: [[n, t * 50] for n, t in points]
                         for op, points in table["half"].items()}
    path.write_text(json.dumps(tables))
    return path


def test_inspect_shows_the_decisions_convert_makes_for_the_same_target(saved_model, tmp_path,
                                                                       capsys):
    """The FLOP share, the per-op table and the summary of `inspect` are those of the model
    `convert` writes for that target: 0% where it converted nothing, never a share of
    decisions made on another graph."""
    slow = str(_slow_half_table(tmp_path / "slow.json"))
    for label, target, share, converted_nodes in (("slow", slow, "0.0%", r"0"),
                                                  ("rules", "rules", "100.0%", r"[1-9]\d*")):
        code, converted, err = cli_main(capsys, "convert", saved_model, tmp_path / label,
                                        "--dtype", "bfloat16", "--target", target)
        assert code == 0, err
        summary = re.search(r"^saved_model: (Converted (\d+)/\d+ nodes .*)$", converted, re.M)
        assert summary and re.fullmatch(converted_nodes, summary.group(2)), converted
        code, inspected, err = cli_main(capsys, "inspect", saved_model, "--dtype", "bfloat16",
                                        "--target", target)
        assert code == 0, err
        assert f"== saved_model: {summary.group(1)}\n" in inspected, inspected
        assert (f"half-precision share of MatMul/Conv FLOPs in serving_default: {share}\n"
                in inspected), inspected
        assert _half_ops(str(tmp_path / label)) == (
            [] if label == "slow" else ["Conv2D", "Conv2D", "MatMul"])


class _Wide(tf.Module):
    """x[64, 512] -> dense 512 -> relu -> dense 512 -> relu -> dense 10: products wide enough
    that bfloat16 pays on a CPU with native bfloat16 (the Zen 4 table converts them)."""

    def __init__(self):
        super().__init__()
        def init(shape, seed):
            return tf.random.stateless_uniform(shape, seed=(seed, 0), minval=-0.05,
                                               maxval=0.05)
        self.w1 = tf.Variable(init([512, 512], 1), name="w1")
        self.w2 = tf.Variable(init([512, 512], 2), name="w2")
        self.w3 = tf.Variable(init([512, 10], 3), name="w3")

    @tf.function(input_signature=[tf.TensorSpec([64, 512], tf.float32, name="x")])
    def serve(self, x):
        h = tf.nn.relu(tf.matmul(x, self.w1))
        h = tf.nn.relu(tf.matmul(h, self.w2))
        return {"logits": tf.matmul(h, self.w3)}


def _executed_half_matmuls(directory, x):
    """(outputs, bfloat16 MatMuls TensorFlow executed) of the SavedModel's serving function."""
    serve = tf.saved_model.load(directory).signatures["serving_default"]
    out, graphs = executed_function_graphs(lambda: serve(x=x)["logits"].numpy())
    return out, sum(1 for g in graphs for n in g.node if "MatMul" in n.op
                    and n.attr["T"].type == tf.bfloat16.as_datatype_enum)


def test_a_table_target_converts_what_it_weighs_faster_and_it_runs_half(tmp_path, capsys):
    """`convert --target TABLE` (the suite's Zen 4 table): the cost model weighs the wide
    products as faster in bfloat16 and converts them; the converted model executes them in
    bfloat16 and gives float32's outputs within bfloat16's tolerance."""
    from support.tolerances import TOLERANCES  # pylint: disable=import-outside-toplevel
    source, dst = str(tmp_path / "wide"), tmp_path / "wide_bf16"
    module = _Wide()
    tf.saved_model.save(module, source, signatures={"serving_default": module.serve})
    code, out, err = cli_main(capsys, "convert", source, dst, "--dtype", "bfloat16",
                              "--target", TABLE)
    assert code == 0, err
    assert re.search(r"Converted [1-9]\d*/\d+ nodes to bfloat16 .* for target "
                     r"op_costs_zen4\.json", out), out
    x = tf.random.stateless_normal([64, 512], seed=(4, 0))
    want, float32_half = _executed_half_matmuls(source, x)
    got, half = _executed_half_matmuls(str(dst), x)
    assert float32_half == 0 and half >= 2, (float32_half, half)
    # atol relative to the outputs' scale: a logit near 0 has no relative precision
    tolerance = TOLERANCES["bfloat16"]
    np.testing.assert_allclose(got, want, rtol=tolerance["rtol"],
                               atol=tolerance["atol"] * np.abs(want).max())


def test_the_command_passes_its_target_to_every_rewrite_and_leaves_the_environment(
        saved_model, tmp_path, capsys, monkeypatch):
    """--target reaches the rewrite as its Config, not through os.environ: during the
    rewrite TF_MPT_TARGET is what the caller set (here unset), and after it too."""
    from tf_mpt import rewrite as _rewrite  # pylint: disable=import-outside-toplevel
    monkeypatch.delenv("TF_MPT_TARGET", raising=False)
    seen = []
    original = _rewrite.rewrite_with_library

    def recording(*args, **kwargs):
        seen.append((os.environ.get("TF_MPT_TARGET"), kwargs["config"].target))
        return original(*args, **kwargs)
    monkeypatch.setattr(_rewrite, "rewrite_with_library", recording)
    before = dict(os.environ)
    code, out, err = cli_main(capsys, "convert", saved_model, tmp_path / "rules", "--dtype",
                              "bfloat16", "--target", "rules")
    assert code == 0, err
    assert "for target rules" in out and seen and set(seen) == {(None, "rules")}, (out, seen)
    assert dict(os.environ) == before
