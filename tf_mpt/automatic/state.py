"""The one module with global state: process-wide hooks tf_mpt installs.

* The automatic path (`enable()`, `disable()`, `is_enabled()`): TF1 Sessions are created
  with tf_mpt's Grappler optimizer in their ConfigProto and rewrite their own graph
  (`session_rewrite`); where the native optimizer cannot be built, or with
  TF_MPT_SESSION_REWRITE=copy, they run a rewritten shadow copy of their graph instead (same
  node names, so fetches and feeds map by name; rebuilt with the variable values carried
  over when the graph grows; a graph holding other state stays float32).
  tf.compat.v1.train.Optimizer computes and applies gradients through a LossScaleOptimizer.
"""

import collections.abc
import contextlib
import dataclasses
import functools
import logging
import os
import sys
import threading
import weakref

import tensorflow as tf

from tf_mpt import _cpu
from tf_mpt import _import_hooks
from tf_mpt import _patches
from tf_mpt.automatic import native_library as _native
from tf_mpt.automatic import session_rewrite as _session_rewrite

_log = logging.getLogger(__name__)

# --- the automatic path: TF_MPT_ENABLE=1 / python -m tf_mpt ---------------------------------

_stays_float32 = False  # 'auto' found no fast half type (warned once)
_enabled = None  # None, or the Settings in force
_local = threading.local()
_shadows = weakref.WeakKeyDictionary()  # user Session -> _Shadow


