"""`tf-mpt convert --auto-deny`: the converted nodes to keep float32 so the model passes
validation, found by bisection."""

from tf_mpt.models import progress as _progress
from tf_mpt.models.model_io import ModelError
from tf_mpt.models.validation import validate


def auto_deny(model, dtype, lists, keep, feeds, tolerance, max_trials=400):
    """Finds converted nodes to keep float32 so the model passes validation.

    Bisection over the converted nodes in graph order: keeping every converted node float32
    passes (that is the float32 model); the smallest prefix that still passes ends with a node
    that is needed, which joins the kept set, and the search repeats on the nodes before it
    until the kept set alone passes. Each needed node costs about log2(candidates) trials.

    Returns (conversion, [(function or None, node name)] kept float32 by the search).
    """
    base = model.convert(dtype, lists, keep)
    candidates = [(function, name) for _, function, name in base.converted_nodes]
    trials = {}

    bar = _progress.Progress(2 * max(len(candidates).bit_length(), 1), "auto-deny (trials)")
    try:
        def passes(extra):
            key = frozenset(extra)
            if key not in trials:
                if len(trials) >= max_trials:
                    raise ModelError(f"--auto-deny gave up after {max_trials} trials; keep "
                                     "op types float32 with --deny, or check the sample inputs.")
                conversion = model.convert(dtype, lists, set(keep) | set(_names(extra)))
                errors = validate(model, conversion, feeds, tolerance, progress=False)
                trials[key] = all(e.ok(tolerance) for e in errors)
                bar.advance(total=max(bar.total, len(trials) + 1))
            return trials[key]

        if not passes(candidates):
            raise ModelError("--auto-deny: the model fails validation even with every converted "
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
    return model.convert(dtype, lists, set(keep) | set(_names(kept))), kept


def _names(pairs):
    return [name if function is None else f"{function}/{name}" for function, name in pairs]
