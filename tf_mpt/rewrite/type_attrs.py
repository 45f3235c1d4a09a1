"""(node, type-attr) keys and the port <-> attr mapping, read from OpDefs.

tf_mpt paints type attributes, not nodes: MatMul has one key `T`; FusedBatchNormV3 has `T`
(x, y) and `U` (scale, offset, statistics); IdentityN has one key per element of its
`list(type)` attr, ('T', 0), ('T', 1), ...; a fixed-type port (Shape's int32 output, a
resource handle) has key None and is never painted.

Ports follow the OpDef: an arg with `number_attr` N gives N ports sharing one key, a
`type_list_attr` arg gives one port per list element.
"""

import functools
import re

from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import kernels
from tensorflow.python.framework import op_def_registry

from tf_mpt import _opt_out
from tf_mpt.rewrite.graph_view import GraphDefError

DT_FLOAT = types_pb2.DT_FLOAT
DT_HALF = types_pb2.DT_HALF
DT_BFLOAT16 = types_pb2.DT_BFLOAT16
HALF_TYPES = {DT_HALF: "float16", DT_BFLOAT16: "bfloat16"}

KEEP_FP32_ATTR = _opt_out.KEEP_FP32_ATTR  # the attr keep_fp32 sets


class NodeTypes:
    """The type keys of one node.

    Attributes:
        known: False when the op is neither registered nor a library function.
        is_function: True for a call to a function of the graph's library.
        in_keys: key per data input port (None: fixed type or unknown).
        out_keys: key per output port (None: fixed type or unknown); empty when unknown.
        ref_keys: keys with a reference-typed port (never painted, never cast).
        ref_out_ports: output ports that are references (e.g. VariableV2's output).
        dtypes: key -> current DataType enum.
        op_def: the OpDef (or function signature), or None.
        op: the op the node is analysed as: its own, or for an op in NEWER_HALF_FORM the
            newer version it becomes when a key goes half.
        renamed_to: (op, {attr: DataType}) for an op in NEWER_HALF_FORM, else None.
    """
    __slots__ = ("known", "is_function", "in_keys", "out_keys", "ref_keys", "ref_out_ports",
                 "dtypes", "op_def", "op", "renamed_to")


# Ops whose OpDef admits only float32 while a newer version with the same ports admits half:
# the node is analysed as the newer version and renamed (the added attrs set) only if a key
# goes half. Grappler's ConvertBatchNormOpsToV2 renames every node it may process instead.
# V1 batch norm is in every frozen TF 1.x model; its V2 keeps the statistics float32 (U).
NEWER_HALF_FORM = {
    "FusedBatchNorm": ("FusedBatchNormV2", {"U": DT_FLOAT}),
    "FusedBatchNormGrad": ("FusedBatchNormGradV2", {"U": DT_FLOAT}),
}


def half_types_of(value):
    """The half types (enums) an AttrValue holds, as `type` or in `list.type`."""
    return {t for t in [value.type] + list(value.list.type) if t in HALF_TYPES}


def computes_in(node, types):
    """Whether an attr of `node` holds one of `types` (DataType enums), as `type` or in
    `list.type`: the node computes in (or takes, or makes) that type."""
    return any(value.type in types or not types.isdisjoint(value.list.type)
               for value in node.attr.values())


def as_newer_half_form(node):
    """A copy of `node` as the op NEWER_HALF_FORM names (the input is not modified)."""
    new_op, attrs = NEWER_HALF_FORM[node.op]
    copy = type(node)()
    copy.CopyFrom(node)
    copy.op = new_op
    for name, dtype in attrs.items():
        copy.attr[name].type = dtype
    return copy


def arg_ports(arg, node, op_def_attrs):
    """Yields (key, is_ref) for each port of one OpDef arg on `node`."""
    if arg.number_attr:
        count = _attr_value(node, arg.number_attr, op_def_attrs).i
        key = arg.type_attr or None
        return [(key, arg.is_ref)] * count
    if arg.type_list_attr:
        count = len(_attr_value(node, arg.type_list_attr, op_def_attrs).list.type)
        return [((arg.type_list_attr, i), arg.is_ref) for i in range(count)]
    return [(arg.type_attr or None, arg.is_ref)]


def _attr_value(node, name, op_def_attrs):
    if name in node.attr:
        return node.attr[name]
    attr_def = op_def_attrs.get(name)
    if attr_def is not None and attr_def.HasField("default_value"):
        return attr_def.default_value
    raise GraphDefError(
        f"Node {node.name!r} (op {node.op}) has no attr {name!r} and its OpDef gives no "
        "default; add the attr.")


@functools.lru_cache(maxsize=None)
def _op_def_attrs(op_name):
    op_def = op_def_registry.get(op_name)
    return {a.name: a for a in op_def.attr} if op_def is not None else {}


