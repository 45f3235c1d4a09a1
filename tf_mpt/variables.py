"""float32 master weights at their public path `tf_mpt.variables` (defined in tf_mpt/training/storage.py)."""

from tf_mpt.training.storage import float32_storage_getter  # noqa: F401
from tf_mpt.training.storage import mixed_precision_scope  # noqa: F401

__all__ = ["float32_storage_getter", "mixed_precision_scope"]
