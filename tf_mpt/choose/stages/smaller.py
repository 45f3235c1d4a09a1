"""Smaller versions of a pick holding over policy.smaller_above of float32's peak: the lean versions
of the candidates near its time, timed beside it; a tie in time goes to memory."""

import dataclasses
import statistics

from tf_mpt import _dtypes
from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose.transforms import lean as _lean
from tf_mpt.choose import ledger as _ledger
from tf_mpt.choose import policy as _policy
from tf_mpt.choose import when as _when


def make_smaller(choice):
    """Where no lean version was kept and the pick is a half candidate holding more than
    policy.smaller_above of float32's peak (TF_MPT_MEMORY=least: any half pick): the lean versions
    without ordered products (lean.lean, with `lean_inputs`, its lists and shapes:
    activations saved in half; a weight's half Cast made at each use; ordered products
    serve a candidate whose weight gradients hold it over float32's peak, and cost time) of
    the pick and of each other half candidate within policy.smaller_window of its time (least: not
    slower than float32), then the pick's saved in half from its half copies alone (no new
    Cast down, lean.FROM_COPIES: a Keras Transformer's fit step on Sapphire Rapids, whose
    lean version cost a Cast down and up per Gelu intermediate), timed beside the pick in
    the same rounds within what is left of `budget` (a Budget). Of those holding over
    policy.peak_slack less than the pick and not over policy.margin slower, nor slower than
    float32 (its time scaled by the pick's in the first rounds; least: not slower than
    `float32_graph`, timed in the same rounds), the one holding least (within policy.peak_slack:
    the fastest) is kept: a tie in time goes to memory, whichever colouring it was made from
    (a Keras Transformer's fit step: the op lists' colouring, 2-10% slower than the cost
    model's, made lean has run as fast as the pick, holding 0.57x-0.60x of float32's step
    peak against its 0.91x); where that one (none kept: the pick) holds over policy.smaller_above of
    float32's peak, the fastest version within it is kept instead if not over
    policy.half_memory_price slower (_at_the_goal). Returns the verdict, with the kept lean
    version's record (none kept: the pick's own, else the first timed) where one was timed,
    the others' medians and peaks in its `lean_others`, with the lean version make_lean
    timed and did not keep where it tried one (ResNet50's fit step: contractions only's lean
    version was slower than the op lists' pick, whose own lean version then was not tried);
    `choice` gets the lean candidate. With TF_MPT_MEMORY_PRICE (policy.memory_price): in a
    graph that computes gradients a float32 pick too (prices_float32); the candidates within
    the price of float32's time are sources too, and so is float32's own lean version (its compute
    float32, the values its backward pass reads saved in half: MobileNetV2's fit step on
    Sapphire Rapids, where every half colouring ran slower than float32, held 0.51x
    float32's peak at 6% slower); float32 is timed in the same rounds, and a version within
    policy.smaller_above not over the price slower than float32 is affordable (_at_the_goal's
    `priced`; least: the bound of the one holding least)."""
    verdict, results, policy, lean_inputs, budget, float32_graph = (
        choice.verdict, choice.results, choice.policy, choice.lean_inputs, choice.budget,
        choice.graph_def)
    chosen, peaks = verdict.pick, verdict.peaks
    goal = 0.0 if policy.least else policy.smaller_above
    price = policy.price
    own = _when.prices_float32(policy, results[verdict.predicted].report)
    if chosen == _candidates.LEAN or (chosen == _candidates.FLOAT32 and not own) or \
            chosen not in peaks or _candidates.FLOAT32 not in peaks or \
            _policy.total_peak(peaks, chosen) <= \
            goal * _policy.total_peak(peaks, _candidates.FLOAT32):
        return verdict
    medians = {name: statistics.median(t) for name, t in verdict.times.items()}
    window = medians[_candidates.FLOAT32] * (1.0 + price) \
        if policy.least and _candidates.FLOAT32 in medians else \
        medians[chosen] * (1.0 + policy.smaller_window)
    if price and not policy.least and _candidates.FLOAT32 in medians:
        window = max(window, medians[_candidates.FLOAT32] * (1.0 + price))
    sources = [chosen] + sorted(
        (name for name in medians
         if name not in (chosen, _candidates.FLOAT32, _candidates.LEAN, _candidates.REFINED) and
         results.get(name) is not None and medians[name] <= window and
         not policy.over_float32(peaks, name)),
        key=medians.get)
    if own and chosen != _candidates.FLOAT32:  # (float32's own: compute float32, saved in half)
        sources.append(_candidates.FLOAT32)
    half = _dtypes.parse(results[verdict.predicted].report.dtype).enum
    versions = {}  # {timer key: (source, lean graph, changes)}
    copies = {}  # {timer key: whether its half copies were made anew (new_copies)}
    # each source's lean version, then the pick's from its half copies alone (no new Cast
    # down: where the others cost more than policy.margin, it may hold less at the pick's speed)
    for source, new_copies in [(source, True) for source in sources] + [(chosen, False)]:
        if source == _candidates.FLOAT32 and not new_copies:
            continue  # (float32 has no half copies)
        original = _candidates.graph_of(source, results, float32_graph)
        graph, changes = _lean.lean(original, False, *lean_inputs, ordered=False,
                                    new_copies=new_copies, half=half,
                                    policy=policy)
        if graph is original or any(graph == g for _, g, _ in versions.values()):
            continue
        key = _candidates.LEAN if not versions else f"{_candidates.LEAN} {len(versions)}"
        versions[key], copies[key] = (source, graph, changes), new_copies
    left = budget.left()
    if not versions or left <= 0:
        return verdict
    timed = {chosen: _candidates.graph_of(chosen, results, float32_graph)}
    timed.update((key, graph) for key, (_, graph, _) in versions.items())
    # (float32's time bounds them: measured in the same rounds)
    if policy.least or price:
        timed[_candidates.FLOAT32] = float32_graph
    times, at = _ledger.measure(choice, "smaller versions", timed, left)
    measured = _ledger.peaks_after(choice, verdict, at, names=versions)
    beside = statistics.median(times[chosen])
    # (float32's median in these rounds, with the price: least's bound, and the default's
    # for a version reaching the goal where a price is set)
    priced = statistics.median(times[_candidates.FLOAT32]) * (1.0 + price) \
        if policy.least or price else None
    bound = priced if policy.least else beside * (1.0 + policy.margin)
    # (default: nor slower than float32, its first rounds' median scaled to these rounds by
    # the pick's: a pick kept as the prediction within policy.margin of float32 leaves no room for
    # more; MobileNetV2's fit step on Sapphire Rapids, the cost model's colouring 2.6% slower
    # than float32 and its lean version 1.8%, ran its fit at 0.89x-0.93x float32's speed)
    float32_here = medians[_candidates.FLOAT32] * beside / medians[chosen] \
        if _candidates.FLOAT32 in medians else None
    if not policy.least and float32_here is not None:
        bound = min(bound, float32_here)
    smaller = [key for key in versions
               if key in measured and statistics.median(times[key]) <= bound and
               _policy.total_peak(measured, key) <
               _policy.total_peak(measured, chosen) * (1.0 - policy.peak_slack)]
    kept = None
    if smaller:
        fewest = min(_policy.total_peak(measured, key) for key in smaller)
        kept = min((key for key in smaller
                    if _policy.total_peak(measured, key) <= fewest * (1.0 + policy.peak_slack)),
                   key=lambda key: statistics.median(times[key]))
    if not policy.least:
        kept = _at_the_goal(policy, kept, versions, times, measured, beside, float32_here,
                            priced if price else None) or kept
    record = kept or next((key for key, (source, _, _) in versions.items()
                           if source == chosen), next(iter(versions)))
    source, graph, changes = versions[record]
    recipe = choice.candidates[source].recipe.made_lean(False, False, False, copies[record])
    choice.add(_candidates.Candidate.of(
        _candidates.LEAN, recipe, _candidates.lean_result(
            _candidates.result_of(source, results, float32_graph, verdict.predicted), graph)))
    others = {_lean_label(versions[key][0], versions[key][2]): (at, key)
              for key in versions if key != record}
    if verdict.lean_from and _candidates.LEAN in verdict.times:  # (make_lean's, not kept)
        others = {verdict.lean_from: verdict.lean_at, **others}
    reason = verdict.reason
    if kept and _candidates.FLOAT32 in measured:
        share = _policy.total_peak(measured, kept) / \
            _policy.total_peak(measured, _candidates.FLOAT32)
        slower = statistics.median(times[kept]) / beside - 1.0
        reason = (f"{source}'s lean version, holding {share:.2f}x float32's peak, "
                  + (f"{slower:.0%} slower than {chosen}" if slower > 0 else
                     f"as fast as {chosen}") + " (memory)")
    return dataclasses.replace(
        verdict, ledger=choice.ledger.snapshot(), lean_at=(at, record),
        pick=_candidates.LEAN if kept else chosen, lean_from=source, lean_against=chosen,
        lean_changes=dict(changes), others_at=others, memory_price=price if kept else 0.0,
        reason=reason)


