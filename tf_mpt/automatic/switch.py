"""enable() / disable(): turn the automatic path on (TF_MPT_ENABLE=1, `python -m tf_mpt`,
`tf_mpt.enable()`) and off.

    TF1 Sessions       tf_mpt.automatic.sessions (in their Grappler pass, or a rewritten copy)
    tf.function, Keras tf_mpt.automatic.keras (tf_mpt.function, the mixed_* dtype policy)
    gradients          tf_mpt.automatic.gradients (tf.gradients, GradientTape: loss scaling)
    optimizers         tf_mpt.automatic.optimizers (which scale applies them)
"""

import dataclasses
import logging
import os

import tensorflow as tf

from tf_mpt import _cpu
from tf_mpt._process import patches as _patches
from tf_mpt.automatic import gradients as _gradients
from tf_mpt.automatic import keras as _keras
from tf_mpt.automatic import optimizers as _optimizers
from tf_mpt.automatic import sessions as _sessions
from tf_mpt.automatic import state as _state
from tf_mpt.automatic.native import rewriter as _session_rewrite
from tf_mpt.costs import dispatch as _dispatch
from tf_mpt.costs import op_costs as _op_costs
from tf_mpt.training import gradient_records as _records

_log = logging.getLogger(__name__)

is_enabled = _state.is_enabled
enabled_settings = _state.enabled_settings


def enable(config=None, *, gpu_visible=None, native_bfloat16=None):
    """Turns on the automatic path for this process (idempotent).

    TF1 Sessions rewrite their graph in their own Grappler pass (or run a rewritten copy,
    see the module docstring), and tf.compat.v1.train.Optimizer gets
    dynamic loss scaling (float16 by default). Returns the resolved settings, or None when
    'auto' found no fast half type (the script stays float32; one warning per process says
    why).
    """
    if _state.STATE.settings is not None:
        return _state.STATE.settings
    from tf_mpt import config as _config  # pylint: disable=g-import-not-at-top
    config = config if config is not None else _config.Config.from_env(os.environ)
    if gpu_visible is None:
        gpu_visible = bool(tf.config.list_physical_devices("GPU"))
    if native_bfloat16 is None:
        native_bfloat16 = _cpu.has_native_bfloat16(_cpu.cpu_flags(config))
    dtype = config.resolve_dtype(gpu_visible, native_bfloat16)
    if dtype is None or gpu_visible or not config.graph_rewrite:
        _dispatch.stop_started()  # a child started at start-up for graphs that run here
    if dtype is None:
        if not _state.STATE.stays_float32:
            _state.STATE.stays_float32 = True
            _log.warning("TF_MPT_DTYPE=auto found no GPU and no native bfloat16 on this CPU "
                         "(needs %s); the script runs in float32. Set TF_MPT_DTYPE=bfloat16 "
                         "or float16 to force a half type.",
                         " or ".join(_cpu.NATIVE_BFLOAT16_FLAGS))
        return None
    settings = _state.Settings(config=config, dtype=dtype, rewrite=config.graph_rewrite,
                               loss_scaling=config.loss_scaling_for(dtype),
                               loss_scale=config.loss_scale)
    if settings.rewrite:  # the first rewrite will measure this CPU: its child imports now,
        # while the optimizer compiles and the script builds its graph
        _op_costs.start_measuring_early(config, dtype, gpu_visible)
        if not gpu_visible:  # the graphs run here: the dispatch check's child starts too
            _dispatch.start_early(config, dtype)
    settings = dataclasses.replace(settings, session_rewrite=_sessions.patch_sessions(
        config, dtype, settings.rewrite, settings.loss_scaling))
    if settings.rewrite:
        _keras.patch_tf_function(dtype, keras_steps=settings.keras_rewrite,
                                 leave_own_half=not settings.keras_policy)
    if settings.keras_policy:
        _keras.set_keras_policy(dtype)
    if settings.loss_scaling:
        optimizer_class = tf.compat.v1.train.Optimizer
        _state.patch(optimizer_class, "compute_gradients", _optimizers.compute_gradients)
        _state.patch(optimizer_class, "apply_gradients", _optimizers.apply_gradients)
        _patch_gradients(settings.loss_scale, config.allreduce_dtype)
    _state.STATE.settings = settings
    _keras.watch_keras_imports()
    _log.info("enabled: dtype=%s graph_rewrite=%s (TF1 Sessions: %s) loss_scaling=%s "
              "loss_scale=%s keras=%s", dtype, settings.rewrite, settings.session_rewrite,
              settings.loss_scaling, settings.loss_scale, config.keras)
    if settings.rewrite:
        _log.info("%s runs in TF1 Sessions, tf.function graphs and %s; eager ops (outside "
                  "tf.function) run in float32", dtype,
                  "Keras fit / evaluate / predict" if settings.keras_rewrite
                  else "Keras layers (mixed_%s policy)" % dtype)
    return settings


def disable():
    """Turns the automatic path off and removes every process-wide patch tf_mpt made
    (existing Sessions and the Saver.restore fallback of tf_mpt.training.checkpoints
    included)."""
    _patches.undo_all()
    _session_rewrite.uninstall()
    _sessions.close_shadows()
    _state.STATE.warned.clear()
    _state.STATE.settings = None
    _state.STATE.stays_float32 = False


def _patch_gradients(loss_scale, allreduce_dtype):
    """tf.gradients, tf.compat.v1.gradients and GradientTape.gradient scale the backward pass
    of the script's losses; Keras optimizers apply them with a loss scale of their own."""
    _records.install(loss_scale, allreduce_dtype)
    _patches.record("<automatic loss scaling>", _records.uninstall)
    for module in _state.tf_api_modules():
        if hasattr(module, "gradients") and not _patches.is_applied(module, "gradients"):
            _state.patch_function(module, "gradients", _gradients.tf_gradients)
    _state.patch(tf.GradientTape, "gradient", _gradients.tape_gradient)
    _optimizers.patch_keras_optimizers()

