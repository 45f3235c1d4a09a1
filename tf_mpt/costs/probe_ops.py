"""The op types the probes time, by name (no TensorFlow import): what probes.py builds a
probe graph for and what op_costs asks the probes for, so neither imports the other's
machinery.

    UNARY / BINARY   elementwise ops: op -> the name(s) of their input argument(s)
    PROBED_OPS       every op type (cost key) a probe times
    CASTS            the two Cast probes (float32 -> half, half -> float32), in every table
"""

from tf_mpt.costs import contractions as _contractions

# op -> (kind, input names) of the elementwise probes; kind: unary / binary (two inputs of
# the same shape).
UNARY = {op: "x" for op in (
    "Sigmoid", "Tanh", "Erf", "Erfc", "Exp", "Log", "Sqrt", "Rsqrt", "Square", "Neg", "Abs",
    "Reciprocal", "Log1p", "Expm1", "Sin", "Cos")}
UNARY.update({op: "features" for op in ("Relu", "Relu6", "Elu", "Selu", "Softplus",
                                         "LeakyRelu", "Softsign")})
BINARY = {op: ("x", "y") for op in (
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "DivNoNan", "Maximum", "Minimum",
    "SquaredDifference", "Pow")}
BINARY.update({op: ("gradients", "features") for op in (
    "ReluGrad", "Relu6Grad", "LeakyReluGrad", "SoftplusGrad")})
BINARY["EluGrad"] = ("gradients", "outputs")
BINARY.update({op: ("y", "dy") for op in ("SigmoidGrad", "TanhGrad", "RsqrtGrad",
                                          "SqrtGrad")})

# Every op type (cost key) a probe times: what op_costs asks for by name.
PROBED_OPS = frozenset(UNARY) | frozenset(BINARY) | frozenset((
    "Swish", "BiasAdd", "BiasAddGrad", "Softmax", "ConcatV2", "Pad", "Sum", "Mean", "Max",
    "Prod", "Transpose", "MaxPool", "AvgPool", "FusedBatchNormV3",
    "FusedBatchNormV3:inference", "FusedBatchNormGradV3", "MatMul", "BatchMatMulV2",
    "BatchMatMul", "Einsum")) | frozenset(_contractions.CONV_OPS + _contractions.DEPTHWISE_OPS)
CASTS = ("Cast:to", "Cast:from")
