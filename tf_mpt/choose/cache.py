"""Graph timing's verdicts, measured once.

A verdict (verdict.Verdict: each candidate colouring's times and the pick) is keyed by
the graph's fingerprint: the GraphDef as given, the fetches timed, the half dtype, the op
lists and the batch assumed for an unknown leading dimension. It is kept

    beside this CPU's op table      TF_MPT_CACHE_DIR/verdicts-<dtype>-<machine key>.json, so
                                    a second rewrite or conversion of the graph here times
                                    nothing (`target here`)
    in a cost table file            `tf-mpt measure --model M --out FILE` times M's graphs
                                    and stores their verdicts in FILE ("verdicts"), so
                                    `--target FILE` on any machine applies the same picks
                                    without timing: the same bytes everywhere

A record is replayed only where its pick, made again, is the graph that was timed (the hash
stored beside it); a cache file that cannot be read is ignored (and rewritten); one that
cannot be written costs only the time of timing again.
"""

import contextlib
import hashlib
import json
import os
import time

from tf_mpt import lists as _lists
from tf_mpt._process import state as _state

# Of the fingerprint and the record's layout: a change makes old ones unused. A change of what
# a candidate's graph is (the painter's colouring, a transform) needs none: a record holds the
# hash of the graph its pick runs (decision.GRAPH), and a pick made again as another graph is
# refused and timed again.
VERSION = 13  # (13: a verdict holds its ledger and points into it)
# The most verdicts a cache file keeps: a script whose graph grows (a TF1 graph with ops added
# between runs, a function traced per shape) adds one per graph; past this the oldest stored
# go, so the file read by every rewrite stays small (a verdict is 2-5 KB).
MAX_CACHED = 500

_recording = []  # the open `recording()` contexts' {fingerprint: verdict dict}


def fingerprint(graph_def, fetches, dtype, lists, cost_batch, memory="float32"):
    """The key of one graph's verdict (hex, 32 characters); `memory` is TF_MPT_MEMORY's
    mode (what the pick was bounded by)."""
    digest = hashlib.sha256(graph_def.SerializeToString(deterministic=True))
    digest.update(json.dumps([VERSION, sorted(fetches), dtype, cost_batch, memory,
                              {name: sorted(getattr(lists, name))
                               for name in _lists.LIST_NAMES}]).encode())
    return digest.hexdigest()[:32]


def _cache_path(config, dtype):
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    return op_costs.cache_file(config, dtype, "verdicts")


def _read_json(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data


def cached(config, dtype):
    """{fingerprint: verdict dict} cached for this CPU ({} where none)."""
    data = _read_json(_cache_path(config, dtype))
    return data if isinstance(data, dict) else {}


def store(config, dtype, key, verdict):
    """Adds one verdict (a dict) to this CPU's cache; a cache that cannot be written is
    said once and otherwise ignored."""
    for record in _recording:
        record[key] = verdict
    path = _cache_path(config, dtype)
    data = cached(config, dtype)
    data[key] = dict(verdict, stored=time.time())
    if len(data) > MAX_CACHED:  # (the oldest go; one without a time is the oldest)
        def stored(k):
            value = data[k].get("stored", 0) if isinstance(data[k], dict) else 0
            return value if isinstance(value, (int, float)) else 0
        for old in sorted(data, key=stored)[:len(data) - MAX_CACHED]:
            del data[old]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
        op_costs._write_atomically(path, json.dumps(data, indent=1, sort_keys=True))  # pylint: disable=protected-access
    except OSError as error:
        _state.warn_once(("verdict cache", path),
                         "tf_mpt could not write its graph timing cache %s (%s); graphs will "
                         "be timed again in the next process. Set TF_MPT_CACHE_DIR to a "
                         "writable directory.", path, error)


def in_table(path, dtype):
    """{fingerprint: verdict dict} a cost table file holds for `dtype` ({} where none)."""
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    return op_costs.table_entry(path, dtype, "verdicts")


@contextlib.contextmanager
def recording():
    """Collects into the dict it yields every verdict timed or read while it is open, and
    makes a rewrite for a cost table file time its graph (`tf-mpt measure --model`: the
    verdicts stored in the table being written)."""
    record = {}
    _recording.append(record)
    try:
        yield record
    finally:
        _recording.remove(record)


def measuring_for_a_table():
    """Whether a `recording()` is open: a rewrite for a table target then times."""
    return bool(_recording)
