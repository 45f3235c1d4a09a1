"""The refinement: a half pick with the op types its per-node profile shows slower in half
than in float32 kept float32, timed beside it, and kept where over policy.margin faster."""

import dataclasses
import statistics

from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose import ledger as _ledger


def refine(choice):
    """The refinement of the pick (`verdict.pick`, a half candidate): the op types whose half
    nodes its per-node profile shows slower than their float32 nodes (policy.slower_ops)
    kept float32, that candidate timed beside the pick within what is left of the budget,
    and kept if over policy.margin faster. Returns the verdict, with the refinement's record
    where one was timed; `choice` gets the refined candidate."""
    verdict, results, graphs, policy, timer, budget = (
        choice.verdict, choice.results, choice.graphs, choice.policy, choice.timer,
        choice.budget)
    chosen = verdict.pick
    half_nodes = {name: d.op for name, d in results[chosen].report.decisions.items()
                  if d.converted}
    profiles = timer.profile({_candidates.FLOAT32: choice.graph_def, chosen: graphs[chosen]},
                             policy)
    slow = policy.slower_ops(profiles[chosen], profiles[_candidates.FLOAT32], half_nodes)
    if not slow:
        return verdict
    keep = tuple(sorted(n for _, _, nodes in slow.values() for n in nodes))
    recipe = dataclasses.replace(choice.candidates[chosen].recipe, float32_nodes=keep)
    refined = recipe.make(choice)
    if refined.graph_def == graphs[chosen]:
        return verdict
    times, at = _ledger.measure(choice, "refinement",
                                {chosen: graphs[chosen], _candidates.REFINED: refined.graph_def},
                                budget.left())
    choice.add(_candidates.Candidate.of(_candidates.REFINED, recipe, refined))
    peaks = _ledger.peaks_after(choice, verdict, at)
    faster = statistics.median(times[_candidates.REFINED]) < \
        statistics.median(times[chosen]) * (1.0 - policy.margin) and \
        not (policy.bounded_peaks(peaks) and
             policy.over_float32(peaks, _candidates.REFINED))
    gained = 1.0 - statistics.median(times[_candidates.REFINED]) / \
        statistics.median(times[chosen])
    return dataclasses.replace(
        verdict, reason=(f"{chosen} with {', '.join(sorted(slow))} float32, {gained:.0%} "
                         f"faster than {chosen}") if faster else verdict.reason,
        ledger=choice.ledger.snapshot(), refined_at=(at, _candidates.REFINED),
        pick=_candidates.REFINED if faster else chosen, refined=keep, refined_from=chosen,
        refined_ops={op: len(nodes) for op, (_, _, nodes) in slow.items()})
