"""Op lists: which ops tf_mpt may run in half precision, as data.

Four lists decide every op's fate (the words follow TensorFlow's Grappler pass):

* ``allow``: numerically safe, performance critical ops that always run in half precision.
* ``infer``: numerically safe ops that an upstream ``deny`` op can make unsafe.
* ``deny``: numerically dangerous ops whose effect is also seen downstream; always float32.
* ``clear``: ops with no numerically significant effect; they take the colour of neighbours.

An op on no list stays float32. The defaults follow Grappler's lists for TensorFlow 2.21
(CUDA float16 and oneDNN bfloat16 modes) with two deliberate differences: TensorList ops and
the functional ``While``/``StatelessWhile`` are left off the clear list, because painting them
needs every op of one list (or the loop body) to agree, which is the control-flow work and not
done by op name alone; and ``BatchMatMulV3`` is allowed.

Example:
    >>> from tf_mpt import lists
    >>> "MatMul" in lists.default_lists("bfloat16").allow
    True
"""

import dataclasses
import logging

from tf_mpt import _dtypes

_log = logging.getLogger(__name__)

LIST_NAMES = ("allow", "infer", "deny", "clear")

# --- allow: the matrix engines. Both dtypes. --------------------------------------------------
_ALLOW_COMMON = frozenset({
    # dense and batched matrix products
    "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "MatMul",
    # 2-D convolutions and their gradients
    "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput",
    # depthwise convolutions (Grappler: cuDNN >= 8 for float16)
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter",
    "DepthwiseConv2dNativeBackpropInput",
    # 3-D convolutions (Grappler: cuDNN >= 7.6.2 for float16)
    "Conv3D", "Conv3DBackpropFilterV2", "Conv3DBackpropInputV2",
})

# float16 only: fused RNN cells and vendor kernels with fast float16 GPU paths.
_ALLOW_FLOAT16_ONLY = frozenset({
    "BlockLSTM", "BlockLSTMGrad", "BlockLSTMGradV2", "BlockLSTMV2",
    "Conv3DBackpropFilter", "Conv3DBackpropInput",
    "CudnnRNN", "CudnnRNNBackprop", "CudnnRNNBackpropV2", "CudnnRNNBackpropV3", "CudnnRNNV2",
    "CudnnRNNV3",
    "FastUnsortedSegmentMax", "FusedConv2DBiasActivation", "FusedSparseConvGpuV2",
    "GRUBlockCell", "GRUBlockCellGrad", "LSTMBlockCell", "LSTMBlockCellGrad",
    "Mha", "MhaV2", "Pmlp", "Tmlp", "TmlpV2", "TmlpV3", "VoxelMax",
})

# bfloat16 only: oneDNN's fused pad + conv.
_ALLOW_BFLOAT16_ONLY = frozenset({"FusedPadConv2D"})

# --- infer: safe unless fed by a deny op. -------------------------------------------------------
_INFER_COMMON = frozenset({
    # element-wise arithmetic
    "Add", "AddN", "AddV2", "FloorDiv", "Inv", "Mul", "RealDiv", "Reciprocal", "Sub",
    # activations and their gradients
    "Elu", "EluGrad", "LeakyRelu", "LeakyReluGrad", "Selu", "SeluGrad", "Sigmoid",
    "SigmoidGrad", "Softplus", "SoftplusGrad", "Softsign", "SoftsignGrad", "Tanh", "TanhGrad",
    # transcendental functions with a bounded range
    "Erf", "Erfc", "Log", "Log1p", "Sqrt",
    # softmax: normalised internally
    "LogSoftmax", "Softmax",
    # bias, pooling and batch norm (batch norm keeps its statistics in float32: attr U)
    "AvgPool", "AvgPool3D", "AvgPool3DGrad", "AvgPoolGrad", "BiasAdd", "BiasAddGrad",
    "BiasAddV1", "FusedBatchNormGradV2", "FusedBatchNormGradV3", "FusedBatchNormV2",
    "FusedBatchNormV3", "_FusedBatchNormEx",
    # products over a reduction axis
    "Prod",
})