def is_enabled():
    """True while the automatic path is on in this process."""
    return _enabled is not None


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the automatic path resolved when it was enabled."""
    config: object  # the tf_mpt.Config it was enabled with
    dtype: str  # 'float16' | 'bfloat16'
    rewrite: bool  # graphs are rewritten (TF_MPT_GRAPH_REWRITE)
    loss_scaling: bool  # TF1 optimizers get loss scaling (TF_MPT_LOSS_SCALING)
    loss_scale: object  # 'dynamic' or a number (TF_MPT_LOSS_SCALE)
    session_rewrite: object = None  # 'grappler' | 'copy' (TF1 Sessions), None without rewrite


def enabled_settings():
    """The Settings of the automatic path, or None when it is off."""
    return _enabled


def enable(config=None, *, gpu_visible=None, native_bfloat16=None):
    """Turns on the automatic path for this process (idempotent).

    TF1 Sessions rewrite their graph in their own Grappler pass (or run a rewritten copy,
    see the module docstring), and tf.compat.v1.train.Optimizer gets
    dynamic loss scaling (float16 by default). Returns the resolved settings, or None when
    'auto' found no fast half type (the script stays float32; one warning per process says
    why).
    """
    global _enabled, _stays_float32
    if _enabled is not None:
        return _enabled
    from tf_mpt import config as _config  # pylint: disable=g-import-not-at-top
    config = config if config is not None else _config.Config.from_env(os.environ)
    if gpu_visible is None:
        gpu_visible = bool(tf.config.list_physical_devices("GPU"))
    if native_bfloat16 is None:
        native_bfloat16 = _cpu.has_native_bfloat16(_cpu.cpu_flags(config))
    dtype = config.resolve_dtype(gpu_visible, native_bfloat16)
    if dtype is None:
        if not _stays_float32:
            _stays_float32 = True
            _log.warning("TF_MPT_DTYPE=auto found no GPU and no native bfloat16 on this CPU "
                         "(needs %s); the script runs in float32. Set TF_MPT_DTYPE=bfloat16 "
                         "or float16 to force a half type.",
                         " or ".join(_cpu.NATIVE_BFLOAT16_FLAGS))
        return None
    settings = Settings(config=config, dtype=dtype, rewrite=config.graph_rewrite,
                        loss_scaling=config.loss_scaling_for(dtype),
                        loss_scale=config.loss_scale)
    if settings.rewrite:
        settings = dataclasses.replace(settings, session_rewrite=_patch_sessions(config, dtype))
        _patch_tf_function(dtype)
        _set_keras_policy(dtype)
    if settings.loss_scaling:
        optimizer_class = tf.compat.v1.train.Optimizer
        _patch(optimizer_class, "compute_gradients", _compute_gradients)
        _patch(optimizer_class, "apply_gradients", _apply_gradients)
        _patch_gradients(settings.loss_scale, config.allreduce_dtype)
    _enabled = settings
    _watch_keras_imports()
    _log.info("enabled: dtype=%s graph_rewrite=%s (TF1 Sessions: %s) loss_scaling=%s "
              "loss_scale=%s", dtype, settings.rewrite, settings.session_rewrite,
              settings.loss_scaling, settings.loss_scale)
    return settings


def disable():
    """Turns the automatic path off and removes every process-wide patch tf_mpt made
    (existing Sessions and the Saver.restore fallback of tf_mpt.training.checkpoints
    included)."""
    global _enabled, _stays_float32
    _patches.undo_all()
    _session_rewrite.uninstall()
    for shadow in list(_shadows.values()):
        shadow.close()
    _shadows.clear()
    _enabled = None
    _stays_float32 = False


def _patch_function(module, name, replacement):
    """module.name(...) becomes replacement(original, ...) until disable()."""
    original = getattr(module, name)

    def function(*args, **kwargs):
        return replacement(original, *args, **kwargs)

    functools.update_wrapper(function, original)
    _patches.replace(module, name, function)


def _patch(owner, name, replacement):
    """owner.name(self, ...) becomes replacement(original, self, ...) until disable()."""
    original = getattr(owner, name)

    def method(self, *args, **kwargs):
        return replacement(original, self, *args, **kwargs)

    functools.update_wrapper(method, original)
    _patches.replace(owner, name, method)


@contextlib.contextmanager
def _bypass():
    previous = getattr(_local, "bypass", False)
    _local.bypass = True
    try:
        yield
    finally:
        _local.bypass = previous


def _bypassing():
    return getattr(_local, "bypass", False)


# --- TF1 Sessions: the rewrite inside the Session's graph optimisation ----------------------

_BASE_SESSION = tf.compat.v1.Session.__mro__[1]


def _patch_sessions(config, dtype):
    """Routes TF1 Sessions through tf_mpt's rewrite; returns 'grappler' or 'copy' (the way
    taken: TF_MPT_SESSION_REWRITE, or copy when the native optimizer is unavailable)."""
    if config.session_rewrite == "grappler":
        try:
            _session_rewrite.install(dtype, config)
        except _native.NativeUnavailable as error:
            _log.warning("tf_mpt's Grappler optimizer is unavailable (%s); TF1 Sessions run a "
                         "rewritten copy of their graph instead (TF_MPT_SESSION_REWRITE=copy).",
                         error)
        else:
            _patch(_BASE_SESSION, "__init__", _session_init)
            return "grappler"
    _patch(_BASE_SESSION, "run", _session_run)
    _patch(_BASE_SESSION, "make_callable", _session_make_callable)
    _patch(_BASE_SESSION, "partial_run_setup", _session_partial_run_setup)
    _patch(_BASE_SESSION, "partial_run", _session_partial_run)
    _patch(_BASE_SESSION, "close", _session_close)
    return "copy"


def _session_init(original, session, target="", graph=None, config=None):
    if not _bypassing():
        owner = graph if graph is not None else tf.compat.v1.get_default_graph()
        config = _session_rewrite.session_config(config, owner)
    return original(session, target, graph, config)


# --- TF1 Sessions, TF_MPT_SESSION_REWRITE=copy: run a rewritten shadow of the graph --------

class _Shadow:
    """A rewritten copy of a Session's graph and the Session that runs it."""

    def __init__(self, session, previous=None):
        from tf_mpt import rewrite as _rewrite  # pylint: disable=g-import-not-at-top
        graph = session.graph
        self.user_graph = graph
        self.version = graph.version
        self.graph = _rewrite.rewrite_graph(graph, dtype=_enabled.dtype)
        self.session = tf.compat.v1.Session(target=session.sess_str, graph=self.graph,
                                            config=getattr(session, "_config", None))
        self.session._tf_mpt_unshadowed = True  # pylint: disable=protected-access
        self.fetch_casts = {}
        if previous is not None:
            self._take_state_from(previous)
            previous.close()

    def _take_state_from(self, previous):
        """Copies variable values from the shadow of the graph before it grew."""
        with previous.graph.as_default():
            old = {v.op.name: v for v in tf.compat.v1.global_variables()
                   + tf.compat.v1.local_variables()}
        with self.graph.as_default():
            new = {v.op.name: v for v in tf.compat.v1.global_variables()
                   + tf.compat.v1.local_variables()}
        for name, variable in new.items():
            if name not in old:
                continue
            try:
                with _bypass():
                    value = previous.session.run(old[name])
                    self.session.run(variable.initializer,
                                     {variable.initializer.inputs[1]: value})
            except tf.errors.OpError:
                continue  # not initialised yet in the old graph

    def element(self, item):
        """The shadow-graph counterpart of a fetch or feed key (same name, same dtype)."""
        if isinstance(item, str):
            name = item
            original_dtype = getattr(self.user_graph.as_graph_element(name), "dtype", None)
        else:
            graph_element = getattr(item, "_graph_element", None)
            target = graph_element if graph_element is not None else item
            name = target.name
            original_dtype = getattr(target, "dtype", None)
        element = self.graph.as_graph_element(name)
        if (isinstance(element, tf.Tensor) and original_dtype is not None
                and element.dtype.base_dtype != original_dtype.base_dtype
                and element.dtype.base_dtype in (tf.float16, tf.bfloat16)):
            cast = self.fetch_casts.get(name)
            if cast is None:
                with self.graph.as_default():
                    cast = tf.cast(element, original_dtype.base_dtype,
                                   name=element.op.name + "-FetchCast-TfMpt")
                self.fetch_casts[name] = cast
            return cast
        return element

    def tensor(self, key):
        """The shadow-graph element of the same name as `key` (a name or a graph element)."""
        return self.graph.as_graph_element(key if isinstance(key, str) else key.name)

    def close(self):
        self.session.close()


