"""Floating-point operations of the ops that dominate a model's time, from static shapes.

Counted: MatMul / BatchMatMul* (2 * output elements * contracted size) and Conv2D with its two
gradients (2 * forward output elements * kernel height * width * input channels). Other ops are
memory-bound and left out. Works on tf.Operation objects of an imported graph.
"""

import math

import tensorflow as tf


def _dims(tensor):
    """The static shape as a list of ints, or None if any dimension is unknown."""
    shape = tensor.shape
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return None
    return shape.as_list()


def _matmul_flops(op):
    out, a = _dims(op.outputs[0]), _dims(op.inputs[0])
    if out is None or a is None:
        return None
    transposed = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
    return 2 * math.prod(out) * (a[-2] if transposed else a[-1])


def _conv_flops(op):
    if op.type == "Conv2D":
        out, kernel = _dims(op.outputs[0]), _dims(op.inputs[1])
    elif op.type == "Conv2DBackpropInput":
        out, kernel = _dims(op.inputs[2]), _dims(op.inputs[1])
    else:  # Conv2DBackpropFilter: the forward output is its third input
        out, kernel = _dims(op.inputs[2]), _dims(op.outputs[0])
    if out is None or kernel is None:
        return None
    return 2 * math.prod(out) * math.prod(kernel[:3])


FLOP_COUNTERS = {"MatMul": _matmul_flops, "BatchMatMul": _matmul_flops,
                 "BatchMatMulV2": _matmul_flops, "BatchMatMulV3": _matmul_flops,
                 "Conv2D": _conv_flops, "Conv2DBackpropInput": _conv_flops,
                 "Conv2DBackpropFilter": _conv_flops}


def op_flops(op):
    """FLOPs of one op, or None if it is not counted or a shape is unknown."""
    counter = FLOP_COUNTERS.get(op.type)
    return None if counter is None else counter(op)


def half_flop_share(graph, half_dtype, weights=None):
    """(share of counted FLOPs whose op's T is `half_dtype` or None, ops skipped for shapes).

    weights: optional {name scope: runs per step}, e.g. a loop's trip count; an op in several
    scopes takes the largest.
    """
    half = tf.as_dtype(half_dtype)
    total = in_half = skipped = 0
    for op in graph.get_operations():
        if op.type not in FLOP_COUNTERS:
            continue
        flops = op_flops(op)
        if flops is None:
            skipped += 1
            continue
        flops *= max([runs for scope, runs in (weights or {}).items() if scope in op.name],
                     default=1)
        total += flops
        if op.get_attr("T") == half:
            in_half += flops
    return (in_half / total if total else None), skipped
