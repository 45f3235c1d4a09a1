"""Lean versions of a pick over float32's peak: its weight gradients' products ordered, its
lean version, its leaner one, each timed beside the fastest within float32's peak."""

import dataclasses
import statistics

from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose.transforms import lean as _lean
from tf_mpt.choose import ledger as _ledger


def lean_versions(graph_def, lean_inputs, tried, policy=None):
    """(lean GraphDef, {change: count}, its options for recipes.Recipe.made_lean) of each of
    `graph_def`'s lean versions in turn, from
    the cheapest: its weight gradients' products ordered alone (lean.lean's `only_ordered`),
    its lean version, its leaner one (weight gradients' products in float32); a version that
    changes nothing, or equals one in `tried` (a list, which each version yielded joins), is
    skipped."""
    for products_in_float32, only_ordered in ((False, True), (False, False), (True, False)):
        graph, changes = _lean.lean(graph_def, products_in_float32, *lean_inputs,
                                    only_ordered=only_ordered, policy=policy)
        if graph is graph_def or any(graph == t for t in tried):
            continue
        tried.append(graph)
        yield graph, changes, (products_in_float32, True, only_ordered, True)


def make_lean(choice):
    """Where the first rounds' fastest candidate is over float32's peak: its weight
    gradients' products ordered (lean.lean's cheapest version, `only_ordered`), then where
    that is still over its lean version (lean.lean, with `lean_inputs`, its lists and
    shapes), then its leaner one (weight gradients' products in float32), each timed beside
    the pick (the fastest within float32's peak) within what is left of `budget` and
    kept if within float32's peak and over policy.margin faster; a candidate's versions stop at
    the first within float32's peak. Then the same for the next fastest candidate over it
    that is over policy.margin faster than the pick (the Keras LSTM's fit step: contractions only's
    lean versions still hold more than float32, the cost model's holds less) and, where a
    version is kept, over policy.margin faster than it in the first rounds (the MLP on Sapphire
    Rapids: contractions only's leaner version, within at 1.03x float32's speed, ended the
    search before the cost model's, within at 2.2x); of those kept, the fastest against the
    pick. Returns the verdict, with the kept lean version's record, else the last one timed;
    `choice` gets the lean candidate."""
    verdict, results, graphs, policy, lean_inputs, budget = (
        choice.verdict, choice.results, choice.graphs, choice.policy, choice.lean_inputs,
        choice.budget)
    fastest = policy.pick(verdict.times,
                          verdict.same_as.get(verdict.predicted, verdict.predicted))
    if fastest in (verdict.pick, _candidates.FLOAT32) or \
            not policy.over_float32(verdict.peaks, fastest):
        return verdict  # (the pick is another for a tie in time: it holds less)
    against, tried = verdict.pick, []
    bound = statistics.median(verdict.times[against]) * (1.0 - policy.margin)
    over = sorted((name for name in graphs if name != _candidates.FLOAT32 and
                   policy.over_float32(verdict.peaks, name) and
                   statistics.median(verdict.times[name]) < bound),
                  key=lambda name: (name != fastest, statistics.median(verdict.times[name])))
    best = None  # (verdict, its lean version's time over the pick's, RewriteResult, Recipe)
    first = statistics.median(verdict.times[against])
    for source in over:
        if best is not None and statistics.median(verdict.times[source]) / first >= \
                best[1] * (1.0 - policy.margin):
            continue  # (its lean versions cannot be over policy.margin faster than the kept one)
        for graph, changes, options in lean_versions(graphs[source], lean_inputs, tried,
                                                     choice.policy):
            left = budget.left()
            if left <= 0:
                break
            times, at = _ledger.measure(choice, "lean versions",
                                        {against: graphs[against], _candidates.LEAN: graph},
                                        left)
            result = _candidates.lean_result(results[source], graph)
            recipe = choice.candidates[source].recipe.made_lean(*options)
            peaks = _ledger.peaks_after(choice, verdict, at)
            within = not policy.over_float32(peaks, _candidates.LEAN)
            ratio = statistics.median(times[_candidates.LEAN]) / statistics.median(times[against])
            kept = within and ratio < 1.0 - policy.margin and (best is None or ratio < best[1])
            if kept or best is None:
                recorded = dataclasses.replace(
                    verdict, ledger=choice.ledger.snapshot(), lean_at=(at, _candidates.LEAN),
                    pick=_candidates.LEAN if kept else against, lean_from=source,
                    lean_against=against, lean_changes=dict(changes),
                    reason=(f"{source}'s lean version, within float32's peak and "
                            f"{1.0 - ratio:.0%} faster than {against}") if kept else
                    verdict.reason)
                if kept:
                    best = (recorded, ratio, result, recipe)
                else:
                    verdict = recorded
                    choice.add(_candidates.Candidate.of(_candidates.LEAN, recipe, result))
            if within:
                break  # (its later versions hold less and run slower)
        if budget.left() <= 0:
            break
    if best is not None:
        verdict, _, result, recipe = best
        choice.add(_candidates.Candidate.of(_candidates.LEAN, recipe, result))
    return verdict
