"""The contraction ops, named once: matrix products and convolutions, the ops that dominate a
model's time (no TensorFlow import).

    FLOP_OPS        costed per FLOP (flops.py counts them; op-cost tables interpolate them
                    by FLOPs, every other op by elements)
    NODE_TIMED_OPS  timed at each node's own shapes and attrs (FLOP_OPS and the depthwise
                    convolutions, whose speed in half varies by stride and shape)
    SPREAD_OPS      node probes that go round each other (matrix products; convolutions keep
                    their runs back to back: probes.py)
    FUSING_OPS      forward contractions Grappler's remapper fuses a bias and activation into
"""

MATMUL_OPS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
CONV_OPS = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
DEPTHWISE_OPS = ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                 "DepthwiseConv2dNativeBackpropFilter")
FLOP_OPS = frozenset(MATMUL_OPS + CONV_OPS + ("Einsum",))
NODE_TIMED_OPS = FLOP_OPS | frozenset(DEPTHWISE_OPS)
SPREAD_OPS = frozenset(MATMUL_OPS + ("Einsum",))
FUSING_OPS = frozenset(MATMUL_OPS + ("Conv2D", "DepthwiseConv2dNative", "Einsum"))
