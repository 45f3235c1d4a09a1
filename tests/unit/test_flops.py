"""FLOPs from static shapes (tf_mpt/costs/flops.py): the ops it models, and None
("unknown", no cost) for any other op rather than a guess."""

import pytest

from tf_mpt.costs import contractions
from tf_mpt.costs import flops


def _dims(shapes):
    return lambda port: shapes.get(port)


def test_a_matrix_product_counts_two_flops_per_multiply_add():
    assert flops.flops_from_shapes("MatMul", False, _dims({0: [32, 128]}),
                                   _dims({0: [32, 512]})) == 2 * 32 * 512 * 128
    assert flops.flops_from_shapes("MatMul", True, _dims({0: [128, 32]}),
                                   _dims({0: [32, 512]})) == 2 * 32 * 512 * 128


def test_convolutions_and_their_gradients_count_the_forward_products():
    forward = 2 * (8 * 16 * 16 * 64) * (3 * 3 * 32)
    assert flops.flops_from_shapes("Conv2D", False, _dims({1: [3, 3, 32, 64]}),
                                   _dims({0: [8, 16, 16, 64]})) == forward
    assert flops.flops_from_shapes("Conv2DBackpropInput", False,
                                   _dims({1: [3, 3, 32, 64], 2: [8, 16, 16, 64]}),
                                   _dims({})) == forward
    assert flops.flops_from_shapes("Conv2DBackpropFilter", False, _dims({2: [8, 16, 16, 64]}),
                                   _dims({0: [3, 3, 32, 64]})) == forward


def test_einsum_counts_every_index_once():
    # Keras MultiHeadAttention's query projection: [16, 32, 128] x [128, 4, 32]
    shapes = _dims({0: [16, 32, 128], 1: [128, 4, 32]})
    assert flops.flops_from_shapes("Einsum", False, shapes, _dims({}),
                                   equation="abc,cde->abde") == 2 * 16 * 32 * 128 * 4 * 32
    assert flops.flops_from_shapes("Einsum", False, shapes, _dims({}), equation=None) is None
    assert flops.flops_from_shapes("Einsum", False, shapes, _dims({}),
                                   equation="...c,cde->...de") is None  # ellipsis: unknown


@pytest.mark.parametrize("op_type", ["DepthwiseConv2dNative", "Conv3D", "Relu"])
def test_an_op_it_does_not_model_is_unknown_not_a_guess(op_type):
    assert op_type not in contractions.FLOP_OPS
    shapes = _dims({0: [8, 16, 16, 64], 1: [3, 3, 32, 64], 2: [8, 16, 16, 64]})
    assert flops.flops_from_shapes(op_type, False, shapes, shapes) is None


def test_an_unknown_shape_is_unknown():
    assert flops.flops_from_shapes("MatMul", False, _dims({}), _dims({0: [32, 512]})) is None
