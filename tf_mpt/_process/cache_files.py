"""What tf_mpt keeps in its cache directory (TF_MPT_CACHE_DIR, default ~/.cache/tf_mpt), by
kind, and how `tf-mpt cache --clear` empties it: only files of these kinds are removed; any
other file there is left and named."""

import dataclasses
import fnmatch
import os

# (file name pattern, what it is); the first that matches names a file's kind
KINDS = (
    ("session_rewrite-*.so*", "the compiled Session optimizer (the automatic path's Grappler "
     "pass), built once per TensorFlow version"),
    ("op_costs-*.json", "this CPU's kernel times per op type (the cost model's table, "
     "target here)"),
    ("node_costs-*.json", "this CPU's times of matrix products and convolutions at the "
     "shapes of graphs it converted"),
    ("verdicts-*.json", "graph timing's verdicts: which colouring each graph runs (a graph "
     "timed again once removed)"),
    ("dispatch-*.json", "the dispatch and numerics checks of this CPU's half kernels"),
    ("*.tmp*", "an unfinished write"),
)


@dataclasses.dataclass(frozen=True)
class CacheFile:
    name: str
    kind: str  # what it is ('' where none of KINDS: not tf_mpt's)
    size: int


def listing(directory):
    """[CacheFile] of `directory`, sorted by name ([] where it does not exist)."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        kind = next((what for pattern, what in KINDS if fnmatch.fnmatch(name, pattern)), "")
        found.append(CacheFile(name, kind, os.path.getsize(path)))
    return found


def lines(directory):
    """What `tf-mpt cache` prints: the directory, each kind's files and bytes, the total."""
    files = listing(directory)
    if not files:
        return [f"tf_mpt's cache {directory}: empty"]
    out = [f"tf_mpt's cache {directory}: {len(files)} file(s), "
           f"{sum(f.size for f in files) / 2**20:.1f} MiB"]
    for _, what in KINDS:
        of_kind = [f for f in files if f.kind == what]
        if of_kind:
            out.append(f"  {what}: {len(of_kind)} file(s), "
                       f"{sum(f.size for f in of_kind) / 2**10:.0f} KiB")
            out += [f"    {f.name}" for f in of_kind]
    others = [f for f in files if not f.kind]
    if others:
        out.append(f"  not tf_mpt's (left as they are): {', '.join(f.name for f in others)}")
    return out


def clear(directory):
    """Removes tf_mpt's files from `directory` (not others); returns (removed, left)."""
    removed, left = [], []
    for entry in listing(directory):
        if not entry.kind:
            left.append(entry.name)
            continue
        try:
            os.remove(os.path.join(directory, entry.name))
            removed.append(entry.name)
        except FileNotFoundError:
            pass  # (another process removed it)
    return removed, left
