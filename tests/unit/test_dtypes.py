"""tf_mpt/_dtypes.py: the target half type parsed once."""

import dataclasses

import pytest
import tensorflow as tf

from tf_mpt import _dtypes


@pytest.mark.parametrize("spelling, expected", [
    ("float16", _dtypes.FLOAT16), ("half", _dtypes.FLOAT16), (tf.float16, _dtypes.FLOAT16),
    ("bfloat16", _dtypes.BFLOAT16), (tf.bfloat16, _dtypes.BFLOAT16),
    (_dtypes.BFLOAT16, _dtypes.BFLOAT16)], ids=str)
def test_every_accepted_spelling_parses_to_one_half(spelling, expected):
    assert _dtypes.parse(spelling) is expected


def test_enums_and_tags_are_tensorflows():
    assert _dtypes.FLOAT16.enum == tf.float16.as_datatype_enum
    assert _dtypes.BFLOAT16.enum == tf.bfloat16.as_datatype_enum
    assert _dtypes.DT_FLOAT == tf.float32.as_datatype_enum
    assert _dtypes.CAST_TAGS == {tf.float16.as_datatype_enum: "Fp16",
                                 tf.bfloat16.as_datatype_enum: "Bf16",
                                 tf.float32.as_datatype_enum: "Fp32"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        _dtypes.FLOAT16.name = "bfloat16"


@pytest.mark.parametrize("bad", ["float32", tf.float32, None, 16, ["float16"]], ids=str)
def test_anything_else_is_refused_naming_the_value(bad):
    with pytest.raises(ValueError, match=r"dtype must be 'float16' or 'bfloat16'.*Received: "
                                         rf"dtype={repr(bad).replace('[', '.').replace(']', '.')}"):
        _dtypes.parse(bad)
