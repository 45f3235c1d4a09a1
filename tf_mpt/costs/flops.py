"""Floating-point operations of the ops that dominate a model's time, from static shapes.

Counted: MatMul / BatchMatMul* (2 * output elements * contracted size), Einsum with two inputs
(2 * the product of every index's size) and Conv2D with its two gradients (2 * forward output
elements * kernel height * width * input channels). Other ops are memory-bound and left out.
Works on tf.Operation objects of an imported graph.
"""

import math

import tensorflow as tf

from tf_mpt.costs import contractions as _contractions


def _dims(tensor):
    """The static shape as a list of ints, or None if any dimension is unknown."""
    shape = tensor.shape
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return None
    return shape.as_list()


def transposed_attr(op_type):
    """The attr saying whether a matrix product reads its first input transposed."""
    return "transpose_a" if op_type == "MatMul" else "adj_x"


def einsum_flops(equation, input_dims):
    """2 x the product of every index's size (each multiply-add of the contraction) for a
    two-input equation without ellipsis; None otherwise."""
    inputs, _, _ = equation.replace(" ", "").partition("->")
    terms = inputs.split(",")
    if len(terms) != 2 or "." in inputs:
        return None
    sizes = {}
    for port, term in enumerate(terms):
        dims = input_dims(port)
        if dims is None or len(dims) != len(term):
            return None
        sizes.update(zip(term, dims))
    return 2 * math.prod(sizes.values())


def flops_from_shapes(op_type, transposed, input_dims, output_dims, equation=None):
    """FLOPs of one op of contractions.FLOP_OPS; None if a shape is unknown or the op is not one
    of them (its cost is unknown here, never guessed).

    input_dims(port) / output_dims(port): the static shape as a list of ints, or None.
    transposed: the product reads its first input transposed (matrix products only).
    equation: an Einsum's equation.
    """
    if op_type == "Einsum":
        return None if equation is None else einsum_flops(equation, input_dims)
    if op_type in _contractions.MATMUL_OPS:
        out, a = output_dims(0), input_dims(0)
        if out is None or a is None or len(a) < 2:
            return None
        return 2 * math.prod(out) * (a[-2] if transposed else a[-1])
    if op_type == "Conv2D":
        out, kernel = output_dims(0), input_dims(1)
    elif op_type == "Conv2DBackpropInput":
        out, kernel = input_dims(2), input_dims(1)
    elif op_type == "Conv2DBackpropFilter":  # the forward output (gradient): third input
        out, kernel = input_dims(2), output_dims(0)
    else:
        return None
    if out is None or kernel is None or len(kernel) != 4:
        return None
    return 2 * math.prod(out) * math.prod(kernel[:3])


def op_flops(op):
    """FLOPs of one tf.Operation, or None if it is not counted or a shape is unknown."""
    if op.type not in _contractions.FLOP_OPS:
        return None
    transposed = op.type in _contractions.MATMUL_OPS and op.get_attr(transposed_attr(op.type))
    equation = op.get_attr("equation").decode() if op.type == "Einsum" else None
    return flops_from_shapes(op.type, transposed, lambda port: _dims(op.inputs[port]),
                             lambda port: _dims(op.outputs[port]), equation)


def half_flop_share(graph, half_dtype, weights=None, half_names=None):
    """(share of counted FLOPs whose op's T is `half_dtype` or None, ops skipped for shapes).

    weights: optional {name scope: runs per step}, e.g. a loop's trip count; an op in several
    scopes takes the largest.
    half_names: optional names of the ops that run in half, for a float32 `graph` another tool
    converts (the shapes are the float32 graph's, the decisions the tool's).
    """
    half = tf.as_dtype(half_dtype)
    total = in_half = skipped = 0
    for op in graph.get_operations():
        if op.type not in _contractions.FLOP_OPS:
            continue
        flops = op_flops(op)
        if flops is None:
            skipped += 1
            continue
        flops *= max([runs for scope, runs in (weights or {}).items() if scope in op.name],
                     default=1)
        total += flops
        if (op.name in half_names) if half_names is not None else op.get_attr("T") == half:
            in_half += flops
    return (in_half / total if total else None), skipped
