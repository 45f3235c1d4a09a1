"""Training in mixed precision: float32 storage of half variables, loss scaling, checkpoints.

    storage.py      float32_storage_getter, mixed_precision_scope (float32 master weights)
    loss_scale.py   StaticLossScale, DynamicLossScale, get(): the scale and its state
    scaling.py      the arithmetic: scale a loss, unscale a gradient, apply only if finite
    gradient_records.py  the gradient computations the automatic path scaled, and which
                         optimizer's loss scale each uses (LossScaleOptimizer claims them too)
    optimizer.py    LossScaleOptimizer (TF1), scale_loss / apply_scaled_gradients (TF2)
    checkpoints.py  float32 checkpoints restore into a graph with loss-scale variables
"""

from tf_mpt._process import autograph as _autograph

_autograph.leave_tf_mpt_unconverted()  # a user's tf.function calls into tf_mpt as written