@functools.lru_cache(maxsize=None)
def _static_layout(op_name):
    """Port layout of an op whose arg counts do not depend on attrs, else None."""
    op_def = op_def_registry.get(op_name)
    if op_def is None:
        return None
    for arg in list(op_def.input_arg) + list(op_def.output_arg):
        if arg.number_attr or arg.type_list_attr:
            return None
    ins = tuple((a.type_attr or None, a.is_ref) for a in op_def.input_arg)
    outs = tuple((a.type_attr or None, a.is_ref) for a in op_def.output_arg)
    return ins, outs


# Type attrs that type no port but must agree with the ops sharing the object they declare
# (a TensorArray's, a Stack's or a TensorList's element dtype); see paint/tensor_arrays.py, paint/tensor_lists.py.
_PORTLESS_TYPE_ATTRS = {"TensorArrayV3": "dtype", "StackV2": "elem_type",
                        "EmptyTensorList": "element_dtype", "TensorListReserve": "element_dtype",
                        "TensorListConcatLists": "element_dtype"}


def node_types(node, library_signatures):
    """Returns the NodeTypes of one NodeDef (library_signatures: name -> OpDef)."""
    nt = NodeTypes()
    nt.renamed_to = NEWER_HALF_FORM.get(node.op)
    if nt.renamed_to is not None:
        node = as_newer_half_form(node)
    nt.op = node.op
    op_def = op_def_registry.get(node.op)
    nt.is_function = False
    if op_def is None:
        op_def = library_signatures.get(node.op)
        nt.is_function = op_def is not None
    nt.op_def = op_def
    if op_def is None:
        nt.known = False
        nt.in_keys = [None] * sum(1 for i in node.input if not i.startswith("^"))
        nt.out_keys = []
        nt.ref_keys = frozenset()
        nt.ref_out_ports = frozenset()
        nt.dtypes = {}
        return nt
    nt.known = True
    attrs = {a.name: a for a in op_def.attr} if nt.is_function else _op_def_attrs(node.op)
    layout = None if nt.is_function else _static_layout(node.op)
    if layout is not None:
        ins, outs = layout
    else:
        ins = [p for arg in op_def.input_arg for p in arg_ports(arg, node, attrs)]
        outs = [p for arg in op_def.output_arg for p in arg_ports(arg, node, attrs)]
    nt.in_keys = [k for k, _ in ins]
    nt.out_keys = [k for k, _ in outs]
    ref_keys = {k for k, r in ins if r} | {k for k, r in outs if r}
    nt.ref_keys = frozenset(ref_keys)
    nt.ref_out_ports = frozenset(p for p, (_, r) in enumerate(outs) if r)
    dtypes = {}
    for key in dict.fromkeys(nt.in_keys + nt.out_keys):  # port order: the same every run
        if key is None:
            continue
        if isinstance(key, tuple):
            dtypes[key] = _attr_value(node, key[0], attrs).list.type[key[1]]
        else:
            dtypes[key] = _attr_value(node, key, attrs).type
    portless = _PORTLESS_TYPE_ATTRS.get(node.op)
    if portless is not None:
        dtypes[portless] = _attr_value(node, portless, attrs).type
    nt.dtypes = dtypes
    return nt


def op_def_allows(op_def, key, dtype):
    """True if the OpDef's attr for `key` admits `dtype` (no allowed_values admits all)."""
    attr_name = key[0] if isinstance(key, tuple) else key
    for attr in op_def.attr:
        if attr.name == attr_name:
            allowed = attr.allowed_values.list.type
            return not allowed or dtype in allowed
    return False


@functools.lru_cache(maxsize=None)
def kernel_allows(op_name, device_type, attr_name, dtype):
    """True if a kernel of `op_name` on `device_type` accepts `dtype` for `attr_name`."""
    try:
        kernel_list = kernels.get_registered_kernels_for_op(op_name)
    except Exception:  # pylint: disable=broad-except
        return False
    for kernel in kernel_list.kernel:
        if kernel.device_type not in (device_type, "DEFAULT"):
            continue
        for constraint in kernel.constraint:
            if constraint.name == attr_name:
                if dtype not in constraint.allowed_values.list.type:
                    break
        else:
            return True
    return False


_DEVICE_TYPE = re.compile(r"(?:^|/)(?:device:)?([A-Za-z_]+):(?:\d+|\*)$")


@functools.lru_cache(maxsize=None)
def device_type_of(device, default):
    """'/job:a/replica:0/task:0/device:GPU:0' -> 'GPU'; '' -> default."""
    if not device:
        return default
    match = _DEVICE_TYPE.search(device)
    if not match or match.group(1).upper() in ("JOB", "REPLICA", "TASK"):
        return default
    return match.group(1).upper()


@functools.lru_cache(maxsize=1)
def default_device_type():
    """Where a node without a device runs: 'GPU' when TensorFlow sees one, else 'CPU'."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
