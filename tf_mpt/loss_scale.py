"""Loss scaling, at its public path `tf_mpt.loss_scale` (defined in tf_mpt/training/loss_scale.py)."""

from tf_mpt.training.loss_scale import DynamicLossScale  # noqa: F401
from tf_mpt.training.loss_scale import LossScale  # noqa: F401
from tf_mpt.training.loss_scale import StaticLossScale  # noqa: F401
from tf_mpt.training.loss_scale import all_finite  # noqa: F401
from tf_mpt.training.loss_scale import get  # noqa: F401

__all__ = ["LossScale", "StaticLossScale", "DynamicLossScale", "get", "all_finite"]
