"""Config.from_env: the only reader of TF_MPT_* variables; README table kept in step."""

import os
import re

import pytest

import tf_mpt
from tf_mpt import config

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_empty_environment_gives_defaults():
    cfg = tf_mpt.Config.from_env({})
    assert cfg == tf_mpt.Config()
    assert cfg.lists_for("float16") is tf_mpt.FLOAT16_LISTS


def test_list_edits_are_parsed_and_applied():
    cfg = tf_mpt.Config.from_env({"TF_MPT_ALLOWLIST_ADD": " Tanh , Sigmoid,",
                                  "TF_MPT_CLEARLIST_REMOVE": "Relu"})
    lists = cfg.lists_for("bfloat16")
    assert {"Tanh", "Sigmoid"} <= lists.allow and "Relu" not in lists.clear


@pytest.mark.parametrize("list_name", ["ALLOW", "INFER", "DENY", "CLEAR"])
@pytest.mark.parametrize("suffix", ["ADD", "REMOVE"])
def test_every_list_variable_is_read(list_name, suffix):
    cfg = tf_mpt.Config.from_env({f"TF_MPT_{list_name}LIST_{suffix}": "MatMul"})
    edits = cfg.list_add if suffix == "ADD" else cfg.list_remove
    assert edits == ((list_name.lower(), frozenset({"MatMul"})),)


def test_bad_op_name_names_the_variable_and_value():
    with pytest.raises(ValueError, match=r"TF_MPT_DENYLIST_ADD must be .*Received: "
                                         r"TF_MPT_DENYLIST_ADD='Exp;Log'"):
        tf_mpt.Config.from_env({"TF_MPT_DENYLIST_ADD": "Exp;Log"})


def test_dump_dir():
    assert tf_mpt.Config.from_env({"TF_MPT_DUMP_DIR": "/tmp/x"}).dump_dir == "/tmp/x"
    assert tf_mpt.Config.from_env({"TF_MPT_DUMP_DIR": "  "}).dump_dir is None


def test_config_is_immutable():
    cfg = tf_mpt.Config()
    with pytest.raises(Exception):
        cfg.dump_dir = "x"


def test_readme_env_table_matches_the_code():
    with open(README) as f:
        text = f.read()
    match = re.search(r"<!-- env-table:.*?-->\n(.*?)\n<!-- /env-table -->", text, re.S)
    assert match, "README lost its env-table markers"
    assert match.group(1) == config.env_var_table_markdown()


def test_every_tf_mpt_constant_is_in_the_table():
    constants = {v for k, v in vars(config).items() if k.startswith("TF_MPT_")}
    assert constants == {name for name, _, _ in config.ENV_VARS}


@pytest.mark.parametrize("env, rewrite, scaling16, scaling_bf16", [
    ({}, False, False, False),
    ({"TF_MPT_ENABLE": "1"}, True, True, False),
    ({"TF_MPT_ENABLE": "1", "TF_MPT_LOSS_SCALING": "0"}, True, False, False),
    ({"TF_MPT_ENABLE": "1", "TF_MPT_GRAPH_REWRITE": "off"}, False, True, False),
    ({"TF_MPT_ENABLE": "0", "TF_MPT_GRAPH_REWRITE": "yes"}, True, False, False),
    ({"TF_MPT_LOSS_SCALING": "true"}, False, True, True),
    ({"TF_MPT_ENABLE": "TRUE", "TF_MPT_LOSS_SCALING": ""}, True, True, False),
])
def test_explicit_sub_switch_wins_over_the_master(env, rewrite, scaling16, scaling_bf16):
    cfg = tf_mpt.Config.from_env(env)
    assert cfg.graph_rewrite is rewrite
    assert cfg.loss_scaling_for("float16") is scaling16
    assert cfg.loss_scaling_for("bfloat16") is scaling_bf16


@pytest.mark.parametrize("variable, value, accepted", [
    ("TF_MPT_ENABLE", "maybe", "1, true, yes, on, 0, false, no, off"),
    ("TF_MPT_GRAPH_REWRITE", "2", "1, true, yes, on"),
    ("TF_MPT_LOSS_SCALING", "enabled", "0, false, no, off"),
    ("TF_MPT_DTYPE", "fp16", "float16, bfloat16, auto"),
    ("TF_MPT_LOSS_SCALE", "-4", "'dynamic' or a positive finite number"),
    ("TF_MPT_LOSS_SCALE", "inf", "'dynamic' or a positive finite number"),
    ("TF_MPT_LOSS_SCALE", "big", "'dynamic' or a positive finite number"),
    ("TF_MPT_COST_BATCH", "-1", "a whole number >= 0"),
    ("TF_MPT_COST_BATCH", "32.5", "a whole number >= 0"),
])
def test_every_bad_value_names_variable_value_and_accepted(variable, value, accepted):
    with pytest.raises(ValueError) as info:
        tf_mpt.Config.from_env({variable: value})
    message = str(info.value)
    assert variable in message and repr(value) in message and accepted in message