def _shadow_for(session):
    shadow = _shadows.get(session)
    if shadow is None or shadow.version != session.graph.version:
        shadow = _Shadow(session, previous=shadow)
        _shadows[session] = shadow
    return shadow


def _map_fetches(shadow, fetches):
    """The fetch structure with every element replaced by its shadow counterpart.

    Walks the structures Session.run accepts (lists, tuples, namedtuples, dicts with any keys,
    e.g. MonitoredSession's hook objects, SparseTensors) without sorting dict keys.
    """
    if fetches is None:
        return None
    if isinstance(fetches, collections.abc.Mapping):
        items = [(k, _map_fetches(shadow, v)) for k, v in fetches.items()]
        try:
            return type(fetches)(items)
        except TypeError:
            return dict(items)
    if isinstance(fetches, tuple) and hasattr(fetches, "_fields"):
        return type(fetches)(*(_map_fetches(shadow, v) for v in fetches))
    if isinstance(fetches, (list, tuple)):
        return type(fetches)(_map_fetches(shadow, v) for v in fetches)
    if isinstance(fetches, tf.SparseTensor):
        return tf.SparseTensor(*(shadow.element(t) for t in
                                 (fetches.indices, fetches.values, fetches.dense_shape)))
    return shadow.element(fetches)


def _map_feeds(shadow, feed_dict):
    mapped = {}
    for key, value in feed_dict.items():
        # A fed tensor maps to its shadow by name, never to a fetch's dtype-restoring Cast.
        if isinstance(key, (tuple, list)):
            key = type(key)(shadow.tensor(k) for k in key)
        elif isinstance(key, tf.SparseTensor):
            key = tf.SparseTensor(*(shadow.tensor(t) for t in
                                    (key.indices, key.values, key.dense_shape)))
        else:
            key = shadow.tensor(key)
        mapped[key] = value
    return mapped


