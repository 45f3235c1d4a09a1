"""Op lists as data: disjoint, printable, edited by one function."""

import logging

import pytest

import tf_mpt
from tf_mpt import lists


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_default_lists_are_disjoint_and_hold_the_matrix_ops(dtype):
    op_lists = tf_mpt.default_lists(dtype)
    names = ("allow", "infer", "deny", "clear")
    for a in names:
        for b in names:
            if a < b:
                assert not getattr(op_lists, a) & getattr(op_lists, b), (a, b)
    assert {"MatMul", "Conv2D", "BatchMatMulV2"} <= op_lists.allow
    assert {"Exp", "SoftmaxCrossEntropyWithLogits"} <= op_lists.deny


def test_float16_and_bfloat16_differ_where_float16_range_matters():
    assert {"Mean", "Sum"} <= tf_mpt.FLOAT16_LISTS.deny
    assert {"Mean", "Sum"} <= tf_mpt.BFLOAT16_LISTS.infer


def test_every_listed_op_is_registered():
    from tensorflow.python.framework import op_def_registry
    known_missing = {  # vendor ops Grappler lists that this TensorFlow build does not register
        "FastUnsortedSegmentMax", "FusedConv2DBiasActivation", "FusedSparseConvGpuV2", "Mha",
        "MhaV2", "Pmlp", "Tmlp", "TmlpV2", "TmlpV3", "VoxelMax", "FusedPadConv2D",
    }
    for op_lists in (tf_mpt.FLOAT16_LISTS, tf_mpt.BFLOAT16_LISTS):
        for name, ops in op_lists.to_dict().items():
            missing = {op for op in ops if op_def_registry.get(op) is None} - known_missing
            assert not missing, (name, missing)


def test_lists_print_sorted_with_counts():
    text = str(tf_mpt.BFLOAT16_LISTS)
    first = text.splitlines()[0]
    assert first.startswith(f"allow ({len(tf_mpt.BFLOAT16_LISTS.allow)}): ")
    ops = first.split(": ", 1)[1].split(", ")
    assert ops == sorted(ops)


def test_one_add_moves_an_op_between_lists():
    edited = tf_mpt.FLOAT16_LISTS.edited(add={"allow": ["Tanh"]})
    assert "Tanh" in edited.allow and "Tanh" not in edited.infer
    assert "Tanh" in tf_mpt.FLOAT16_LISTS.infer  # the original is untouched


def test_remove_takes_an_op_off():
    edited = tf_mpt.FLOAT16_LISTS.edited(remove={"deny": ["Exp"]})
    assert edited.list_of("Exp") is None


def test_adding_one_op_to_two_lists_is_an_error():
    with pytest.raises(ValueError, match="'Tanh' is added to both the allow list and the deny"):
        tf_mpt.FLOAT16_LISTS.edited(add={"allow": ["Tanh"], "deny": ["Tanh"]})


def test_constructing_overlapping_lists_names_the_op_and_both_lists():
    with pytest.raises(ValueError, match="'MatMul' is on both the allow list and the deny list"):
        tf_mpt.OpLists(allow={"MatMul"}, deny={"MatMul"})


def test_unknown_op_name_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="tf_mpt"):
        tf_mpt.FLOAT16_LISTS.edited(add={"deny": ["MatMull", "Tanh"]})
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "MatMull" in messages[0] and "Tanh" not in messages[0]


def test_unknown_list_name_is_an_error():
    with pytest.raises(ValueError, match="Unknown op list 'white'"):
        tf_mpt.FLOAT16_LISTS.edited(add={"white": ["MatMul"]})


def test_a_string_instead_of_a_collection_is_an_error():
    with pytest.raises(TypeError, match="OpLists.allow must be a collection"):
        tf_mpt.OpLists(allow="MatMul")


def test_dtype_names():
    assert lists.default_lists("half") is tf_mpt.FLOAT16_LISTS
    with pytest.raises(ValueError, match="Received: dtype='fp8'"):
        lists.default_lists("fp8")


def _registered_op_names():
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session
    from tensorflow.python.util import compat
    buffer = pywrap_tf_session.TF_GetAllOpList()
    data = compat.as_bytes(pywrap_tf_session.TF_GetBuffer(buffer))
    op_list = op_def_pb2.OpList.FromString(data)
    return {op.name for op in op_list.op}


def test_every_op_whose_newer_version_admits_half_is_analysed_as_it():
    """Scans TensorFlow's op registry: an op whose `T` admits float32 but no half type, with a
    V2/V3 of the same port layout whose `T` admits half, must be in NEWER_HALF_FORM."""
    import re

    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import op_def_registry

    from tf_mpt.rewrite import type_attrs as _type_attrs

    def allowed(op_def, attr):
        for a in op_def.attr:
            if a.name == attr and a.type == "type":
                return set(a.allowed_values.list.type) or None  # None: any type
        return set()

    names = _registered_op_names()
    found = {}
    for name in sorted(names):
        if name.startswith("_"):
            continue
        old = op_def_registry.get(name)
        kinds = allowed(old, "T")
        if kinds is None or types_pb2.DT_FLOAT not in kinds or kinds & {types_pb2.DT_HALF}:
            continue
        for version in ("V2", "V3", "V4"):
            newer_name = re.sub(r"V\d$", "", name) + version
            newer = op_def_registry.get(newer_name) if newer_name in names else None
            if newer is None or (len(newer.input_arg), len(newer.output_arg)) != (
                    len(old.input_arg), len(old.output_arg)):
                continue
            newer_kinds = allowed(newer, "T")
            if newer_kinds is None or types_pb2.DT_HALF in newer_kinds:
                found[name] = newer_name
                break
    assert found == {op: new for op, (new, _) in _type_attrs.NEWER_HALF_FORM.items()}
