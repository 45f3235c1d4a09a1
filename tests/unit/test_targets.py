"""The target a rewrite decides for: parsed from TF_MPT_TARGET / target=, resolved per dtype and
CPU (flags injected as each CPU kind's), and named in the report."""

import logging
import os

import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt import config as _config
from tf_mpt import targets

TABLE = os.environ["TF_MPT_OP_COSTS"]  # the Zen 4 table conftest.py injects
ZEN4 = "avx2 avx512f avx512bw avx512_bf16"
AMX = "avx2 avx512f avx512_bf16 amx_tile amx_bf16"
CASCADE_LAKE = "avx2 avx512f avx512bw avx512_vnni"
ZEN3 = "avx avx2 fma f16c"


def _config_of(**env):
    return _config.Config.from_env({f"TF_MPT_{k}": v for k, v in env.items()})


@pytest.mark.parametrize("env, dtype, kind, table", [
    # asked for: that target, whatever the CPU
    ({"TARGET": "rules", "CPU_FLAGS": ZEN4}, "bfloat16", "rules", None),
    ({"TARGET": "here", "CPU_FLAGS": ZEN3}, "bfloat16", "here", None),
    ({"TARGET": "here", "CPU_FLAGS": ZEN3}, "float16", "here", None),
    ({"TARGET": TABLE, "CPU_FLAGS": ZEN3}, "float16", "table", TABLE),
    ({"TARGET": "HERE", "OP_COSTS": TABLE}, "bfloat16", "here", TABLE),  # its stand-in table
    # auto: here only for bfloat16 on a CPU with native bfloat16
    ({"CPU_FLAGS": ZEN4}, "bfloat16", "here", None),
    ({"CPU_FLAGS": AMX}, "bfloat16", "here", None),
    ({"CPU_FLAGS": CASCADE_LAKE}, "bfloat16", "rules", None),
    ({"CPU_FLAGS": ZEN3}, "bfloat16", "rules", None),
    ({"CPU_FLAGS": ZEN4}, "float16", "rules", None),
    # the older switches, aliases of the target
    ({"CPU_FLAGS": ZEN4, "COST_MODEL": "0"}, "bfloat16", "rules", None),
    ({"CPU_FLAGS": ZEN3, "COST_MODEL": "1"}, "float16", "here", None),
    ({"CPU_FLAGS": ZEN3, "OP_COSTS": TABLE}, "bfloat16", "table", TABLE),
    ({"CPU_FLAGS": ZEN3, "OP_COSTS": TABLE}, "float16", "rules", None),
    ({"CPU_FLAGS": ZEN3, "OP_COSTS": TABLE, "COST_MODEL": "1"}, "float16", "here", TABLE),
    ({"CPU_FLAGS": ZEN4, "TARGET": "rules", "COST_MODEL": "auto"}, "bfloat16", "rules", None),
], ids=lambda v: v if isinstance(v, str) and len(v) < 12 else None)
def test_the_target_follows_the_request_then_the_cpu(env, dtype, kind, table):
    target = targets.resolve(_config_of(**env), dtype)
    assert (target.kind, target.table) == (kind, table)
    assert target.measures == (kind == "here" and table is None)


def test_auto_on_a_cpu_without_native_bfloat16_says_why_once(caplog):
    config = _config_of(CPU_FLAGS=CASCADE_LAKE)
    target = targets.resolve(config, "bfloat16")
    assert target.why.startswith("this CPU has no native bfloat16: its timings say nothing")
    targets._said.clear()  # pylint: disable=protected-access
    with caplog.at_level(logging.INFO, logger="tf_mpt"):
        for _ in range(3):
            targets.say_why_once(targets.resolve(config, "bfloat16"), "bfloat16")
    lines = [r.getMessage() for r in caplog.records if "target for bfloat16" in r.getMessage()]
    assert lines == [f"target for bfloat16: rules ({target.why})"]


def test_a_gpu_makes_auto_follow_the_rules():
    target = targets.resolve(_config_of(CPU_FLAGS=ZEN4), "bfloat16", gpu_visible=True)
    assert target.kind == "rules" and "GPU" in target.why


@pytest.mark.parametrize("value, message", [
    ("fastest", "no such file"),
    ("  ", "must be auto, here, rules or the path of a cost table"),
])
def test_a_bad_target_is_refused_naming_the_value_and_the_fix(value, message):
    with pytest.raises(ValueError, match=message) as error:
        _config_of(TARGET=value) if value.strip() == value else targets.parse(value)
    assert "tf-mpt measure --out FILE" in str(error.value)


def test_the_target_and_its_older_switch_must_agree():
    with pytest.raises(ValueError, match="TF_MPT_TARGET='here' and TF_MPT_COST_MODEL='0' ask "
                       "for different targets.*Unset TF_MPT_COST_MODEL"):
        _config_of(TARGET="here", COST_MODEL="0")


def test_a_table_target_is_kept_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(TABLE))
    assert _config_of(TARGET=os.path.basename(TABLE)).target == TABLE
    assert tf_mpt.Config(target=os.path.basename(TABLE)).target == TABLE
    with pytest.raises(ValueError, match="Config.target"):
        tf_mpt.Config(target=str(tmp_path / "missing.json"))


def _mlp_graph_def():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 256], name="x")
        w = tf.constant(0.01, tf.float32, [256, 256], name="w")
        tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w)), w), name="y")
    return graph.as_graph_def()


def test_the_summary_and_the_report_name_the_target():
    graph_def = _mlp_graph_def()
    rules = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", target="rules").report
    assert rules.target == "rules" and rules.to_dict()["target"] == "rules"
    assert rules.summary() == "Converted 4/6 nodes to bfloat16 using 2 cast(s) for target rules"
    table = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", target=TABLE).report
    assert table.target == "op_costs_zen4.json"
    with pytest.raises(ValueError, match="target must be auto, here, rules or the path"):
        tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16", target="gpu")


def test_an_explicit_target_wins_over_the_config_and_measures_nothing(monkeypatch):
    from tf_mpt.costs import op_costs
    monkeypatch.setattr(op_costs, "_in_child", _no_measuring)
    monkeypatch.setattr(op_costs, "_measured", _no_measuring)
    config = _config_of(TARGET="here", CPU_FLAGS=ZEN4)  # here, no stand-in table: would measure
    for target in ("rules", TABLE):
        report = tf_mpt.rewrite_graph_def(_mlp_graph_def(), dtype="bfloat16", config=config,
                                          target=target).report
        assert report.target == os.path.basename(target) and report.error is None


def _no_measuring(*args, **kwargs):
    raise AssertionError(f"measured for a target that needs no measurement: {args} {kwargs}")
