"""The automatic TF1 path inside each Session's own graph optimisation (Grappler).

Under the automatic path every tf.compat.v1.Session (MonitoredTrainingSession and
InteractiveSession build one too) is created with a copy of its ConfigProto that lists
tf_mpt's Grappler optimizer "TfMpt" (`session_rewrite.cc` beside this file, built by
`library`). The runtime hands TfMpt every graph the Session is about to run, with the exact
fetches and feeds of that run; TfMpt calls `_rewrite` below, which answers with tf_mpt's
rewrite. There is one graph, one Session and one copy of every variable, queue, iterator,
table and reader, so graph growth, `make_callable`, `partial_run` and queue runners work as in
float32. Fetched and fed tensors keep their dtypes (they are the rewrite's `fetches`).

Where in Grappler's order: the meta-optimizer runs its built-in passes and then the custom
optimizers, in each of (by default) two iterations. TfMpt rewrites in the first iteration,
after pruning, function inlining, constant folding and the arithmetic passes have simplified
the graph, and does nothing in the second, whose built-in passes then fold Casts of constants
into half constants and tidy up. The remapper is moved: it fuses Conv2D+BiasAdd+Relu into
_FusedConv2D and MatMul+BiasAdd into _FusedMatMul, op types tf_mpt's lists do not hold (and
without float16 CPU kernels), so the Session's copy of the config switches the built-in
remapper off and lists "remap" right after TfMpt: it fuses the half ops, the order Grappler's
own AMP keeps (AMP before the remapper). Graphs under 4 nodes, which Grappler skips by
default, are optimised too (min_graph_nodes -1), as the rewrite would otherwise miss them.

A Session whose ConfigProto rules this out runs in float32 with one warning naming the
setting: Grappler switched off (disable_meta_optimizer) or Grappler's own AMP switched on.
An internal error in a rewrite leaves that graph float32 with one warning per graph.

Stateful nodes whose attrs the rewrite changes are renamed. A Session builds one executor per
set of feeds and fetches, but caches the kernels of stateful ops (TensorArrays, Stacks, random
ops, ...) by node name across all of them (DirectSession's OpSegment): the first executor's
kernel serves every later graph with a node of that name. Two runs over one graph can be
rewritten differently (a training run keeps a TensorArray float32, an evaluation run stores it
in half), so a changed stateful node gets a name made from its new attrs, and keeps its
original name only with its original attrs. Where its state is found by name (an empty
shared_name), that name stays the original one.
"""

import ctypes
import dataclasses
import hashlib
import logging
import signal
import sys
import threading

from tf_mpt._process.state import STATE, current_fed_batch, warn_once
from tf_mpt.automatic.native import library as _native

_log = logging.getLogger(__name__)

OPTIMIZER_NAME = "TfMpt"
_UNCHANGED = 1


@dataclasses.dataclass(frozen=True)
class _Installed:
    dtype: str  # 'float16' | 'bfloat16'
    config: object  # the tf_mpt.Config the automatic path was enabled with


def install(dtype, config):
    """Loads (building if needed) the native optimizer and routes it to tf_mpt's rewrite.

    Raises _native.NativeUnavailable saying why it cannot."""
    library = _native.load(config.cache_dir)
    with STATE.rewriter_lock:
        if STATE.rewriter_callback is None:
            STATE.rewriter_callback = _native.REWRITER(_rewrite)
        STATE.rewriter = _Installed(dtype, config)
    library.tf_mpt_set_rewriter(STATE.rewriter_callback)


def uninstall():
    """Graphs optimised from now on are left alone (Sessions keep what they built)."""
    with STATE.rewriter_lock:
        STATE.rewriter = None
    library = _native.loaded()
    if library is not None:
        library.tf_mpt_set_rewriter(_native.REWRITER())


_AMP_TOGGLES = ("auto_mixed_precision", "auto_mixed_precision_mkl",
                "auto_mixed_precision_onednn_bfloat16", "auto_mixed_precision_cpu")


def _why_not(rewrite_options):
    """The ConfigProto setting that rules the rewrite out for a Session, or None."""
    from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=g-import-not-at-top
    if rewrite_options.disable_meta_optimizer:
        return ("its ConfigProto switches Grappler off "
                "(graph_options.rewrite_options.disable_meta_optimizer), where tf_mpt rewrites")
    on = (rewriter_config_pb2.RewriterConfig.ON, rewriter_config_pb2.RewriterConfig.AGGRESSIVE)
    for toggle in _AMP_TOGGLES:
        if getattr(rewrite_options, toggle, None) in on:
            return (f"its ConfigProto switches Grappler's own AMP on "
                    f"(graph_options.rewrite_options.{toggle}); tf_mpt leaves the graph to it")
    return None


