"""Cast nodes: recognising them (tf_mpt's carry the `-TfMpt` suffix) and making new ones.

Where Casts go, and the rule "one Cast per (tensor, dtype)", is the editor's (editor.py).
Names are `<producer>-<port>-CastToFp16-TfMpt` (`Bf16`, `Fp32`), with `-<k>` before `-TfMpt`
only if that name is taken, so reruns give identical graphs.
"""

from tensorflow.core.framework import node_def_pb2

from tf_mpt import _dtypes
from tf_mpt.rewrite.graph_view import parse_input

CAST_SUFFIX = _dtypes.CAST_SUFFIX
_CAST_WORD = {enum: f"CastTo{tag}" for enum, tag in _dtypes.CAST_TAGS.items()}


def is_cast(node, src, dst):
    """The node is a Cast from `src` to `dst` (DataType enums)."""
    return node.op == "Cast" and node.attr["SrcT"].type == src and node.attr["DstT"].type == dst


def is_ours(node):
    """The node is a Cast that tf_mpt added (named `*-TfMpt`), whatever its types."""
    return node.op == "Cast" and node.name.endswith(CAST_SUFFIX)


def our_casts(nodes):
    """How many of tf_mpt's Casts are among `nodes` (a GraphDef's node; a FunctionDef's
    node_def: per iteration, in a loop body)."""
    return sum(1 for node in nodes if is_ours(node))


def is_our_cast(node, src, dst):
    """The node is a Cast from `src` to `dst` that tf_mpt added (named `*-TfMpt`)."""
    return is_ours(node) and is_cast(node, src, dst)


def new_cast(taken, tensor, from_dtype, to, device=""):
    """A Cast NodeDef reading `tensor`, named `<producer>-<port>-CastTo..-TfMpt`.

    `-<k>` goes before `-TfMpt` only if the name is in `taken` (which gets the new name).
    """
    producer, port = parse_input(tensor)
    stem = f"{producer}-{port}-{_CAST_WORD[to]}"
    name, k = stem + CAST_SUFFIX, 1
    while name in taken:
        name, k = f"{stem}-{k}{CAST_SUFFIX}", k + 1
    taken.add(name)
    cast = node_def_pb2.NodeDef(name=name, op="Cast", input=[tensor])
    if device:
        cast.device = device
    cast.attr["SrcT"].type = from_dtype
    cast.attr["DstT"].type = to
    cast.attr["Truncate"].b = False
    return cast