_VARIABLE_OPS = frozenset(("VariableV2", "Variable", "VarHandleOp"))


def _state_a_copy_would_duplicate(graph):
    """'Op type 'name'' of the first node holding state other than variables (queues,
    iterators, tables, readers, accumulators: ops with a shared_name), or None."""
    for op in graph.get_operations():
        if op.type not in _VARIABLE_OPS and "shared_name" in op.node_def.attr:
            return f"{op.type} {op.name!r}"
    return None


def _shadow_or_none(session):
    """The session's shadow, or None when the session runs its own graph in float32."""
    if _bypassing() or getattr(session, "_tf_mpt_unshadowed", False):
        return None
    had_shadow = session in _shadows
    if not had_shadow:
        state = _state_a_copy_would_duplicate(session.graph)
        if state is not None:
            _log.warning("this Session runs in float32: its graph holds %s, state that "
                         "a rewritten copy of the graph would duplicate "
                         "(TF_MPT_SESSION_REWRITE=copy; the default, grappler, rewrites in "
                         "place and needs a C++ compiler once).", state)
            session._tf_mpt_unshadowed = True  # pylint: disable=protected-access
            return None
    try:
        return _shadow_for(session)
    except Exception as error:  # pylint: disable=broad-except
        if had_shadow:  # the state lives in the old shadow: running the original would lose it
            raise RuntimeError(
                f"tf_mpt could not rebuild the mixed-precision copy of this Session's graph "
                f"after it grew ({type(error).__name__}: {error}). Build the whole graph "
                "before the first Session.run, or run without TF_MPT_ENABLE.") from error
        _log.warning("tf_mpt could not run this Session's graph in mixed precision (%s: %s); "
                     "it runs in float32.", type(error).__name__, error)
        session._tf_mpt_unshadowed = True  # pylint: disable=protected-access
        return None


def _session_run(original, session, fetches, feed_dict=None, options=None, run_metadata=None):
    shadow = _shadow_or_none(session)
    if shadow is None:
        return original(session, fetches, feed_dict, options, run_metadata)
    mapped_fetches = _map_fetches(shadow, fetches)
    mapped_feeds = _map_feeds(shadow, feed_dict) if feed_dict else None
    with _bypass():
        return original(shadow.session, mapped_fetches, mapped_feeds, options, run_metadata)


def _session_make_callable(original, session, fetches, feed_list=None, accept_options=False):
    shadow = _shadow_or_none(session)
    if shadow is None:
        return original(session, fetches, feed_list, accept_options)
    mapped_feeds = [shadow.tensor(key) for key in feed_list] if feed_list else feed_list
    with _bypass():
        return original(shadow.session, _map_fetches(shadow, fetches), mapped_feeds,
                        accept_options)


def _session_partial_run_setup(original, session, fetches, feeds=None):
    shadow = _shadow_or_none(session)
    if shadow is None:
        return original(session, fetches, feeds)
    mapped_feeds = [shadow.tensor(key) for key in feeds] if feeds else feeds
    with _bypass():
        return original(shadow.session, _map_fetches(shadow, fetches), mapped_feeds)


def _session_partial_run(original, session, handle, fetches, feed_dict=None):
    shadow = _shadows.get(session)  # the handle belongs to the Session that set it up
    if _bypassing() or shadow is None:
        return original(session, handle, fetches, feed_dict)
    mapped_feeds = _map_feeds(shadow, feed_dict) if feed_dict else None
    with _bypass():
        return original(shadow.session, handle, _map_fetches(shadow, fetches), mapped_feeds)


