"""Fold a frozen graph's inference batch norms into the convolutions before them.

TensorFlow's remapper runs Conv2D + FusedBatchNorm (inference) + Relu as one oneDNN kernel in
float32 but not in bfloat16, where they stay three kernels (MobileNetV2 on Zen 4: bfloat16
Relu6 14.2 ms against 0.97 ms fused in float32, `benchmarks/real_models.py --profile`). With
constant weights and statistics the batch norm is an affine map per output channel, so

    conv(x, W) [-> BiasAdd(b)] -> FusedBatchNorm(scale, offset, mean, variance, epsilon)
    becomes
    conv(x, W * s) -> BiasAdd(offset + (b - mean) * s)     s = scale / sqrt(variance + epsilon)

which the remapper fuses with the activation after it in either dtype. The fold is done in
float32 (numpy) on a copy of the graph before painting; the BiasAdd keeps the batch norm's
name, so every reader of its output reads the BiasAdd. Folded only where nothing else can
tell: the batch norm is in inference mode (is_training false, NHWC), its scale, offset, mean
and variance, the convolution's filter and the bias are float32 constants (through Identity
nodes, as a frozen Keras model reads them), the convolution (and bias) are read only by the
next node, nothing reads the batch norm's other outputs or waits on these nodes, and none
is fetched. A bias folded in is removed: nothing could read it (it read the convolution, whose
filter has changed), and left in the graph it would be a second reader of the convolution,
which the cost model takes for a convolution the remapper cannot fuse.
"""

import numpy as np
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import tensor_util

from tf_mpt import _dtypes
from tf_mpt.rewrite import graph_view as _graph_view

_BATCH_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
_CONVOLUTIONS = ("Conv2D", "DepthwiseConv2dNative")


def _constant(view, i):
    """The float32 value of node i's output 0 if it is a Const (through Identity nodes)."""
    for _ in range(8):
        node = view.nodes[i]
        if node.op == "Const":
            if node.attr["dtype"].type != _dtypes.DT_FLOAT:
                return None
            return tensor_util.MakeNdarray(node.attr["value"].tensor)
        if node.op != "Identity" or not view.fanin[i] or view.fanin[i][0][1] != 0:
            return None
        i = view.fanin[i][0][0]
    return None


def _private(view, i, reader, fetched):
    """Node i is read only by node `reader`, nothing waits on it and it is not fetched."""
    return (view.nodes[i].name not in fetched and not view.has_control_fanout[i]
            and view.readers(i) == {reader})


def _nhwc(node):
    return node.attr["data_format"].s in (b"", b"NHWC")


def _foldable(view, i, fetched):
    """(conv index, filter, bias or None, [scale, offset, mean, variance]) for a batch norm
    that may be folded (after conv, or after conv -> BiasAdd), else None."""
    node = view.nodes[i]
    if node.op not in _BATCH_NORMS or node.name in fetched or view.has_control_fanout[i]:
        return None
    if node.attr["is_training"].b or not _nhwc(node):
        return None
    if set(view.fanout_of(i)) - {0} or len(view.fanin[i]) != 5:
        return None  # another output is read
    src, port = view.fanin[i][0]
    bias, reader = None, i
    if port == 0 and view.nodes[src].op == "BiasAdd" and _private(view, src, i, fetched):
        bias = _constant(view, view.fanin[src][1][0])
        if bias is None or bias.ndim != 1 or not _nhwc(view.nodes[src]):
            return None
        reader, (src, port) = src, view.fanin[src][0]
    conv_node = view.nodes[src]
    if (port != 0 or conv_node.op not in _CONVOLUTIONS or not _nhwc(conv_node)
            or not _private(view, src, reader, fetched)
            or conv_node.attr["T"].type != _dtypes.DT_FLOAT):
        return None
    weights = _constant(view, view.fanin[src][1][0])
    stats = [_constant(view, s) for s, _ in view.fanin[i][1:5]]
    if weights is None or weights.ndim != 4 or any(s is None or s.ndim != 1 for s in stats):
        return None
    channels = weights.shape[2] * weights.shape[3] if conv_node.op != "Conv2D" \
        else weights.shape[3]
    if any(s.shape[0] != channels for s in stats + ([bias] if bias is not None else [])):
        return None
    return src, weights, bias, stats


def _const_node(graph_def, name, value):
    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = _dtypes.DT_FLOAT
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value.astype(np.float32)))
    return node


def fold_batch_norms(graph_def, fetched, view=None):
    """(a new GraphDef with every foldable batch norm folded, how many were), or
    (graph_def itself, 0) when there is none. `fetched`: names of fetched nodes; `view`: the
    GraphView of graph_def when the caller has one."""
    view = view or _graph_view.GraphView(graph_def)
    found = [(i, _foldable(view, i, fetched)) for i in range(len(view.nodes))]
    found = [(i, f) for i, f in found if f is not None]
    if not found:
        return graph_def, 0
    new = graph_pb2.GraphDef()
    new.CopyFrom(graph_def)
    names = {node.name for node in new.node}
    folded_biases = set()
    for i, (conv, weights, bias, (scale, offset, mean, variance)) in found:
        batch_norm, conv_node = new.node[i], new.node[conv]
        factor = scale / np.sqrt(variance + batch_norm.attr["epsilon"].f)
        folded = weights * factor.reshape(weights.shape[2:]) \
            if conv_node.op != "Conv2D" else weights * factor
        filter_name = _unique(names, f"{conv_node.name}/folded_filter")
        bias_name = _unique(names, f"{batch_norm.name}/folded_bias")
        _const_node(new, filter_name, folded).device = conv_node.device
        shift = offset + ((0.0 if bias is None else bias) - mean) * factor
        _const_node(new, bias_name, shift).device = batch_norm.device
        conv_node.input[1] = filter_name
        x = conv_node.name  # a BiasAdd between them is folded in too (and removed)
        if bias is not None:
            folded_biases.add(view.nodes[view.fanin[i][0][0]].name)
        controls = [t for t in batch_norm.input if t.startswith("^")]
        device, name = batch_norm.device, batch_norm.name
        shapes = list(batch_norm.attr["_output_shapes"].list.shape[:1]) \
            if "_output_shapes" in batch_norm.attr else None
        batch_norm.Clear()
        batch_norm.name, batch_norm.op, batch_norm.device = name, "BiasAdd", device
        if shapes:  # its output 0's shape, for the cost model of a GraphDef with shapes
            batch_norm.attr["_output_shapes"].list.shape.extend(shapes)
        batch_norm.input.extend([x, bias_name] + controls)
        batch_norm.attr["T"].type = _dtypes.DT_FLOAT
        batch_norm.attr["data_format"].s = b"NHWC"
    if folded_biases:
        kept = [node for node in new.node if node.name not in folded_biases]
        del new.node[:]
        new.node.extend(kept)
    return new, len(found)


def _unique(names, name):
    candidate, k = name, 1
    while candidate in names:
        candidate, k = f"{name}_{k}", k + 1
    names.add(candidate)
    return candidate
