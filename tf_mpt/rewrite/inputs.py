"""Phase 0 of a rewrite: what the caller passed, checked, with errors that say what, the value
and the fix (no TensorFlow import beyond the protobuf types)."""

import dataclasses
import os

from tensorflow.core.framework import graph_pb2

from tf_mpt import config as _config
from tf_mpt import lists as _lists
from tf_mpt import targets as _targets
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.paint import rules as _paint
from tf_mpt.rewrite.paint import updates as _updates


def check_graph_def(graph_def):
    if isinstance(graph_def, graph_pb2.GraphDef):
        return
    hint = ""
    if hasattr(graph_def, "as_graph_def"):
        hint = " For a tf.Graph call tf_mpt.rewrite_graph(graph) or pass graph.as_graph_def()."
    raise TypeError(
        "graph_def must be a GraphDef protocol buffer (tf.compat.v1.GraphDef). "
        f"Received: graph_def={short_repr(graph_def)} (of type {type(graph_def).__name__}).{hint}")


def short_repr(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_lists(lists):
    if not isinstance(lists, _lists.OpLists):
        raise TypeError(
            "lists must be a tf_mpt.OpLists (e.g. tf_mpt.default_lists('float16').edited(...))"
            f" or None. Received: lists={short_repr(lists)} (of type {type(lists).__name__})")


def fetch_node_names(fetches, view):
    """Node names whose outputs keep their dtype."""
    if fetches is None:
        return {node.name for i, node in enumerate(view.nodes) if not view.has_data_fanout(i)}
    if isinstance(fetches, (str, bytes)) or hasattr(fetches, "name"):
        fetches = [fetches]
    names = set()
    for fetch in fetches:
        text = fetch.decode() if isinstance(fetch, bytes) else getattr(fetch, "name", fetch)
        if not isinstance(text, str):
            raise TypeError(
                "fetches must be node or tensor names (e.g. 'loss' or 'loss:0'), tensors or "
                f"operations. Received an entry {short_repr(fetch)} of type {type(fetch).__name__}")
        name, _ = _graph_view.parse_input(text)
        if name not in view.index:
            raise ValueError(
                f"fetches names {text!r}, but the graph has no node {name!r}. Pass names of "
                "nodes in the graph (e.g. 'loss' or 'loss:0').")
        names.add(name)
    return names


def node_skip_reasons(view, types, fetched, slow_ops=None, dtype=None, allow=frozenset(),
                      inaccurate_ops=None):
    """Per node, why it keeps float32 whatever the passes decide, or None. slow_ops: the
    dispatch check's {op type: (ratio, pattern)}, inaccurate_ops the numerics check's
    {op type: (error ratio, pattern)} (measuring.check_dispatch); allow: the allow list's ops
    (never kept as a variable's update)."""
    slow_ops = slow_ops or {}
    inaccurate_ops = inaccurate_ops or {}
    updates = _updates.variable_update_reasons(view, types, allow)
    reasons = []
    for i, (node, nt) in enumerate(zip(view.nodes, types)):
        if not nt.known:
            reason = f"unknown op {node.op} (not registered): kept float32"
        elif nt.is_function:
            reason = f"call of library function {node.op}: kept float32"
        elif node.name in fetched:
            reason = _paint.FETCHED
        elif ta.KEEP_FP32_ATTR in node.attr and node.attr[ta.KEEP_FP32_ATTR].b:
            reason = f"opted out with attr {ta.KEEP_FP32_ATTR}"
        elif node.op in slow_ops:
            ratio, pattern = slow_ops[node.op]
            reason = (f"dispatch check: TensorFlow's {dtype} kernel for {node.op} ({pattern}) "
                      f"ran {ratio:.0f}x slower than float32 on this CPU: kept float32")
        elif node.op in inaccurate_ops:
            ratio, pattern = inaccurate_ops[node.op]
            reason = (f"numerics check: TensorFlow's {dtype} kernel for {node.op} ({pattern}) "
                      f"erred {ratio:.0f}x {dtype} rounding against float32 on this CPU: "
                      "kept float32")
        else:
            reason = updates.get(i)
        reasons.append(reason)
    return reasons


def check_config(config):
    """The Config to use: `config`, or one parsed from the environment when None."""
    if config is None:
        return _config.Config.from_env(os.environ)
    if not isinstance(config, _config.Config):
        raise TypeError(
            "config must be a tf_mpt.Config (e.g. tf_mpt.Config.from_env({...})) or None. "
            f"Received: config={short_repr(config)} (of type {type(config).__name__})")
    return config


def with_target(config, target):
    """`config` (None: the environment's) with `target` when one is given; ValueError for a
    bad target, TypeError for a bad config."""
    config = check_config(config)
    if target is None:
        return config
    return dataclasses.replace(config, target=_targets.parse(target))
