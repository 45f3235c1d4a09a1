"""`tf-mpt convert --auto-deny`: the converted nodes to keep float32 so the model passes
validation, found by one-pass blame (blame.py) and, where that does not pass, by bisection."""

import dataclasses
import logging
import time

from tf_mpt.models import blame as _blame
from tf_mpt.models import progress as _progress
from tf_mpt.models.model_io import ValidationFailed
from tf_mpt.models.validation import validate

_log = logging.getLogger("tf_mpt")


@dataclasses.dataclass
class Found:
    """What --auto-deny found.

    Attributes:
        conversion: the conversion with `kept` kept float32.
        kept: [(function or None, node name)] kept float32.
        method: 'blame' (one pass, validated once) or 'bisection'.
        trials: conversions validated.
        seconds: wall time of the search.
        blamed: [(blame.NodeError, error after or None)]: the nodes one-pass blame named,
            their error in the conversion that was searched and in the one returned (where
            blame's answer passed).
    """
    conversion: object
    kept: list
    method: str
    trials: int
    seconds: float
    blamed: list


def auto_deny(model, dtype, lists, keep, feeds, tolerance, max_trials=400, blame_first=True,
              config=None):
    """Finds converted nodes to keep float32 so the model passes validation: the nodes
    one-pass blame names (one run of each model, every tensor compared), validated once;
    where that does not pass (or blames nothing), bisection. Returns a Found."""
    start = time.perf_counter()
    base = model.convert(dtype, lists, keep, config=config)
    blamed, tried = [], 0
    if blame_first:
        reference = model.frozen()
        found = _blame.find(model, base, dtype, feeds, reference)
        names = {}  # the decision keys, in graph order, once each
        for _, keys in found:
            names.update(dict.fromkeys(keys))
        blamed = [(error, None) for error, _ in found]
        if names:
            kept = list(names)
            conversion = model.convert(dtype, lists, set(keep) | set(_names(kept)),
                                       config=config)
            kept, conversion = _fewest(model, dtype, lists, keep, kept, conversion, base,
                                       config)
            tried = 1
            if all(e.ok(tolerance) for e in validate(model, conversion, feeds, tolerance,
                                                     progress=False)):
                after = _blame.errors_of(model, conversion, dtype, feeds,
                                         [(e.label, e.name) for e, _ in found], reference)
                blamed = [(e, after.get((e.label, e.name))) for e, _ in found]
                return Found(conversion, kept, "blame", tried, time.perf_counter() - start,
                             blamed)
            _log.info("one-pass blame's %d node(s) do not pass validation; bisecting",
                      len(kept))
    conversion, kept, trials = _bisect(model, dtype, lists, keep, feeds, tolerance, base,
                                       max_trials, config)
    return Found(conversion, kept, "bisection", tried + trials, time.perf_counter() - start,
                 blamed)


def _fewest(model, dtype, lists, keep, kept, conversion, base, config=None):
    """(kept, conversion) with only the kept nodes of allow-list ops where those alone give
    the same conversion: the infer / clear ops and constants blame named between them stay
    float32 anyway (nothing half beside them), so the list says only what must be kept."""
    ops = {(d.function, d.name): d.op for report in base.reports.values()
           for d in report.decisions.values()}
    allow = [key for key in kept if lists.list_of(ops.get(key, "")) == "allow"]
    if not allow or len(allow) == len(kept):
        return kept, conversion
    fewer = model.convert(dtype, lists, set(keep) | set(_names(allow)), config=config)
    if set(fewer.converted_nodes) == set(conversion.converted_nodes):
        return allow, fewer
    return kept, conversion


def _bisect(model, dtype, lists, keep, feeds, tolerance, base, max_trials, config=None):
    """Bisection over the converted nodes in graph order: keeping every converted node
    float32 passes (that is the float32 model); the smallest prefix that still passes ends
    with a node that is needed, which joins the kept set, and the search repeats on the nodes
    before it until the kept set alone passes. Each needed node costs about log2(candidates)
    trials. Returns (conversion, kept, trials)."""
    candidates = [(function, name) for _, function, name in base.converted_nodes]
    trials = {}

    bar = _progress.Progress(2 * max(len(candidates).bit_length(), 1), "auto-deny (trials)")
    try:
        def passes(extra):
            key = frozenset(extra)
            if key not in trials:
                if len(trials) >= max_trials:
                    raise ValidationFailed(f"--auto-deny gave up after {max_trials} trials; keep "
                                     "op types float32 with --deny, or check the sample inputs.")
                conversion = model.convert(dtype, lists, set(keep) | set(_names(extra)),
                                           config=config)
                errors = validate(model, conversion, feeds, tolerance, progress=False)
                trials[key] = all(e.ok(tolerance) for e in errors)
                bar.advance(total=max(bar.total, len(trials) + 1))
            return trials[key]

        if not passes(candidates):
            raise ValidationFailed("--auto-deny: the model fails validation even with every converted "
                             "node in float32 (the float32 model does not reproduce itself "
                             "within the check: loosen --rtol/--atol if you gave them, or check "
                             "the sample inputs).")
        kept, remaining = [], list(candidates)
        while not passes(kept):
            low, high = 1, len(remaining)
            while low < high:
                middle = (low + high) // 2
                if passes(kept + remaining[:middle]):
                    high = middle
                else:
                    low = middle + 1
            kept.append(remaining[low - 1])
            remaining = remaining[:low - 1]
    finally:
        bar.close()
    return (model.convert(dtype, lists, set(keep) | set(_names(kept)), config=config), kept,
            len(trials))


def _names(pairs):
    return [name if function is None else f"{function}/{name}" for function, name in pairs]