def _session_close(original, session):
    shadow = _shadows.pop(session, None)
    if shadow is not None:
        shadow.close()
    return original(session)


# --- TF1 optimizers: automatic loss scaling -----------------------------------------------

def _scaling_optimizer(optimizer):
    from tf_mpt.training import optimizer as _optimizer  # pylint: disable=g-import-not-at-top
    wrapper = getattr(optimizer, "_tf_mpt_loss_scale_optimizer", None)
    if wrapper is None:
        wrapper = _optimizer.LossScaleOptimizer(optimizer, _enabled.loss_scale,
                                                allreduce_dtype=_enabled.config.allreduce_dtype)
        optimizer._tf_mpt_loss_scale_optimizer = wrapper  # pylint: disable=protected-access
    return wrapper


def _is_wrapper(optimizer):
    from tf_mpt.training import optimizer as _optimizer  # pylint: disable=g-import-not-at-top
    return isinstance(optimizer, _optimizer.LossScaleOptimizer)


def _compute_gradients(original, optimizer, loss, *args, **kwargs):
    if _bypassing() or _is_wrapper(optimizer):
        return original(optimizer, loss, *args, **kwargs)
    with _bypass():
        return _scaling_optimizer(optimizer).compute_gradients(loss, *args, **kwargs)


def _apply_gradients(original, optimizer, grads_and_vars, *args, **kwargs):
    if _bypassing() or _is_wrapper(optimizer):
        return original(optimizer, grads_and_vars, *args, **kwargs)
    with _bypass():  # the wrapper claims gradients tf.gradients scaled (auto_scaling)
        return _scaling_optimizer(optimizer).apply_gradients(grads_and_vars, *args, **kwargs)


# --- gradients taken anywhere: tf.gradients, GradientTape (tf_mpt.training.auto_scaling) -----

def _patch_gradients(loss_scale, allreduce_dtype):
    """tf.gradients, tf.compat.v1.gradients and GradientTape.gradient scale the backward pass
    of the script's losses; Keras optimizers apply them with a loss scale of their own."""
    from tf_mpt.training import auto_scaling as _auto  # pylint: disable=g-import-not-at-top
    _auto.install(loss_scale, allreduce_dtype)
    _patches.record("<automatic loss scaling>", _auto.uninstall)
    for module in {id(m): m for m in (tf, tf.compat.v1, tf.compat.v2)}.values():
        if hasattr(module, "gradients") and not _patches.is_applied(module, "gradients"):
            _patch_function(module, "gradients", _auto.tf_gradients)
    _patch(tf.GradientTape, "gradient", _auto.tape_gradient)
    _patch(_BASE_SESSION, "run", _session_run_reporting)
    _patch_keras_optimizers()


def _session_run_reporting(original, session, *args, **kwargs):
    """Session.run, after one WARNING per gradient computation of its graph that reached no
    optimizer (tf_mpt.training.auto_scaling)."""
    from tf_mpt.training import auto_scaling as _auto  # pylint: disable=g-import-not-at-top
    _auto.report_unclaimed(session.graph)
    return original(session, *args, **kwargs)


def _patch_keras_optimizers():
    """Keras optimizers' apply_gradients / apply (once keras is imported), and tf_keras's
    (Keras 2: `tf.keras` under TF_USE_LEGACY_KERAS=1), its optimizers old and new and its
    LossScaleOptimizers (which opt their variables out), once tf_keras is imported."""
    from tf_mpt.training import auto_scaling as _auto  # pylint: disable=g-import-not-at-top
    keras = sys.modules.get("keras")
    base = sys.modules.get("keras.src.optimizers.base_optimizer")
    if keras is not None and base is not None and hasattr(base, "BaseOptimizer"):
        owner = base.BaseOptimizer
        if not _patches.is_applied(owner, "apply"):
            _patch(owner, "apply_gradients", _auto.keras_apply_gradients)
            _patch(owner, "apply", _auto.keras_apply)
    for owner in _tf_keras_optimizer_classes():
        if "apply_gradients" in vars(owner) and not _patches.is_applied(owner, "apply_gradients"):
            _patch(owner, "apply_gradients", _auto.tf_keras_apply_gradients)


