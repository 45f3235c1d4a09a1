"""The only GraphDef editor: sets painted dtypes, stores constants in half, inserts Casts.

Cast rules:
* at most one Cast per (tensor, target dtype), shared by every consumer that needs it;
* a Cast already in the graph that does the same conversion is reused;
* no fp32 -> half -> fp32 round trip is added: a consumer that needs half from
  `Cast(h: half -> fp32)` reads `h` itself;
* names are `<producer>-<port>-CastToFp16-TfMpt` (`Bf16`, `Fp32`), with `-<k>` before
  `-TfMpt` only if that name is taken, so reruns give identical graphs.
"""

from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import node_def_pb2
from tensorflow.python.framework import dtypes as tf_dtypes
from tensorflow.python.framework import tensor_util

from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.graph_view import parse_input

CAST_SUFFIX = "-TfMpt"
_CAST_WORD = {ta.DT_HALF: "CastToFp16", ta.DT_BFLOAT16: "CastToBf16", ta.DT_FLOAT: "CastToFp32"}


def is_cast(node, src, dst):
    """The node is a Cast from `src` to `dst` (DataType enums)."""
    return node.op == "Cast" and node.attr["SrcT"].type == src and node.attr["DstT"].type == dst


def is_our_cast(node, src, dst):
    """The node is a Cast from `src` to `dst` that tf_mpt added (named `*-TfMpt`)."""
    return node.name.endswith(CAST_SUFFIX) and is_cast(node, src, dst)


def _tensor_name(name, port):
    return name if port == 0 else f"{name}:{port}"


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


class _CastPlanner:
    """Chooses, names and creates the Casts of one rewrite."""

    def __init__(self, view, types, paint):
        self.view, self.types, self.paint = view, types, paint
        self.taken = set(view.index)
        self.made = {}
        self.new_nodes = []

    def new_dtype_of_output(self, i, port):
        """The dtype of output `port` of node i after the rewrite, or None if not a typed key."""
        nt = self.types[i]
        if not nt.known or port >= len(nt.out_keys) or nt.out_keys[port] is None:
            return None
        return self._new_dtype(i, nt.out_keys[port])

    def _new_dtype(self, i, key):
        v = self.paint.node_vertex[i][key]
        return self.paint.target if self.paint.converted[v] else self.paint.v_dtype[v]

    def _reusable_cast(self, src, port, to, exclude):
        """An existing Cast reading tensor (src, port) that converts to `to`, or None."""
        from_dtype = self.new_dtype_of_output(src, port)
        for dst, _ in self.view.fanout_of(src).get(port, ()):
            node = self.view.nodes[dst]
            if dst == exclude or node.op != "Cast" or self.view.control_fanin[dst]:
                continue
            if self._new_dtype(dst, "SrcT") == from_dtype and self._new_dtype(dst, "DstT") == to:
                return node.name
        return None

    def _undo_round_trip(self, src, to):
        """For half wanted from `Cast(h: half -> fp32)`, the tensor h; else None."""
        node = self.view.nodes[src]
        if node.op != "Cast" or to == ta.DT_FLOAT:
            return None
        if self._new_dtype(src, "SrcT") != to or self._new_dtype(src, "DstT") != ta.DT_FLOAT:
            return None
        return node.input[0]

    def cast_for(self, src, port, to, consumer):
        """Returns the input string that gives tensor (src, port) in dtype `to`."""
        key = (src, port, to)
        name = self.made.get(key)
        if name is not None:
            return name
        name = self._undo_round_trip(src, to) or self._reusable_cast(src, port, to, consumer)
        if name is None:
            name = self._add_cast(src, port, to)
        self.made[key] = name
        return name

    def _add_cast(self, src, port, to):
        producer = self.view.nodes[src]
        from_dtype = self.paint.target if to == ta.DT_FLOAT else ta.DT_FLOAT
        cast = new_cast(self.taken, _tensor_name(producer.name, port), from_dtype, to,
                        producer.device)
        self.new_nodes.append(cast)
        return cast.name


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


def apply_paint(graph_def, view, types, paint):
    """Returns (new GraphDef, names of the Casts added). `graph_def` is not modified."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    target = paint.target
    for v, converted in enumerate(paint.converted):
        if not converted:
            continue
        i, key = paint.v_node[v], paint.v_key[v]
        node = out.node[i]
        if node.op == "Const" and key == "dtype":
            _store_constant_in_half(node, target)
        _set_dtype(node, key, target)
        if types[i].renamed_to is not None and node.op != types[i].op:
            new_op, attrs = types[i].renamed_to
            node.op = new_op
            for name, dtype in attrs.items():
                node.attr[name].type = dtype
    planner = _CastPlanner(view, types, paint)
    for i, ports in enumerate(view.fanin):
        in_keys = types[i].in_keys
        node_vertex = paint.node_vertex[i]
        for port, (src, src_port) in enumerate(ports):
            key = in_keys[port]
            dst_half = key is not None and paint.converted[node_vertex[key]]
            src_types = types[src]
            src_half = False
            if src_types.known and src_port < len(src_types.out_keys):
                src_key = src_types.out_keys[src_port]
                src_half = src_key is not None and paint.converted[paint.node_vertex[src][src_key]]
            if src_half == dst_half:
                continue
            to = target if dst_half else ta.DT_FLOAT
            out.node[i].input[port] = planner.cast_for(src, src_port, to, i)
    out.node.extend(planner.new_nodes)
    return out, [n.name for n in planner.new_nodes]
