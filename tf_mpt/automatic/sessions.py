"""TF1 Sessions under the automatic path: each Session is created with tf_mpt's Grappler
optimizer in its ConfigProto and rewrites its own graph (tf_mpt.automatic.native); where the
native optimizer cannot be built, or with TF_MPT_SESSION_REWRITE=copy, it runs a rewritten
shadow copy of its graph instead (same node names, so fetches and feeds map by name; rebuilt
with the variable values carried over when the graph grows; a graph holding other state stays
float32).
"""

import collections.abc
import dataclasses
import logging
import sys

import tensorflow as tf

from tf_mpt.automatic import state as _state
from tf_mpt.automatic.native import beside_import as _beside_import
from tf_mpt.automatic.native import library as _native
from tf_mpt.automatic.native import rewriter as _session_rewrite
from tf_mpt.costs import dispatch as _dispatch
from tf_mpt.rewrite.paint import shapes as _shapes
from tf_mpt.training import gradient_records as _records

_log = logging.getLogger(__name__)


# --- TF1 Sessions: the rewrite inside the Session's graph optimisation ----------------------

BASE_SESSION = tf.compat.v1.Session.__mro__[1]


def patch_sessions(config, dtype, rewrite, loss_scaling):
    """Patches TF1 Sessions for the automatic path; returns the way graphs are rewritten:
    'grappler' (in the Session's own graph optimisation), 'copy' (TF_MPT_SESSION_REWRITE=copy,
    or the native optimizer is unavailable), or None (no rewrite).

    Session.run, make_callable and partial_run(_setup) are patched once each, for every
    concern: the copy path's shadow, the loss-scaling report, and the signals a rewrite
    deferred (tf_mpt.automatic.native.rewriter). The native optimizer is built (once per
    TensorFlow version and compiler) for the first TF1 Session, not for a TF2 script with no
    Session: its build starts here where the main script names Sessions
    (`_script_names_sessions`; it then runs beside the script's graph building), else when
    the first Session is created."""
    path = None
    if rewrite:
        path = "grappler" if config.session_rewrite == "grappler" else "copy"
    if path == "grappler":
        _state.patch(BASE_SESSION, "__init__", _session_init)
        if _script_names_sessions():
            _native.build_early(config.cache_dir)
    if path == "copy":
        _state.patch(BASE_SESSION, "close", _session_close)
    if path is not None or loss_scaling:
        _state.patch(BASE_SESSION, "run", _session_run)
        _state.patch(BASE_SESSION, "make_callable", _session_make_callable)
        _state.patch(BASE_SESSION, "partial_run_setup", _session_partial_run_setup)
        _state.patch(BASE_SESSION, "partial_run", _session_partial_run)
    return path


# (the hint, also read before TensorFlow's import: native.beside_import)
_script_names_sessions = _beside_import.script_names_sessions


def _native_ready():
    """True when Sessions rewrite in their Grappler pass: the native optimizer is installed,
    at the first Session if not yet. Where it cannot be, this and every later Session take
    the copy path (one warning why)."""
    settings = _state.STATE.settings
    if settings is None or settings.session_rewrite != "grappler":
        return False
    if _state.STATE.rewriter is not None:
        return True
    if _install_native(settings.config, settings.dtype):
        return True
    _state.STATE.settings = dataclasses.replace(settings, session_rewrite="copy")
    _state.patch(BASE_SESSION, "close", _session_close)
    return False


def _install_native(config, dtype):
    """Installs the native optimizer; False (one warning why) where it cannot be."""
    try:
        _session_rewrite.install(dtype, config)
    except Exception as error:  # pylint: disable=broad-except
        # NativeUnavailable says why; any other failure (a bug of ours) falls back too
        reason = (str(error) if isinstance(error, _native.NativeUnavailable)
                  else f"{type(error).__name__}: {error}")
        _log.warning("tf_mpt's Grappler optimizer is unavailable (%s); TF1 Sessions run a "
                     "rewritten copy of their graph instead (TF_MPT_SESSION_REWRITE=copy).",
                     reason)
        return False
    return True


def _warn_remote(target):
    if isinstance(target, bytes):
        target = target.decode("utf-8", "replace")
    _state.warn_once(("remote", target), "a Session on %r runs in float32: its graph runs on "
                     "that master, where tf_mpt's optimizer is not loaded (tf_mpt rewrites "
                     "graphs run by this process only).", target)


def _session_init(original, session, target="", graph=None, config=None):
    if target and not _state.bypassing():
        _warn_remote(target)
    elif not _state.bypassing():
        owner = graph if graph is not None else tf.compat.v1.get_default_graph()
        _check_kernels(owner, config)  # (first: while the optimizer may still compile)
        if _native_ready():
            config = _session_rewrite.session_config(config, owner)
    return original(session, target, graph, config)


def _check_kernels(graph, session_config=None):
    """The dispatch check of `graph`'s op types, in this process, where it is this process's
    to run (dispatch.measure_in_place): before the Session optimises the graph, whose rewrite
    reads the results. Never raises."""
    settings = _state.STATE.settings
    if settings is not None and settings.rewrite and not _state.bypassing():
        _dispatch.measure_in_place(settings.config, settings.dtype, graph, session_config)


