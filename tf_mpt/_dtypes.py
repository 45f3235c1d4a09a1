"""The target half type, parsed once: its name, its DataType enum and its tag in Cast names.

Every entry point (`rewrite_graph_def`, `rewrite_function`, `tf_mpt.function`, the storage
getter, the op lists) calls `parse` once and passes the `Half` on. No TensorFlow import: the
enums are those of tensorflow/core/framework/types.proto (a test checks them against TF).

Example:
    >>> parse(tf.bfloat16)
    Half(name='bfloat16', enum=14, tag='Bf16')
"""

import dataclasses

DT_FLOAT = 1
DT_HALF = 19
DT_BFLOAT16 = 14


@dataclasses.dataclass(frozen=True)
class Half:
    """A target half type: 'float16' or 'bfloat16'."""
    name: str  # 'float16' | 'bfloat16'
    enum: int  # DataType enum: DT_HALF | DT_BFLOAT16
    tag: str  # in added Casts' names: CastToFp16 | CastToBf16


FLOAT16 = Half("float16", DT_HALF, "Fp16")
BFLOAT16 = Half("bfloat16", DT_BFLOAT16, "Bf16")
_BY_SPELLING = {"float16": FLOAT16, "half": FLOAT16, "bfloat16": BFLOAT16}

# Added Casts are named `<producer>-<port>-CastTo<tag>-TfMpt`: the tag of every dtype tf_mpt
# casts to, by DataType enum, and the suffix.
CAST_TAGS = {DT_HALF: FLOAT16.tag, DT_BFLOAT16: BFLOAT16.tag, DT_FLOAT: "Fp32"}
CAST_SUFFIX = "-TfMpt"


def parse(dtype):
    """The Half for 'float16' / 'half' / 'bfloat16', tf.float16 / tf.bfloat16 or a Half.

    Raises:
        ValueError: any other value, naming it and the accepted ones.
    """
    if isinstance(dtype, Half):
        return dtype
    name = getattr(dtype, "name", dtype)
    try:
        return _BY_SPELLING[name]
    except (KeyError, TypeError):
        raise ValueError(
            "dtype must be 'float16' or 'bfloat16' (a string or tf.float16 / tf.bfloat16). "
            f"Received: dtype={dtype!r} (of type {type(dtype).__name__})") from None
