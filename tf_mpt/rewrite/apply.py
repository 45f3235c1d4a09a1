"""Applying a finished Paint to the GraphDef: the one edit of the paint phase.

    copy the graph; set every converted (node, type-attr) to half (renaming an op to its
      half form, storing a Const's value in half)
    for each data edge whose two ends now differ: the reader reads editor.cast(tensor, dtype)

The editor (editor.py) decides which Cast: the tensor before a Cast to float32 of it, a Cast
already in the graph (one whose own input keeps its dtype), or one new Cast per (tensor,
dtype) shared by every reader.
"""

from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import dtypes as tf_dtypes
from tensorflow.python.framework import tensor_util

from tf_mpt.rewrite import editor as _editor
from tf_mpt.rewrite import type_attrs as ta


def _set_dtype(node, key, dtype):
    if isinstance(key, tuple):
        node.attr[key[0]].list.type[key[1]] = dtype
    else:
        node.attr[key].type = dtype


def _store_constant_in_half(node, dtype):
    values = tensor_util.MakeNdarray(node.attr["value"].tensor)
    np_dtype = tf_dtypes.as_dtype(dtype).as_numpy_dtype
    node.attr["value"].tensor.CopyFrom(
        tensor_util.make_tensor_proto(values.astype(np_dtype), dtype=dtype, shape=values.shape))


def _set_painted_dtypes(out, types, paint):
    """Every converted vertex of `out` (a copy of the painted graph) becomes half."""
    for v, converted in enumerate(paint.converted):
        if not converted:
            continue
        i, key = paint.v_node[v], paint.v_key[v]
        node = out.node[i]
        if node.op == "Const" and key == "dtype":
            _store_constant_in_half(node, paint.half_enum)
        _set_dtype(node, key, paint.half_enum)
        if types[i].renamed_to is not None and node.op != types[i].op:
            new_op, attrs = types[i].renamed_to
            node.op = new_op
            for name, dtype in attrs.items():
                node.attr[name].type = dtype


def _output_key(types, i, port):
    """The type-attr key of output `port` of node i, or None (untyped, unknown)."""
    nt = types[i]
    if not nt.known or port >= len(nt.out_keys):
        return None
    return nt.out_keys[port]


def apply_paint(graph_def, view, types, paint):
    """Returns (new GraphDef, names of the Casts added). `graph_def` is not modified."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    half = paint.half_enum
    _set_painted_dtypes(out, types, paint)

    def new_dtype(i, key):
        v = paint.node_vertex[i][key]
        return half if paint.converted[v] else paint.v_dtype[v]

    def new_dtype_of_output(i, port):
        key = _output_key(types, i, port)
        return None if key is None else new_dtype(i, key)

    def reusable(cast):
        """An existing Cast is shared only if its own input keeps the dtype it reads."""
        i = view.index[cast.name]
        if not view.fanin[i] or "SrcT" not in paint.node_vertex[i]:
            return False
        src, port = view.fanin[i][0]
        return new_dtype(i, "SrcT") == new_dtype_of_output(src, port)

    editor = _editor.Editor(out, half, reusable)
    for i, ports in enumerate(view.fanin):
        in_keys = types[i].in_keys
        for port, (src, src_port) in enumerate(ports):
            key = in_keys[port]
            # A Cast goes wherever the producer's final dtype differs from what the reader
            # takes: an untyped input takes what its producer made before; an unknown
            # producer makes what its reader took before.
            src_dtype = new_dtype_of_output(src, src_port)
            if key is not None:
                dst_dtype = new_dtype(i, key)
                if src_dtype is None:
                    src_dtype = paint.v_dtype[paint.node_vertex[i][key]]
            else:
                src_key = _output_key(types, src, src_port)
                dst_dtype = None if src_key is None else \
                    paint.v_dtype[paint.node_vertex[src][src_key]]
            if src_dtype is None or dst_dtype is None or src_dtype == dst_dtype:
                continue
            tensor = _editor.tensor_name(view.nodes[src].name, src_port)
            editor.set_input(out.node[i], port, editor.cast(tensor, dst_dtype, src_dtype))
    return out, editor.finish()