def _key_for(graph):
    with STATE.rewriter_lock:
        key = STATE.graph_keys.get(graph)
        if key is None:
            key = str(next(STATE.next_graph_key))
            STATE.graph_keys[graph] = key
            STATE.graphs[key] = graph
        return key


def session_config(config, graph):
    """The ConfigProto a new Session on `graph` gets: a copy of `config` (None: the process
    default) that lists TfMpt, or `config` itself (one warning) where a setting rules it out."""
    from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-import-not-at-top
    from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=g-import-not-at-top
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
    settings = STATE.rewriter
    if settings is None or (config is not None
                            and not isinstance(config, config_pb2.ConfigProto)):
        return config  # off, or a bad argument Session itself reports
    base = config if config is not None else context.context().config
    options = base.graph_options.rewrite_options
    if any(custom.name == OPTIMIZER_NAME for custom in options.custom_optimizers):
        return config
    reason = _why_not(options)
    if reason is not None:
        warn_once(("config", reason), "a Session stays float32: %s.", reason)
        return config
    new = config_pb2.ConfigProto()
    new.CopyFrom(base)
    options = new.graph_options.rewrite_options
    ours = options.custom_optimizers.add()
    ours.name = OPTIMIZER_NAME
    ours.parameter_map["dtype"].s = settings.dtype.encode()
    ours.parameter_map["graph"].s = _key_for(graph).encode()
    explicit = list(options.optimizers)
    if "remap" in explicit:  # an explicit list: move the remapper after TfMpt
        del options.optimizers[:]
        options.optimizers.extend(name for name in explicit if name != "remap")
        options.custom_optimizers.add().name = "remap"
    elif not explicit and options.remapping != rewriter_config_pb2.RewriterConfig.OFF:
        options.remapping = rewriter_config_pb2.RewriterConfig.OFF
        options.custom_optimizers.add().name = "remap"
    if options.min_graph_nodes == 0:
        options.min_graph_nodes = -1
    return new


def _parse_request(text):
    """({parameter: value}, [fetched, fed and kept names]) from TfMpt's request lines."""
    params, preserved = {}, []
    for line in text.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "param":
            name, _, value = rest.partition("\t")
            params[name] = value
        elif kind in ("fetch", "feed", "keep"):
            preserved.append(rest)
    return params, preserved


def _rename_changed_stateful_nodes(before, after, preserved):
    """`after` with every stateful node whose op or attrs differ from `before` renamed
    '<name>-TfMpt-<hash of op and attrs>' (inputs and colocation attrs follow): the Session's
    kernel cache, keyed by node name, then never hands one graph's kernel to another."""
    from tensorflow.python.framework import op_def_registry  # pylint: disable=g-import-not-at-top
    from tf_mpt.rewrite import graph_view  # pylint: disable=g-import-not-at-top
    original = {node.name: node for node in before.node}
    keep = {graph_view.parse_input(name)[0] for name in preserved}
    functions = {function.signature.name for function in after.library.function}
    renames = {}
    for node in after.node:
        old = original.get(node.name)
        op_def = op_def_registry.get(node.op)
        if (old is None or node.name in keep or op_def is None or not op_def.is_stateful
                or node.op in functions or node.op.endswith("PartitionedCall")):
            continue  # the OpSegment does not cache function calls
        attrs = {k: v for k, v in node.attr.items() if not k.startswith("_")}
        if node.op == old.op and attrs == {k: v for k, v in old.attr.items()
                                           if not k.startswith("_")}:
            continue
        digest = hashlib.sha1(node.op.encode())
        for key in sorted(attrs):
            digest.update(key.encode() + attrs[key].SerializeToString(deterministic=True))
        renames[node.name] = f"{node.name}-TfMpt-{digest.hexdigest()[:8]}"
    if not renames:
        return after
    result = type(after)()
    result.CopyFrom(after)
    for node in result.node:
        if node.name in renames:
            if "shared_name" in node.attr and not node.attr["shared_name"].s:
                node.attr["shared_name"].s = node.name.encode()  # same state, found by name
            node.name = renames[node.name]
        for position, name in enumerate(node.input):
            producer, port = graph_view.parse_input(name)
            if producer in renames:
                new = renames[producer]
                node.input[position] = ("^" + new if port < 0
                                        else new if port == 0 and ":" not in name
                                        else f"{new}:{port}")
        if "_class" in node.attr:
            groups = node.attr["_class"].list.s
            for position, group in enumerate(groups):
                target = group.decode()[len("loc:@"):]
                if group.startswith(b"loc:@") and target in renames:
                    groups[position] = b"loc:@" + renames[target].encode()
    return result


