"""tf_mpt: automatic mixed precision for TensorFlow graphs by graph rewriting.

Public API (loaded on first use: `import tf_mpt` itself imports no TensorFlow):
    rewrite_graph_def(graph_def, *, dtype, fetches, lists, strict) -> RewriteResult
    rewrite_graph(graph, *, dtype, fetches) -> tf.Graph
    rewrite_function(concrete_function, *, dtype) -> ConcreteFunction; function: tf.function
        whose traced graphs are rewritten
    keep_fp32(name=None): context manager; ops built inside stay float32
    OpLists, default_lists, FLOAT16_LISTS, BFLOAT16_LISTS: the op lists, as data
    Config: every TF_MPT_* environment variable, parsed once
    float32_storage_getter, mixed_precision_scope: float32 master weights (TF1 variable scopes)
    LossScaleOptimizer, StaticLossScale, DynamicLossScale, loss_scale.get: loss scaling
    scale_loss, apply_scaled_gradients: loss scaling in TF2 custom loops (GradientTape)
    loss_scale_of(optimizer): the LossScale the automatic path gave an optimizer, or None
    enable, disable, is_enabled: the automatic path (what TF_MPT_ENABLE=1 turns on)
    RewriteReport, NodeDecision, RewriteResult, RewriteError, GraphDefError
"""

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None means the module itself
_EXPORTS = {
    "BFLOAT16_LISTS": ("tf_mpt.lists", "BFLOAT16_LISTS"),
    "Config": ("tf_mpt.config", "Config"),
    "DynamicLossScale": ("tf_mpt.training.loss_scale", "DynamicLossScale"),
    "FLOAT16_LISTS": ("tf_mpt.lists", "FLOAT16_LISTS"),
    "GraphDefError": ("tf_mpt.rewrite.graph_view", "GraphDefError"),
    "LossScaleOptimizer": ("tf_mpt.training.optimizer", "LossScaleOptimizer"),
    "NodeDecision": ("tf_mpt.report", "NodeDecision"),
    "OpLists": ("tf_mpt.lists", "OpLists"),
    "RewriteError": ("tf_mpt.rewrite", "RewriteError"),
    "RewriteReport": ("tf_mpt.report", "RewriteReport"),
    "RewriteResult": ("tf_mpt.rewrite", "RewriteResult"),
    "StaticLossScale": ("tf_mpt.training.loss_scale", "StaticLossScale"),
    "apply_scaled_gradients": ("tf_mpt.training.optimizer", "apply_scaled_gradients"),
    "default_lists": ("tf_mpt.lists", "default_lists"),
    "disable": ("tf_mpt.automatic.switch", "disable"),
    "enable": ("tf_mpt.automatic.switch", "enable"),
    "float32_storage_getter": ("tf_mpt.training.storage", "float32_storage_getter"),
    "function": ("tf_mpt.rewrite.tf_functions", "function"),
    "is_enabled": ("tf_mpt.automatic.state", "is_enabled"),
    "keep_fp32": ("tf_mpt._opt_out", "keep_fp32"),
    "loss_scale": ("tf_mpt.loss_scale", None),
    "loss_scale_of": ("tf_mpt.automatic.optimizers", "loss_scale_of"),
    "mixed_precision_scope": ("tf_mpt.training.storage", "mixed_precision_scope"),
    "rewrite_function": ("tf_mpt.rewrite.tf_functions", "rewrite_function"),
    "rewrite_graph": ("tf_mpt.rewrite", "rewrite_graph"),
    "rewrite_graph_def": ("tf_mpt.rewrite", "rewrite_graph_def"),
    "scale_loss": ("tf_mpt.training.optimizer", "scale_loss"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    try:
        module_name, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'tf_mpt' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _warn_without_hook():
    """One WARNING where TF_MPT_ENABLE (or another switch) is set and the start-up hook that
    acts on it is not installed (an editable install): the script imports tf_mpt, yet
    nothing converted its graphs automatically."""
    from tf_mpt._process import hook_check  # pylint: disable=import-outside-toplevel
    message = hook_check.missing_hook_warning()  # (no switch set: three lookups)
    if message is not None:
        from tf_mpt._process import state  # pylint: disable=import-outside-toplevel
        state.warn_once("startup hook missing", "%s", message)


_warn_without_hook()