# --- TF1 Sessions, TF_MPT_SESSION_REWRITE=copy: run a rewritten shadow of the graph --------

class _Shadow:
    """A rewritten copy of a Session's graph and the Session that runs it."""

    def __init__(self, session, previous=None):
        from tf_mpt import rewrite as _rewrite  # pylint: disable=g-import-not-at-top
        graph = session.graph
        self.user_graph = graph
        self.version = graph.version
        settings = _state.STATE.settings
        # (timed where the decisions are for this CPU: rewrite_graph, tf_mpt.choose)
        self.graph = _rewrite.rewrite_graph(graph, dtype=settings.dtype,
                                            config=settings.config)
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
                with _state.bypass():
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
    shadow = _state.STATE.shadows.get(session)
    if shadow is None or shadow.version != session.graph.version:
        shadow = _Shadow(session, previous=shadow)
        _state.STATE.shadows[session] = shadow
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
    if _state.bypassing() or getattr(session, "_tf_mpt_unshadowed", False):
        return None
    had_shadow = session in _state.STATE.shadows
    if not had_shadow and session.sess_str:  # a copy would duplicate the master's variables
        _warn_remote(session.sess_str)
        session._tf_mpt_unshadowed = True  # pylint: disable=protected-access
        return None
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


def _copying():
    settings = _state.STATE.settings
    return settings is not None and settings.session_rewrite == "copy"


def _report_unclaimed(session):
    settings = _state.STATE.settings
    if settings is not None and settings.loss_scaling and not _state.bypassing():
        _records.report_unclaimed(session.graph)


def _session_run(original, session, fetches, feed_dict=None, options=None, run_metadata=None):
    """Session.run: one WARNING per gradient computation of its graph that reached no
    optimizer; the shadow's run on the copy path; then the handlers of signals a rewrite
    deferred."""
    try:
        _report_unclaimed(session)
        if not session.sess_str:
            _check_kernels(session.graph)
        shadow = _shadow_or_none(session) if _copying() else None
        if shadow is None:
            with _state.fed_batch(_fed_batch(feed_dict)):
                return original(session, fetches, feed_dict, options, run_metadata)
        mapped_fetches = _map_fetches(shadow, fetches)
        mapped_feeds = _map_feeds(shadow, feed_dict) if feed_dict else None
        with _state.bypass():
            return original(shadow.session, mapped_fetches, mapped_feeds, options,
                            run_metadata)
    finally:
        _session_rewrite.run_deferred_signals()


def _fed_batch(feed_dict):
    """The one leading size of the arrays fed to placeholders whose leading dimension the
    graph leaves unknown (what the cost model of a graph optimised in this run costs such
    dimensions at), or None. Never raises (shapes.leading_size)."""
    if not feed_dict or not isinstance(feed_dict, dict):
        return None
    return _shapes.leading_size([
        value for key, value in feed_dict.items()
        if isinstance(key, tf.Tensor) and key.shape.rank and key.shape[0] is None])


def _session_make_callable(original, session, fetches, feed_list=None, accept_options=False):
    if not session.sess_str:
        _check_kernels(session.graph)
    shadow = _shadow_or_none(session) if _copying() else None
    if shadow is None:
        return _then_deferred_signals(original(session, fetches, feed_list, accept_options))
    mapped_feeds = [shadow.tensor(key) for key in feed_list] if feed_list else feed_list
    with _state.bypass():
        return _then_deferred_signals(original(shadow.session, _map_fetches(shadow, fetches),
                                               mapped_feeds, accept_options))


def _then_deferred_signals(callable_):
    """A Session callable that runs the handlers of signals a rewrite deferred after each
    call."""

    def run(*args, **kwargs):
        try:
            return callable_(*args, **kwargs)
        finally:
            _session_rewrite.run_deferred_signals()

    return run


def _session_partial_run_setup(original, session, fetches, feeds=None):
    try:
        if not session.sess_str:
            _check_kernels(session.graph)
        shadow = _shadow_or_none(session) if _copying() else None
        if shadow is None:
            return original(session, fetches, feeds)
        mapped_feeds = [shadow.tensor(key) for key in feeds] if feeds else feeds
        with _state.bypass():
            return original(shadow.session, _map_fetches(shadow, fetches), mapped_feeds)
    finally:
        _session_rewrite.run_deferred_signals()


def _session_partial_run(original, session, handle, fetches, feed_dict=None):
    try:
        # the handle belongs to the Session that set it up
        shadow = _state.STATE.shadows.get(session)
        if _state.bypassing() or shadow is None:
            return original(session, handle, fetches, feed_dict)
        mapped_feeds = _map_feeds(shadow, feed_dict) if feed_dict else None
        with _state.bypass():
            return original(shadow.session, handle, _map_fetches(shadow, fetches),
                            mapped_feeds)
    finally:
        _session_rewrite.run_deferred_signals()


def _session_close(original, session):
    shadow = _state.STATE.shadows.pop(session, None)
    if shadow is not None:
        shadow.close()
    return original(session)


def close_shadows():
    """Closes every shadow Session (disable())."""
    for shadow in list(_state.STATE.shadows.values()):
        shadow.close()
    _state.STATE.shadows.clear()