def _rewrite(graph_data, graph_size, request_data, request_size, sink, context):
    """The callback TfMpt calls (with the GIL, inside the Session's C++): 0 after writing the
    rewritten GraphDef to `sink`, non-zero to leave the graph unchanged. Signals that arrive
    meanwhile are deferred until control is back in the script (`run_deferred_signals`)."""
    with _signals_deferred():
        return _rewrite_or_leave(graph_data, graph_size, request_data, request_size, sink,
                                 context)


def _rewrite_or_leave(graph_data, graph_size, request_data, request_size, sink, context):
    key = None
    try:
        settings = STATE.rewriter
        if settings is None:
            return _UNCHANGED
        from tensorflow.core.framework import graph_pb2  # pylint: disable=g-import-not-at-top
        from tf_mpt.rewrite.paint import shapes as _shapes  # pylint: disable=g-import-not-at-top
        from tf_mpt import rewrite as _rewrite_module  # pylint: disable=g-import-not-at-top
        params, preserved = _parse_request(
            ctypes.string_at(request_data, request_size).decode())
        key = params.get("graph")
        graph = STATE.graphs.get(key)
        graph_def = graph_pb2.GraphDef.FromString(ctypes.string_at(graph_data, graph_size))
        shapes = (lambda: _shapes.shapes_of_graph(graph)) if graph is not None else None
        config, batch = settings.config, current_fed_batch()
        if batch is not None:  # this run feeds it: the cost model's batch is the real one
            config = dataclasses.replace(config, cost_batch=batch)
        # timing: where the decisions are for this CPU, the candidates of this graph (its
        # fetches and feeds) run in sandbox Sessions of their own, on random copies of its
        # variables and made-up inputs of the fed batch (tf_mpt.choose)
        result = _rewrite_module.rewrite_with_library(
            graph_def, dtype=params.get("dtype", settings.dtype), fetches=preserved,
            lists=None, strict=True, shapes=shapes, config=config, timing=True)
        if not result.modified:
            return _UNCHANGED
        new_graph_def = _rename_changed_stateful_nodes(graph_def, result.graph_def, preserved)
        data = new_graph_def.SerializeToString()
        sink(context, data, len(data))
        return 0
    except BaseException as error:  # pylint: disable=broad-except
        # Never let an exception cross into TensorFlow's C++: the graph runs as it was.
        # (KeyboardInterrupt and a handler's SystemExit cannot arise here: signals wait.)
        warn_once(("rewrite", key), "could not rewrite a graph of this Session (%s: %s); "
                  "that graph runs in float32.", type(error).__name__, error)
        return _UNCHANGED


# --- signals: deferred while a rewrite runs inside the Session -------------------------------
#
# The callback runs Python inside Session.run's C++. A Python signal handler that ran there
# would run inside the Session's graph optimisation: a SIGTERM handler that saves a checkpoint
# re-enters the Session and deadlocks, and Ctrl-C's KeyboardInterrupt would be swallowed by
# the callback (no exception may cross into C++). Without tf_mpt those handlers run when
# Session.run returns to Python; so while the callback runs (main thread: the only one
# Python runs handlers in) every Python-level handler is replaced by one that records the
# signal, and tf_mpt's Session.run / make_callable / partial_run wrappers run the recorded
# handlers when the call returns.

class _signals_deferred:  # pylint: disable=invalid-name
    """While active (on the main thread), Python signal handlers only record the signal."""

    def __enter__(self):
        self.swapped = {}
        # (run_deferred_signals waits until the callback is over: a sandbox Session that
        # graph timing runs meanwhile returns through tf_mpt's Session.run wrapper too)
        self.was_rewriting = getattr(STATE.local, "rewriting", False)
        STATE.local.rewriting = True
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in signal.valid_signals():
            try:
                handler = signal.getsignal(signum)
                if callable(handler):
                    signal.signal(signum, _record_signal)
                    self.swapped[signum] = handler
            except (ValueError, OSError, RuntimeError):
                continue
        return self

    def __exit__(self, *exc):
        STATE.local.rewriting = self.was_rewriting
        for signum, handler in self.swapped.items():
            signal.signal(signum, handler)


def _record_signal(signum, frame):  # pylint: disable=unused-argument
    STATE.deferred_signals.append(signum)


def run_deferred_signals():
    """Runs the Python handlers of signals that arrived during a rewrite, as Python would
    have run them when the Session call returned (a handler's exception propagates). Inside
    a rewrite (a sandbox Session's run returning while graph timing runs in the callback):
    nothing yet, the handlers run when the script's own Session call returns. Only on the
    main thread, where Python runs signal handlers: another thread's Session call returning
    (a queue runner's, a hook's) leaves them for the main thread's next call."""
    if getattr(STATE.local, "rewriting", False) or \
            threading.current_thread() is not threading.main_thread():
        return
    while STATE.deferred_signals:
        signum = STATE.deferred_signals.pop(0)
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, sys._getframe(1))  # pylint: disable=protected-access
