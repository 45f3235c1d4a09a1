"""LossScaleOptimizer at its public path `tf_mpt.optimizer` (defined in tf_mpt/training/optimizer.py)."""

from tf_mpt.training.optimizer import LossScaleOptimizer  # noqa: F401
from tf_mpt.training.optimizer import apply_scaled_gradients  # noqa: F401
from tf_mpt.training.optimizer import scale_loss  # noqa: F401

__all__ = ["LossScaleOptimizer", "apply_scaled_gradients", "scale_loss"]
