"""TF2 under the automatic path: `tf.function` in user code becomes tf_mpt.function, and so do
the step functions Keras and tf_keras trace for fit / evaluate / predict (TF_MPT_KERAS=rewrite,
the default: Keras itself stays float32, so every tensor the script receives keeps its dtype);
with TF_MPT_KERAS=policy, Keras and tf_keras get the mixed_* dtype policy instead. A Keras
imported after enable() gets its policy and optimizer patches when its import finishes.
"""

import functools
import logging
import sys

from tf_mpt._process import import_hooks as _import_hooks
from tf_mpt._process import patches as _patches
from tf_mpt.automatic import optimizers as _optimizers
from tf_mpt.automatic import state as _state
from tf_mpt.training import gradient_records as _records

_log = logging.getLogger(__name__)


_KERAS_POLICY = "<keras dtype policy>"
_TF_KERAS_POLICY = "<tf_keras dtype policy>"
_LIBRARY_PREFIXES = ("keras", "tf_keras", "tensorflow", "tf_mpt", "absl")
# The step functions Keras 3 and tf_keras trace for fit / evaluate / predict, by module: the
# one that runs a batch (Keras 3 traces another around it that only feeds it from the
# iterator; rewriting that too would rewrite the step twice).
KERAS_STEP_FUNCTIONS = {
    "keras.src.backend.tensorflow.trainer": (
        "one_step_on_data", "one_step_on_data_distributed", "multi_step_on_data"),
    "tf_keras.src.engine.training": ("train_function", "test_function", "predict_function"),
}
# Where they take the training step's gradients (Keras 3 in its trainer, tf_keras in its
# optimizers' minimize).
KERAS_GRADIENT_MODULES = tuple(KERAS_STEP_FUNCTIONS) + (
    "tf_keras.src.optimizers.optimizer", "tf_keras.src.optimizers.legacy.optimizer_v2")


def _keras_step(func):
    module = getattr(func, "__module__", "") or ""
    return getattr(func, "__name__", None) in KERAS_STEP_FUNCTIONS.get(module, ())


def rewrites_keras():
    """True when Keras's step functions are rewritten (TF_MPT_KERAS=rewrite)."""
    settings = _state.STATE.settings
    return settings is not None and settings.keras_rewrite


_HALF = ("float16", "bfloat16")


def mixed_policy_in_effect():
    """Whether Keras layers built now compute in half: tf_mpt set the mixed policy
    (TF_MPT_KERAS=policy: every thread), or the script set one (checked in this thread:
    Keras's global policy is per thread, and a MirroredStrategy replica's is unset)."""
    settings = _state.STATE.settings
    if settings is not None and settings.keras_policy:
        return True
    for _, _, get, _ in _policy_accessors():
        try:
            if str(get().compute_dtype) in _HALF:
                return True
        except Exception:  # pylint: disable=broad-except
            continue
    return False


def patch_tf_function(dtype, keras_steps=True, leave_own_half=True):
    """`tf.function` in user code becomes tf_mpt.function, and so do Keras's step functions
    when `keras_steps` (other Keras and TF internals keep theirs). `leave_own_half`: a traced
    graph that already computes in half runs as traced (the script's own mixed precision;
    False where tf_mpt set Keras's mixed policy itself)."""
    from tf_mpt.rewrite import tf_functions as _functions  # pylint: disable=g-import-not-at-top
    original = _functions._TF_FUNCTION  # pylint: disable=protected-access

    def function(func=None, **kwargs):
        if func is None:
            return lambda f: function(f, **kwargs)
        module = getattr(func, "__module__", "") or ""
        if module.split(".")[0] in _LIBRARY_PREFIXES and not (keras_steps and _keras_step(func)):
            return original(func, **kwargs)
        try:
            return _functions.Function(func, dtype, kwargs, on_trace=_report_unclaimed,
                                       leave_own_half=leave_own_half)
        except Exception as error:  # pylint: disable=broad-except
            _log.warning("tf_mpt left tf.function %s in float32 (%s: %s)",
                         getattr(func, "__name__", func), type(error).__name__, error)
            return original(func, **kwargs)

    functools.update_wrapper(function, original)
    for module in _state.tf_api_modules():
        if getattr(module, "function", None) is original:
            _patches.replace(module, "function", function)


def _report_unclaimed(graph):
    """A traced tf.function: one WARNING per gradient computation that reached no optimizer."""
    if _state.STATE.settings is not None and _state.STATE.settings.loss_scaling:
        _records.report_unclaimed(graph)


def _policy_accessors():
    """(patch label, library, get, set) of the global dtype policy of Keras and of tf_keras,
    for each that is imported."""
    found = []
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "config"):
        found.append((_KERAS_POLICY, "Keras", keras.config.dtype_policy,
                      keras.config.set_dtype_policy))
    tf_keras = sys.modules.get("tf_keras")
    mixed = getattr(tf_keras, "mixed_precision", None) if tf_keras is not None else None
    if mixed is not None and hasattr(mixed, "set_global_policy"):
        found.append((_TF_KERAS_POLICY, "tf_keras", mixed.global_policy,
                       mixed.set_global_policy))
    return found


def set_keras_policy(dtype):
    """Keras `fit` scripts: the global dtype policy mixed_float16 / mixed_bfloat16 (Keras then
    wraps the optimizer in its own LossScaleOptimizer for float16 at compile); the same for
    tf_keras (`tf.keras` under TF_USE_LEGACY_KERAS=1). A library not imported yet gets it
    from keras_imported()."""
    for label, library, get, set_ in _policy_accessors():
        _set_policy(label, library, get, set_, dtype)


def _set_policy(label, library, get, set_, dtype):
    if _patches.is_applied(None, label):
        return
    try:
        previous = get()
        set_(f"mixed_{dtype}")
    except Exception as error:  # pylint: disable=broad-except
        _log.debug("%s dtype policy not set: %s", library, error)
        return
    _patches.record(label, lambda: set_(previous))
    _log.info("%s global dtype policy set to mixed_%s (%s models built from now on compute "
              "in %s with float32 variables)", library, dtype, library, dtype)


_KERAS_LIBRARIES = ("keras", "tf_keras")
_KERAS_IMPORT_HOOK = "<keras import hook>"


def watch_keras_imports():
    """Keras or tf_keras imported after enable() (a script calling tf_mpt.enable() before
    `import keras`) gets its policy and optimizer patches once its import finishes."""
    missing = [name for name in _KERAS_LIBRARIES if name not in sys.modules]
    if not missing or _patches.is_applied(None, _KERAS_IMPORT_HOOK):
        return

    hook = _import_hooks.AfterImport(missing, keras_imported).install()
    _patches.record(_KERAS_IMPORT_HOOK, hook.remove)


def keras_imported(name="keras"):
    """Called when `import keras` (or `import tf_keras`) finishes under the automatic path;
    a failure is a warning, never an error in the script's import."""
    try:
        settings = _state.STATE.settings
        if settings is not None and settings.keras_policy:
            set_keras_policy(settings.dtype)
        if settings is not None and settings.loss_scaling:
            _optimizers.patch_keras_optimizers()
    except Exception as error:  # pylint: disable=broad-except
        _log.warning("tf_mpt could not set %s's mixed precision policy (%s)", name, error)