def _tf_keras_optimizer_classes():
    """tf_keras's optimizer base classes and LossScaleOptimizers, if tf_keras is imported."""
    if "tf_keras" not in sys.modules:
        return []
    import importlib  # pylint: disable=g-import-not-at-top
    found = []
    for module_name, class_names in (
            ("tf_keras.src.optimizers.optimizer", ("Optimizer",)),
            ("tf_keras.src.optimizers.legacy.optimizer_v2", ("OptimizerV2",)),
            ("tf_keras.src.mixed_precision.loss_scale_optimizer",
             ("LossScaleOptimizer", "LossScaleOptimizerV3"))):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.extend(getattr(module, name) for name in class_names if hasattr(module, name))
    return found


# --- TF2: tf.function and Keras -------------------------------------------------------------

_KERAS_POLICY = "<keras dtype policy>"
_TF_KERAS_POLICY = "<tf_keras dtype policy>"
_LIBRARY_PREFIXES = ("keras", "tf_keras", "tensorflow", "tf_mpt", "absl")


def _patch_tf_function(dtype):
    """`tf.function` in user code becomes tf_mpt.function (Keras and TF internals keep theirs:
    Keras gets mixed precision through its dtype policy)."""
    from tf_mpt.rewrite import tf_functions as _functions  # pylint: disable=g-import-not-at-top
    original = _functions._TF_FUNCTION  # pylint: disable=protected-access

    def function(func=None, **kwargs):
        if func is None:
            return lambda f: function(f, **kwargs)
        module = getattr(func, "__module__", "") or ""
        if module.split(".")[0] in _LIBRARY_PREFIXES:
            return original(func, **kwargs)
        try:
            return _functions.Function(func, dtype, kwargs, on_trace=_report_unclaimed)
        except Exception as error:  # pylint: disable=broad-except
            _log.warning("tf_mpt left tf.function %s in float32 (%s: %s)",
                         getattr(func, "__name__", func), type(error).__name__, error)
            return original(func, **kwargs)

    functools.update_wrapper(function, original)
    _patches.replace(tf, "function", function)


def _report_unclaimed(graph):
    """A traced tf.function: one WARNING per gradient computation that reached no optimizer."""
    if _enabled is not None and _enabled.loss_scaling:
        from tf_mpt.training import auto_scaling as _auto  # pylint: disable=g-import-not-at-top
        _auto.report_unclaimed(graph)


def _set_keras_policy(dtype):
    """Keras `fit` scripts: the global dtype policy mixed_float16 / mixed_bfloat16 (Keras then
    wraps the optimizer in its own LossScaleOptimizer for float16 at compile); the same for
    tf_keras (`tf.keras` under TF_USE_LEGACY_KERAS=1) once it is imported."""
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "config"):  # else: keras_imported() sets it later
        _set_policy(_KERAS_POLICY, "Keras", keras.config.dtype_policy,
                    keras.config.set_dtype_policy, dtype)
    tf_keras = sys.modules.get("tf_keras")
    mixed = getattr(tf_keras, "mixed_precision", None) if tf_keras is not None else None
    if mixed is not None and hasattr(mixed, "set_global_policy"):
        _set_policy(_TF_KERAS_POLICY, "tf_keras", mixed.global_policy, mixed.set_global_policy,
                    dtype)


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


def _watch_keras_imports():
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
        if _enabled is not None and _enabled.rewrite:
            _set_keras_policy(_enabled.dtype)
        if _enabled is not None and _enabled.loss_scaling:
            _patch_keras_optimizers()
    except Exception as error:  # pylint: disable=broad-except
        _log.warning("tf_mpt could not set %s's mixed precision policy (%s)", name, error)
