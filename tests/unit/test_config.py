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
