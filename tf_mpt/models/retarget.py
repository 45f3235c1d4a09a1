"""A converted model back to float32, so it can be served in float32 or converted for another
half type (`tf-mpt convert converted/ out/ --dtype float32|float16|bfloat16`).

`tf-mpt convert` marks every Cast it adds with SOURCE_ATTR: 'float32' when the model it
converted computed in float32 only, 'mixed' when parts of it were half already (a Keras
mixed policy). In a model marked 'float32' every half dtype is tf_mpt's, so undoing is:

    every half type attr, type-list entry, function argument / result and Const -> float32
    every tf_mpt Cast (now float32 -> float32) removed, its readers reading its input

A model marked 'mixed', or one whose half ops tf_mpt did not add, is refused with what can
and cannot be undone: tf_mpt cannot tell its own half ops from the model's there. Variables
stored in half (`--variables half`) go back to float32 with their checkpoint
(SavedModelDir.in_float32), holding their values rounded once.

Example:
    >>> graph_def = to_float32(converted_graph_def)   # the float32 model's op dtypes again
"""

import numpy as np
from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import tensor_util

from tf_mpt.models.model_io import ModelError
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import editor as _editor
from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.rewrite import type_attrs as ta

SOURCE_ATTR = "_tf_mpt_source"
FROM_FLOAT32, FROM_MIXED = "float32", "mixed"
HALF_TYPES = ta.HALF_TYPES
_FLOAT = types_pb2.DT_FLOAT


def _our_casts(graph_def):
    return [n for n in _function_bodies.all_nodes(graph_def) if _casts.is_ours(n)]


def mark_source(graph_def, source):
    """Marks tf_mpt's Casts in `graph_def` (in place) with the kind of model it converted."""
    for cast in _our_casts(graph_def):
        cast.attr[SOURCE_ATTR].s = source.encode()


def half_types_in(graph_def):
    """The names of the half types any node, argument or result of `graph_def` uses."""
    found = set()
    for node in _function_bodies.all_nodes(graph_def):
        for value in node.attr.values():
            found.update(HALF_TYPES[t] for t in ta.half_types_of(value))
    for fdef in graph_def.library.function:
        for arg in list(fdef.signature.input_arg) + list(fdef.signature.output_arg):
            if arg.type in HALF_TYPES:
                found.add(HALF_TYPES[arg.type])
    return found


def check_undoable(graph_defs, where):
    """Raises ModelError unless every half dtype in `graph_defs` (a list) is tf_mpt's."""
    casts = [c for g in graph_defs for c in _our_casts(g)]
    half = set().union(*(half_types_in(g) for g in graph_defs))
    sources = {c.attr[SOURCE_ATTR].s.decode() if SOURCE_ATTR in c.attr else None
               for c in casts}
    if not casts:
        if not half:
            raise ModelError(f"{where!r} computes in float32 already: nothing to undo.")
        raise ModelError(
            f"{where!r} computes in {' and '.join(sorted(half))} but tf_mpt did not convert it "
            "(a Keras mixed policy, or a model built in half): tf_mpt removes only its own "
            "conversions. Export the model in float32 (e.g. with the float32 dtype policy) and "
            "convert that.")
    if FROM_MIXED in sources:
        raise ModelError(
            f"{where!r} computed in half in places before tf_mpt converted it (a Keras mixed "
            "policy): tf_mpt cannot tell its own half ops from the model's, so it cannot "
            "write it in float32. Convert the float32 original instead.")
    if sources != {FROM_FLOAT32}:
        raise ModelError(
            f"{where!r} was converted by tf_mpt without the mark `tf-mpt convert` now writes "
            f"on its Casts ({SOURCE_ATTR}; a rewrite_graph_def result or an older version): "
            "it cannot be sure every half op is its own. Convert the float32 original instead.")


def _to_float(value):
    """An AttrValue's half types -> float32, in place."""
    if value.type in HALF_TYPES:
        value.type = _FLOAT
    for i, t in enumerate(value.list.type):
        if t in HALF_TYPES:
            value.list.type[i] = _FLOAT


def _node_to_float(node):
    if node.op == "Const" and node.attr["dtype"].type in HALF_TYPES:
        values = tensor_util.MakeNdarray(node.attr["value"].tensor).astype(np.float32)
        node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(values, _FLOAT,
                                                                         values.shape))
    for key in list(node.attr):
        _to_float(node.attr[key])
    if _casts.is_ours(node):
        del node.attr[SOURCE_ATTR]


def _remove_our_casts(graph_def):
    """Every tf_mpt Cast of `graph_def` (float32 -> float32 now) bypassed and removed."""
    editor = _editor.Editor(graph_def, _FLOAT)
    for cast in [n for n in graph_def.node if _casts.is_ours(n)]:
        data = [t for t in cast.input if not t.startswith("^")]
        editor.bypass(cast.name, data[0])
    editor.finish()


def to_float32(graph_def):
    """A copy of a tf_mpt-converted GraphDef (check_undoable first) with every half dtype
    float32 and tf_mpt's Casts removed, in the graph and in every library function."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for fdef in out.library.function:  # signatures first: the bodies read their callees'
        for arg in list(fdef.signature.input_arg) + list(fdef.signature.output_arg):
            if arg.type in HALF_TYPES:
                arg.type = _FLOAT
    for node in out.node:
        _node_to_float(node)
    _remove_our_casts(out)
    signatures = {f.signature.name: f.signature for f in out.library.function}
    for index, fdef in enumerate(out.library.function):
        if not any(_casts.is_ours(n) or _has_half(n) for n in fdef.node_def):
            continue
        try:
            body, _ = _function_bodies.function_to_graph_def(fdef, signatures)
        except _function_bodies.UnsupportedFunction as error:
            raise ModelError(f"function {fdef.signature.name} cannot be read back to float32 "
                             f"({error}); convert the float32 original instead.") from None
        for node in body.node:
            _node_to_float(node)
        _remove_our_casts(body)
        out.library.function[index].CopyFrom(
            _function_bodies.graph_def_to_function(body, fdef, signatures))
    return out


def _has_half(node):
    return any(ta.half_types_of(v) for v in node.attr.values())