def test_dtype_and_loss_scale_values():
    cfg = tf_mpt.Config.from_env({"TF_MPT_DTYPE": "BFloat16", "TF_MPT_LOSS_SCALE": "128"})
    assert cfg.dtype == "bfloat16" and cfg.loss_scale == 128.0
    assert tf_mpt.Config.from_env({}).loss_scale == "dynamic"


@pytest.mark.parametrize("dtype, gpu, native, expected", [
    ("auto", True, False, "float16"), ("auto", False, True, "bfloat16"),
    ("auto", False, False, None), ("float16", False, False, "float16"),
    ("bfloat16", True, False, "bfloat16")])
def test_auto_dtype_resolution(dtype, gpu, native, expected):
    cfg = tf_mpt.Config.from_env({"TF_MPT_DTYPE": dtype})
    assert cfg.resolve_dtype(gpu_visible=gpu, native_bfloat16=native) == expected


def test_cost_batch():
    assert tf_mpt.Config().cost_batch == tf_mpt.Config.from_env({}).cost_batch == 32
    assert tf_mpt.Config.from_env({"TF_MPT_COST_BATCH": " 0 "}).cost_batch == 0
    assert tf_mpt.Config.from_env({"TF_MPT_COST_BATCH": "256"}).cost_batch == 256


def test_session_rewrite_and_cache_dir():
    assert tf_mpt.Config().session_rewrite == "grappler"
    cfg = tf_mpt.Config.from_env({"TF_MPT_SESSION_REWRITE": " Copy ",
                                  "TF_MPT_CACHE_DIR": "/tmp/cache"})
    assert (cfg.session_rewrite, cfg.cache_dir) == ("copy", "/tmp/cache")
    with pytest.raises(ValueError, match=r"TF_MPT_SESSION_REWRITE must be one of grappler, "
                                         r"copy\. Received: TF_MPT_SESSION_REWRITE='shadow'"):
        tf_mpt.Config.from_env({"TF_MPT_SESSION_REWRITE": "shadow"})


def test_keras_mode():
    assert tf_mpt.Config().keras == "rewrite"
    assert tf_mpt.Config.from_env({}).keras == "rewrite"
    assert tf_mpt.Config.from_env({"TF_MPT_KERAS": " Policy "}).keras == "policy"
    with pytest.raises(ValueError, match=r"TF_MPT_KERAS must be one of rewrite, policy\. "
                                         r"Received: TF_MPT_KERAS='mixed'"):
        tf_mpt.Config.from_env({"TF_MPT_KERAS": "mixed"})


def test_bad_dtype_names_the_variable_value_and_choices():
    with pytest.raises(ValueError, match=r"TF_MPT_DTYPE must be one of float16, bfloat16, "
                                         r"auto\. Received: TF_MPT_DTYPE='fp8'"):
        tf_mpt.Config.from_env({"TF_MPT_DTYPE": "fp8"})


@pytest.mark.parametrize("value, memory, price", [
    ("", "float32", 0.0), ("0", "any", 0.0), ("0.1", "float32", 0.1), ("1", "least", 1.0)])
def test_memory_price_is_a_share_of_float32s_speed(value, memory, price):
    """TF_MPT_MEMORY_PRICE: a number from 0 to 1 (unset: 0, never slower than float32)."""
    parsed = config.Config.from_env({"TF_MPT_MEMORY_PRICE": value, "TF_MPT_MEMORY": memory})
    assert parsed.memory_price == price and parsed.memory == memory


@pytest.mark.parametrize("value, memory, says", [
    ("10%", "float32", "must be a number from 0 to 1"),
    ("-0.1", "float32", "must be a number from 0 to 1"),
    ("1.5", "least", "must be a number from 0 to 1"),
    ("nan", "float32", "must be a number from 0 to 1"),
    ("0.1", "any", "has no effect with TF_MPT_MEMORY=any"),
])
def test_a_bad_memory_price_is_refused_with_the_value_and_the_fix(value, memory, says):
    """A price that is not a share, or one TF_MPT_MEMORY=any would ignore, is refused: the
    message names the variable, the value received and what is accepted."""
    with pytest.raises(ValueError, match=re.escape(f"TF_MPT_MEMORY_PRICE={value!r}")) as error:
        config.Config.from_env({"TF_MPT_MEMORY_PRICE": value, "TF_MPT_MEMORY": memory})
    text = str(error.value)
    assert says in text and f"TF_MPT_MEMORY_PRICE={value!r}" in text, text
    assert "0.1" in text  # (the fix: an example value, or the setting that gives it effect)