# bfloat16 has float32's exponent range: sums and means of many terms do not overflow.
_INFER_BFLOAT16_ONLY = frozenset({"Mean", "Rsqrt", "Square", "SquaredDifference", "Sum"})

# --- deny: overflow or precision loss that downstream ops inherit. ------------------------------
_DENY_COMMON = frozenset({
    "Exp", "Expm1", "L2Loss", "Pow", "SaveV2",
    "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits",
})

# float16's range ends at 65504: large reductions overflow.
_DENY_FLOAT16_ONLY = frozenset({"Mean", "Sum"})

# --- clear: data movement, comparisons, v1 control flow. ----------------------------------------
_CLEAR_COMMON = frozenset({
    # element-wise, no rounding beyond the input's
    "Abs", "Ceil", "ClipByValue", "Floor", "Maximum", "Minimum", "Neg", "Relu", "Relu6",
    "Relu6Grad", "ReluGrad", "Round", "Sign",
    # reductions that select rather than accumulate
    "ArgMax", "ArgMin", "Max", "Min", "TopK", "TopKV2",
    # comparisons and checks
    "CheckNumerics", "Equal", "Greater", "GreaterEqual", "IsFinite", "IsInf", "IsNan", "Less",
    "LessEqual", "NotEqual",
    # shape and layout
    "BatchToSpace", "BatchToSpaceND", "BroadcastTo", "DepthToSpace", "EnsureShape",
    "ExpandDims", "Rank", "Reshape", "Shape", "ShapeN", "SpaceToBatch", "SpaceToBatchND",
    "SpaceToDepth", "Squeeze", "Transpose",
    # slicing, gathering and joining
    "Concat", "ConcatV2", "DynamicPartition", "DynamicStitch", "Fill", "Gather", "GatherNd",
    "GatherV2", "MirrorPad", "MirrorPadGrad", "Pack", "Pad", "PadV2", "Reverse",
    "ReverseSequence", "ReverseV2", "Select", "SelectV2", "Slice", "Split", "SplitV",
    "StridedSlice", "StridedSliceGrad", "Tile", "Unpack", "Where",
    # identities and gradient plumbing
    "Identity", "IdentityN", "OnesLike", "PreventGradient", "Snapshot", "StopGradient",
    "ZerosLike",
    # max pooling and nearest-neighbour resizing select existing values
    "MaxPool", "MaxPool3D", "MaxPool3DGrad", "MaxPoolGrad", "MaxPoolGradGrad",
    "MaxPoolGradGradV2", "MaxPoolGradV2", "MaxPoolV2", "ResizeNearestNeighbor",
    "ResizeNearestNeighborGrad",
    # v1 control flow: a value keeps its colour through a frame (back edges matched later)
    "Enter", "Exit", "Merge", "NextIteration", "Switch",
})

_CLEAR_FLOAT16_ONLY = frozenset({"MaxPool3DGradGrad", "OneHot", "Size"})
_CLEAR_BFLOAT16_ONLY = frozenset({"ResizeBilinear", "ScatterNd"})