def _at_the_goal(policy, kept, versions, times, measured, beside, float32_here,
                 priced=None):
    """Where `kept` (a key of `versions`, or None) holds over policy.smaller_above of
    float32's peak: the fastest of `versions` (within policy.margin of it: the one holding
    least) that holds within it, not over policy.half_memory_price slower than the pick
    (`times`: the rounds make_smaller timed them in, the pick's median there `beside`) and
    over policy.margin faster than float32 (`float32_here`: its median in those rounds'
    terms, None where not timed), or not over `priced` (TF_MPT_MEMORY_PRICE's bound:
    float32's median in those rounds times one plus the price; None where no price is set),
    or None."""
    if _candidates.FLOAT32 not in measured or (float32_here is None and priced is None):
        return None
    goal = policy.smaller_above * _policy.total_peak(measured, _candidates.FLOAT32)
    if kept is not None and _policy.total_peak(measured, kept) <= goal:
        return None

    def affordable(key):
        median = statistics.median(times[key])
        return (float32_here is not None and
                median <= beside * (1.0 + policy.half_memory_price) and
                median * (1.0 + policy.margin) <= float32_here) or \
            (priced is not None and median <= priced)
    at_goal = [key for key in versions
               if key in measured and _policy.total_peak(measured, key) <= goal and
               affordable(key)]
    if not at_goal:
        return None
    # (a tie in time goes to memory: a Keras Transformer's fit step kept contractions only's
    # lean version, 1% faster than the cost model's and 9% bigger, at 0.68x float32's peak
    # tensors under fit)
    fastest = min(statistics.median(times[key]) for key in at_goal)
    return min((key for key in at_goal
                if statistics.median(times[key]) <= fastest * (1.0 + policy.margin)),
               key=lambda key: _policy.total_peak(measured, key))


def _lean_label(source, changes):
    """How a lean version not kept is named in a verdict's lean_others: its source, and
    whether it was saved in half from half copies alone (lean.FROM_COPIES)."""
    return f"{source} ({_lean.FROM_COPIES})" if _lean.FROM_COPIES in changes else source
