"""tf_mpt: automatic mixed precision for TensorFlow graphs by graph rewriting.

Public API:
    rewrite_graph_def(graph_def, *, dtype, fetches, lists, strict) -> RewriteResult
    rewrite_graph(graph, *, dtype, fetches) -> tf.Graph
    keep_fp32(name=None): context manager; ops built inside stay float32
    rewrite_function(concrete_function, *, dtype) -> ConcreteFunction; function: tf.function
        whose traced graphs are rewritten
    OpLists, default_lists, FLOAT16_LISTS, BFLOAT16_LISTS: the op lists, as data
    Config: every TF_MPT_* environment variable, parsed once
    float32_storage_getter, mixed_precision_scope: float32 master weights (TF1 variable scopes)
    LossScaleOptimizer, StaticLossScale, DynamicLossScale, loss_scale.get: loss scaling
    scale_loss, apply_scaled_gradients: loss scaling in TF2 custom loops (GradientTape)
    RewriteReport, NodeDecision, RewriteResult, RewriteError, GraphDefError
"""

from tf_mpt import loss_scale
from tf_mpt._functions import function
from tf_mpt._functions import rewrite_function
from tf_mpt.config import Config
from tf_mpt.lists import BFLOAT16_LISTS
from tf_mpt.lists import FLOAT16_LISTS
from tf_mpt.lists import OpLists
from tf_mpt.lists import default_lists
from tf_mpt.loss_scale import DynamicLossScale
from tf_mpt.loss_scale import StaticLossScale
from tf_mpt.optimizer import LossScaleOptimizer
from tf_mpt.optimizer import apply_scaled_gradients
from tf_mpt.optimizer import scale_loss
from tf_mpt.report import NodeDecision
from tf_mpt.report import RewriteReport
from tf_mpt.rewrite import GraphDefError
from tf_mpt.rewrite import RewriteError
from tf_mpt.rewrite import RewriteResult
from tf_mpt.rewrite import keep_fp32
from tf_mpt.rewrite import rewrite_graph
from tf_mpt.rewrite import rewrite_graph_def
from tf_mpt.variables import float32_storage_getter
from tf_mpt.variables import mixed_precision_scope

__version__ = "0.1.0"

__all__ = [
    "BFLOAT16_LISTS",
    "Config",
    "DynamicLossScale",
    "FLOAT16_LISTS",
    "GraphDefError",
    "LossScaleOptimizer",
    "NodeDecision",
    "OpLists",
    "RewriteError",
    "RewriteReport",
    "RewriteResult",
    "StaticLossScale",
    "apply_scaled_gradients",
    "default_lists",
    "float32_storage_getter",
    "function",
    "keep_fp32",
    "loss_scale",
    "mixed_precision_scope",
    "rewrite_function",
    "rewrite_graph",
    "rewrite_graph_def",
    "scale_loss",
]