@dataclasses.dataclass(frozen=True)
class OpLists:
    """The four op lists. Immutable; `edited` returns a new instance.

    Attributes:
        allow, infer, deny, clear: frozensets of op type names, pairwise disjoint.
    """
    allow: frozenset = frozenset()
    infer: frozenset = frozenset()
    deny: frozenset = frozenset()
    clear: frozenset = frozenset()

    def __post_init__(self):
        for list_name in LIST_NAMES:
            value = getattr(self, list_name)
            if isinstance(value, str) or not all(isinstance(op, str) for op in value):
                raise TypeError(
                    f"OpLists.{list_name} must be a collection of op names (str). "
                    f"Received: {list_name}={value!r}")
            object.__setattr__(self, list_name, frozenset(value))
        seen = {}
        for list_name in LIST_NAMES:
            for op in sorted(getattr(self, list_name)):
                if op in seen:
                    raise ValueError(
                        f"Op {op!r} is on both the {seen[op]} list and the {list_name} list; "
                        "an op may be on one list only. Remove it from one of them.")
                seen[op] = list_name

    def list_of(self, op):
        """Returns 'allow', 'infer', 'deny', 'clear' or None for an op type name."""
        for list_name in LIST_NAMES:
            if op in getattr(self, list_name):
                return list_name
        return None

    def edited(self, add=None, remove=None):
        """Returns new lists with ops added to and removed from lists.

        An op added to one list leaves whatever list it was on before, so moving an op takes
        one ADD (Grappler instead fails validation and skips its whole pass). Removals apply
        after additions. Unknown op names are kept but logged as a warning.

        Args:
            add: mapping list name -> iterable of op names to put on that list.
            remove: mapping list name -> iterable of op names to take off that list.
        """
        add = {k: set(v) for k, v in (add or {}).items()}
        remove = {k: set(v) for k, v in (remove or {}).items()}
        for name in set(add) | set(remove):
            if name not in LIST_NAMES:
                raise ValueError(
                    f"Unknown op list {name!r}; the lists are {', '.join(LIST_NAMES)}.")
        added_to = {}
        for name in LIST_NAMES:
            for op in sorted(add.get(name, ())):
                if op in added_to:
                    raise ValueError(
                        f"Op {op!r} is added to both the {added_to[op]} list and the {name} "
                        "list; add it to one list only.")
                added_to[op] = name
        _warn_unknown_ops(sorted(set(added_to) | set().union(*remove.values())))
        new = {}
        for name in LIST_NAMES:
            ops = set(getattr(self, name))
            ops -= {op for op, target in added_to.items() if target != name}
            ops |= add.get(name, set())
            ops -= remove.get(name, set())
            new[name] = frozenset(ops)
        return OpLists(**new)

    def to_dict(self):
        """Returns {list name: sorted list of op names}."""
        return {name: sorted(getattr(self, name)) for name in LIST_NAMES}

    def __str__(self):
        lines = []
        for name in LIST_NAMES:
            ops = sorted(getattr(self, name))
            lines.append(f"{name} ({len(ops)}): {', '.join(ops)}")
        return "\n".join(lines)


def _warn_unknown_ops(op_names):
    """Logs one warning naming every op that TensorFlow does not register."""
    if not op_names:
        return
    from tensorflow.python.framework import op_def_registry  # pylint: disable=g-import-not-at-top
    unknown = [op for op in op_names if op_def_registry.get(op) is None]
    if unknown:
        _log.warning(
            "tf_mpt op list edit names op(s) TensorFlow does not register: %s. "
            "Check the spelling (op type names are CamelCase, e.g. 'MatMul').",
            ", ".join(unknown))


FLOAT16_LISTS = OpLists(
    allow=_ALLOW_COMMON | _ALLOW_FLOAT16_ONLY,
    infer=_INFER_COMMON,
    deny=_DENY_COMMON | _DENY_FLOAT16_ONLY,
    clear=_CLEAR_COMMON | _CLEAR_FLOAT16_ONLY,
)

BFLOAT16_LISTS = OpLists(
    allow=_ALLOW_COMMON | _ALLOW_BFLOAT16_ONLY,
    infer=_INFER_COMMON | _INFER_BFLOAT16_ONLY,
    deny=_DENY_COMMON,
    clear=_CLEAR_COMMON | _CLEAR_BFLOAT16_ONLY,
)


def default_lists(dtype):
    """Returns the default OpLists for 'float16' or 'bfloat16' (no env edits applied)."""
    return FLOAT16_LISTS if _dtypes.parse(dtype) is _dtypes.FLOAT16 else BFLOAT16_LISTS
