"""The decision for one graph, in one place: candidates, prediction, measurement, verdict.

    prediction    the rewrite's colouring for the target: the cost model's where the target
                  has a table (`here`, a FILE), else the op lists' (`rules`)
    candidates    where the decisions are for this CPU (target `here`) and graph timing is on
                  (TF_MPT_TIMING_BUDGET > 0; `--no-timing` off): float32, the rules', the cost
                  model's and contractions only, each a full rewrite of the same GraphDef
    measurement   graph_timing.time_candidates: each candidate run on made-up inputs in a
                  sandbox; candidates whose graphs are equal are timed once. A traced
                  tf.function (step_applies: TF_MPT_STEP_TIMING) has the same candidates,
                  timed on copies of its variables (step_timing.time_versions), in one
                  sandbox kept open across the stages below (a candidate timed again is not
                  imported or set up again)
    budget        TF_MPT_TIMING_BUDGET counts timed runs (_Budget), each stage's set-up
                  apart: the first rounds spend up to FIRST_SHARE of it, the stages below
                  what is left
    refinement    (graph timing) where a half candidate wins with a third of the budget left:
                  one per-node profile of it and of float32 (graph_timing.profile_candidates);
                  the op types whose half nodes ran slower than their float32 nodes (by over
                  10%) kept float32 in a new candidate (`refined`), timed beside the winner
                  and kept if over 3% faster
    memory        (graph timing) each candidate's step peak, from one traced run's allocation
                  records after its rounds, printed beside its time and flagged where over
                  float32's by more than 2%. With TF_MPT_MEMORY=float32 (the default) such a
                  candidate is not kept, and a tie in time (MARGIN) goes to the candidate
                  holding least (graph_timing.pick); where the fastest is one, its lean version
                  (lean.lean; then, if still over, its leaner one) is timed beside the
                  fastest within float32's peak and kept if it is within that peak and over
                  3% faster (before any refinement: a lean pick is not refined). Where
                  no lean version was kept and the pick holds more than
                  SMALLER_ABOVE of float32's peak, its lean version without ordered products
                  (activations saved in half, late casts), those of the half candidates
                  within SMALLER_WINDOW of its time, and its own from its half copies alone
                  (no new Cast down: lean.FROM_COPIES) are timed beside it, and the one
                  holding least of those holding less (by over 2%) and not slower (by over
                  3%), nor slower than float32, is kept: a tie in time goes to memory;
                  where that one (or the pick) still holds over SMALLER_ABOVE, the fastest
                  that holds within it is kept if not over HALF_MEMORY_PRICE slower than
                  the pick and over 3% faster than float32 (_make_smaller; before the
                  refinement, and a lean pick is not refined). TF_MPT_MEMORY_PRICE (a share
                  of float32's speed): where the pick, float32 included, holds over
                  SMALLER_ABOVE, float32's own lean version (compute float32, saved in
                  half) and those of the candidates within the price of float32's time are
                  timed too, with float32 in the same rounds, and the fastest within
                  SMALLER_ABOVE is kept where not over the price slower than float32 (under
                  least: the bound of the one holding least). A traced tf.function's step
                  timer measures its candidates' peaks the same way
    too slow      where the first rounds of every candidate would not fit in the budget, a
                  candidate over DROP_SLOWER slower than the fastest runs no more rounds
                  (graph_timing.rounds); where the others' still do not fit (TooSlow) and
                  the peak is bounded (TF_MPT_MEMORY=float32 or least): the peaks of float32
                  and of the prediction are measured instead, one traced run each after a
                  first run; the prediction runs where within float32's, else its first lean
                  version within it (_make_lean's order), else float32
                  (_within_float32_untimed: ResNet50's fit step at batch 64, 7.2 s a round,
                  ran the cost model's colouring untimed at 1.13x float32's peak tensors);
                  that check is cached beside the budget (CHECKED_BUDGET) and read again
                  under the same budget only
    verdict       graph_timing.Verdict: every time and the pick, in the report
                  (RewriteReport.verdict) and in one INFO line

A graph that cannot be timed keeps the prediction, and its verdict says why.
"""

import dataclasses
import logging
import statistics

from tensorflow.core.framework import graph_pb2

from tf_mpt import _dtypes
from tf_mpt import lists as _lists
from tf_mpt import targets as _targets
from tf_mpt._process import state as _state
from tf_mpt.choose import cache as _verdicts
from tf_mpt.choose import graph_timing as _timing
from tf_mpt.choose import lean as _lean
from tf_mpt.choose import step_timing as _step_timing
from tf_mpt.costs import contractions as _contractions
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.rewrite import inputs as _inputs
from tf_mpt.rewrite import type_attrs as _ta

_log = logging.getLogger("tf_mpt.rewrite")
# A pick holding more than this share of float32's peak (step peak and resident bytes) has its
# lean version timed beside it (_make_smaller): mixed precision's "half the memory" where
# activations dominate, short of the weights and inputs every candidate holds in float32.
SMALLER_ABOVE = 0.65
# _make_smaller also makes lean the other half candidates within this share of the pick's
# time: a colouring a little slower than the pick may hold much less made lean, and run
# as fast (its half Casts made at each use)
SMALLER_WINDOW = 0.15
# Where no lean version within MARGIN of the pick's time reaches SMALLER_ABOVE of float32's
# peak, the fastest that does is kept if it is at most this share slower than the pick and
# still over MARGIN faster than float32 (the "half the memory" where activations
# dominate): on Sapphire Rapids a Cast to half and back costs ~0.9 ms per 4M elements each
# way, as much as any element-wise op, so a Keras Transformer's fit step holding its Gelu
# intermediates in half (0.59x float32's step peak against the pick's 0.92x) ran 7% slower
# than the pick (184 ms against 172; float32 273 ms).
HALF_MEMORY_PRICE = 0.10
# The budget (TF_MPT_TIMING_BUDGET) counts timed runs, each stage's own set-up apart (a
# sandbox, a new candidate's import and warm-up run, the traced runs of its peak): the first
# rounds may spend this share of it, the later stages (a lean version, a smaller one, a
# refinement) what is left. ResNet50's fit step spent ~36 s setting up its four candidates
# (~23 s now) and ~2.2 s per round: a budget that counted set-up left its lean version no
# time at all.
FIRST_SHARE = 0.6

CONTRACTION_OPS = _contractions.NODE_TIMED_OPS | frozenset((
    "Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"))


class _Budget:
    """Seconds of timed runs left of `seconds`: what each stage's rounds spent (the sum of
    their candidates' timed runs) taken off."""

    def __init__(self, seconds):
        self.seconds, self.spent = seconds, 0.0

    def spend(self, times):
        """`times` ({candidate: (seconds per run, ...)}, a stage's) spent; returns them."""
        self.spent += sum(sum(t) for t in times.values())
        return times

    def left(self):
        return self.seconds - self.spent


def timed_here(config, target):
    """Whether a rewrite for the resolved `target` times its candidates: only where its
    decisions are for this CPU as measured (`here`) and the budget is not 0."""
    return config.timing_budget > 0 and target.kind == _targets.HERE


def contractions_only(lists):
    """The op lists with only their matrix products and convolutions allowed half and no op
    inferred or cleared: every other op float32, with Casts around each contraction."""
    return _lists.OpLists(allow=lists.allow & CONTRACTION_OPS, deny=lists.deny)


def float32_result(graph_def, predicted,
                   reason="graph timing: the graph ran faster in float32"):
    """The RewriteResult of keeping the graph float32, its report the prediction's with
    nothing converted, each node's decision giving `reason`."""
    unchanged = graph_pb2.GraphDef()
    unchanged.CopyFrom(graph_def)
    decisions = {}
    for name, d in predicted.report.decisions.items():
        if d.converted:
            d = dataclasses.replace(d, colour="fp32", converted=False, reason=reason)
        decisions[name] = d
    report = dataclasses.replace(predicted.report, converted_nodes=0, casts_added=0,
                                 cast_names=(), decisions=decisions, predicted_saving=0.0,
                                 loop_variables_kept_half=0, call_values_kept_half=0,
                                 tensor_lists_kept_half=0, batch_norms_folded=0)
    return type(predicted)(unchanged, report, False)


def _candidate_rewrite(name, rewrite, lists):
    """rewrite(graph) of candidate `name` (graph None: the graph decided): its target and
    op lists."""
    target_name, candidate_lists = {
        _timing.RULES: ("rules", None), _timing.COST: (None, None),
        _timing.CONTRACTIONS: ("rules", contractions_only(lists))}[name]
    return lambda graph: rewrite(target_name, candidate_lists, graph)


def _keeping_float32(graph_def, names, candidate, rewrite, lists):
    """Candidate `candidate`'s RewriteResult for `graph_def` with the nodes `names` kept
    float32 (the refinement's), their decisions saying why."""
    keep = set(names)
    marked = graph_pb2.GraphDef()
    marked.CopyFrom(graph_def)
    for node in marked.node:
        if node.name in keep and _ta.KEEP_FP32_ATTR not in node.attr:
            node.attr[_ta.KEEP_FP32_ATTR].b = True
        else:
            keep.discard(node.name)  # (an attr of the graph's own stays)
    result = _candidate_rewrite(candidate, rewrite, lists)(marked)
    for node in result.graph_def.node:
        if node.name in keep:
            del node.attr[_ta.KEEP_FP32_ATTR]
    decisions = dict(result.report.decisions)
    for name in keep:
        if name in decisions:
            decisions[name] = dataclasses.replace(
                decisions[name], colour="fp32", converted=False,
                reason="graph timing: its op type ran slower in half than in float32 in this "
                       "graph's per-node profile (the refinement)")
    return type(result)(result.graph_def,
                        dataclasses.replace(result.report, decisions=decisions),
                        result.modified)


def _refine(graph_def, verdict, results, graphs, rewrite, lists, config, timer, budget):
    """The refinement of the pick (`verdict.pick`, a half candidate): the op types whose half
    nodes its per-node profile shows slower than their float32 nodes (graph_timing.
    slower_ops) kept float32, that candidate timed beside the pick within what is left of
    `budget`, and kept if over MARGIN faster. Returns the verdict, with the refinement's
    record where one was timed; `results` gets the refined RewriteResult."""
    chosen = verdict.pick
    half_nodes = {name: d.op for name, d in results[chosen].report.decisions.items()
                  if d.converted}
    profiles = timer.profile({_timing.FLOAT32: graph_def, chosen: graphs[chosen]},
                             config.cost_batch)
    slow = _timing.slower_ops(profiles[chosen], profiles[_timing.FLOAT32], half_nodes)
    if not slow:
        return verdict
    keep = tuple(sorted(n for _, _, nodes in slow.values() for n in nodes))
    refined = _keeping_float32(graph_def, keep, chosen, rewrite, lists)
    if refined.graph_def == graphs[chosen]:
        return verdict
    times = budget.spend(timer({chosen: graphs[chosen], _timing.REFINED: refined.graph_def},
                               config.cost_batch, budget.left()))
    results[_timing.REFINED] = refined
    peaks = _peaks_after(timer, verdict)
    faster = statistics.median(times[_timing.REFINED]) < \
        statistics.median(times[chosen]) * (1.0 - _timing.MARGIN) and \
        not (_bounded(config, peaks) and _timing.over_float32(peaks, _timing.REFINED))
    return dataclasses.replace(
        verdict, times={**verdict.times, _timing.REFINED: times[_timing.REFINED]},
        pick=_timing.REFINED if faster else chosen, refined=keep, refined_from=chosen,
        refined_ops={op: len(nodes) for op, (_, _, nodes) in slow.items()},
        beside=times[chosen], peaks=peaks)


def _bounded(config, peaks):
    """The peaks the pick is bounded by (TF_MPT_MEMORY=float32 or least), or None."""
    return peaks if config.memory in ("float32", "least") else None


def _least(config):
    """Whether the pick is the candidate holding least of those not slower than float32
    (TF_MPT_MEMORY=least)."""
    return config.memory == "least"


def _price(config):
    """The share of float32's speed a timed graph may give up for memory
    (TF_MPT_MEMORY_PRICE; 0 where nothing is bounded: TF_MPT_MEMORY=any)."""
    return config.memory_price if config.memory in ("float32", "least") else 0.0


def prices_float32(config, report):
    """Whether float32's own lean version is tried for memory (TF_MPT_MEMORY_PRICE set) in a
    graph rewritten with `report`: where it computes gradients (step_timing.
    computes_gradients), since a lean version holds in half what a backward pass reads late
    (an inference step's float32 graph has next to nothing to save, and its timing would
    spend the budget for nothing: a Keras evaluate step's did)."""
    return bool(_price(config)) and _step_timing.computes_gradients(report)


def memory_key(config):
    """What bounds a pick's memory, as a verdict's cache key reads it: TF_MPT_MEMORY's mode,
    with TF_MPT_MEMORY_PRICE where one is set."""
    price = _price(config)
    return f"{config.memory} price {price:g}" if price else config.memory


_FLOAT32_SAVED_IN_HALF = ("graph timing: float32, the values its backward pass reads saved "
                          "in half (TF_MPT_MEMORY_PRICE)")


def _graph_of(name, results, float32_graph):
    """Candidate `name`'s GraphDef (float32's: `float32_graph`)."""
    return float32_graph if name == _timing.FLOAT32 else results[name].graph_def


def _result_of(name, results, float32_graph, predicted):
    """Candidate `name`'s RewriteResult (float32's: made from `float32_graph` and the
    prediction's report, `predicted`, as a lean version's source)."""
    if name != _timing.FLOAT32:
        return results[name]
    return float32_result(float32_graph, results[predicted], _FLOAT32_SAVED_IN_HALF)


def _lean_result(result, graph_def):
    """`result` (a candidate's RewriteResult) with the lean graph `graph_def`: its report's
    `casts_added` counts the lean graph's own tf_mpt Casts (the candidate's, less those a
    leaner version turned into Identities, plus the per-use copies and Casts back)."""
    report = dataclasses.replace(
        result.report, casts_added=result.report.casts_added +
        _casts.our_casts(graph_def.node) - _casts.our_casts(result.graph_def.node))
    return type(result)(graph_def, report, True)


class _ShapeTable:
    """{node name: output shapes} read from `shapes` (a callable, called once, when first
    read)."""

    def __init__(self, shapes):
        self._shapes, self._table = shapes, None

    def get(self, name, default=None):
        if self._table is None:
            self._table = self._shapes() or {}
        return self._table.get(name, default)


def _peaks_after(timer, verdict):
    """The peaks after another round of timing: the verdict's stand (the pick was made with
    them; a candidate timed again does not change them), the new version's (refined, lean:
    the last timed) added."""
    peaks = dict(getattr(timer, "peaks", {}))
    peaks.update((name, peak) for name, peak in verdict.peaks.items()
                 if name not in (_timing.LEAN, _timing.REFINED))
    return peaks


def _make_smaller(verdict, results, config, lean_inputs, timer, budget, float32_graph):
    """Where no lean version was kept and the pick is a half candidate holding more than
    SMALLER_ABOVE of float32's peak (TF_MPT_MEMORY=least: any half pick): the lean versions
    without ordered products (lean.lean, with `lean_inputs`, its lists and shapes:
    activations saved in half; a weight's half Cast made at each use; ordered products
    serve a candidate whose weight gradients hold it over float32's peak, and cost time) of
    the pick and of each other half candidate within SMALLER_WINDOW of its time (least: not
    slower than float32), then the pick's saved in half from its half copies alone (no new
    Cast down, lean.FROM_COPIES: a Keras Transformer's fit step on Sapphire Rapids, whose
    lean version cost a Cast down and up per Gelu intermediate), timed beside the pick in
    the same rounds within what is left of `budget` (a _Budget). Of those holding over
    PEAK_SLACK less than the pick and not over MARGIN slower, nor slower than float32 (its
    time scaled by the pick's in the first rounds; least: not slower than `float32_graph`,
    timed in the same rounds), the one holding least (within PEAK_SLACK:
    the fastest) is kept: a tie in time goes to memory, whichever colouring it was made from
    (a Keras Transformer's fit step: the op lists' colouring, 2-10% slower than the cost
    model's, made lean has run as fast as the pick, holding 0.57x-0.60x of float32's step
    peak against its 0.91x); where that one (none kept: the pick) holds over SMALLER_ABOVE of
    float32's peak, the fastest version within it is kept instead if not over
    HALF_MEMORY_PRICE slower (_at_the_goal). Returns the verdict, with the kept lean
    version's record (none kept: the pick's own, else the first timed) where one was timed,
    the others' medians and peaks in its `lean_others`, with the lean version _make_lean
    timed and did not keep where it tried one (ResNet50's fit step: contractions only's lean
    version was slower than the op lists' pick, whose own lean version then was not tried);
    `results` gets its RewriteResult. With TF_MPT_MEMORY_PRICE (_price): in a graph that
    computes gradients a float32 pick too (prices_float32); the candidates within the price
    of float32's time are sources too, and so is float32's own lean version (its compute
    float32, the values its backward pass reads saved in half: MobileNetV2's fit step on
    Sapphire Rapids, where every half colouring ran slower than float32, held 0.51x
    float32's peak at 6% slower); float32 is timed in the same rounds, and a version within
    SMALLER_ABOVE not over the price slower than float32 is affordable (_at_the_goal's
    `priced`; least: the bound of the one holding least)."""
    chosen, peaks = verdict.pick, verdict.peaks
    goal = 0.0 if _least(config) else SMALLER_ABOVE
    price = _price(config)
    own = prices_float32(config, results[verdict.predicted].report)
    if chosen == _timing.LEAN or (chosen == _timing.FLOAT32 and not own) or \
            chosen not in peaks or _timing.FLOAT32 not in peaks or \
            _timing.total_peak(peaks, chosen) <= \
            goal * _timing.total_peak(peaks, _timing.FLOAT32):
        return verdict
    medians = {name: statistics.median(t) for name, t in verdict.times.items()}
    window = medians[_timing.FLOAT32] * (1.0 + price) \
        if _least(config) and _timing.FLOAT32 in medians else \
        medians[chosen] * (1.0 + SMALLER_WINDOW)
    if price and not _least(config) and _timing.FLOAT32 in medians:
        window = max(window, medians[_timing.FLOAT32] * (1.0 + price))
    sources = [chosen] + sorted(
        (name for name in medians
         if name not in (chosen, _timing.FLOAT32, _timing.LEAN, _timing.REFINED) and
         results.get(name) is not None and medians[name] <= window and
         not _timing.over_float32(peaks, name)),
        key=medians.get)
    if own and chosen != _timing.FLOAT32:  # (float32's own: compute float32, saved in half)
        sources.append(_timing.FLOAT32)
    half = _dtypes.parse(results[verdict.predicted].report.dtype).enum
    versions = {}  # {timer key: (source, lean graph, changes)}
    # each source's lean version, then the pick's from its half copies alone (no new Cast
    # down: where the others cost more than MARGIN, it may hold less at the pick's speed)
    for source, new_copies in [(source, True) for source in sources] + [(chosen, False)]:
        if source == _timing.FLOAT32 and not new_copies:
            continue  # (float32 has no half copies)
        original = _graph_of(source, results, float32_graph)
        graph, changes = _lean.lean(original, False, *lean_inputs, ordered=False,
                                    new_copies=new_copies, half=half)
        if graph is original or any(graph == g for _, g, _ in versions.values()):
            continue
        versions[_timing.LEAN if not versions else f"{_timing.LEAN} {len(versions)}"] = \
            (source, graph, changes)
    left = budget.left()
    if not versions or left <= 0:
        return verdict
    timed = {chosen: _graph_of(chosen, results, float32_graph)}
    timed.update((key, graph) for key, (_, graph, _) in versions.items())
    if _least(config) or price:  # (float32's time bounds them: measured in the same rounds)
        timed[_timing.FLOAT32] = float32_graph
    times = budget.spend(timer(timed, config.cost_batch, left))
    measured = _peaks_after(timer, verdict)
    beside = statistics.median(times[chosen])
    # (float32's median in these rounds, with the price: least's bound, and the default's
    # for a version reaching the goal where a price is set)
    priced = statistics.median(times[_timing.FLOAT32]) * (1.0 + price) \
        if _least(config) or price else None
    bound = priced if _least(config) else beside * (1.0 + _timing.MARGIN)
    # (default: nor slower than float32, its first rounds' median scaled to these rounds by
    # the pick's: a pick kept as the prediction within MARGIN of float32 leaves no room for
    # more; MobileNetV2's fit step on Sapphire Rapids, the cost model's colouring 2.6% slower
    # than float32 and its lean version 1.8%, ran its fit at 0.89x-0.93x float32's speed)
    float32_here = medians[_timing.FLOAT32] * beside / medians[chosen] \
        if _timing.FLOAT32 in medians else None
    if not _least(config) and float32_here is not None:
        bound = min(bound, float32_here)
    smaller = [key for key in versions
               if key in measured and statistics.median(times[key]) <= bound and
               _timing.total_peak(measured, key) <
               _timing.total_peak(measured, chosen) * (1.0 - _timing.PEAK_SLACK)]
    kept = None
    if smaller:
        fewest = min(_timing.total_peak(measured, key) for key in smaller)
        kept = min((key for key in smaller
                    if _timing.total_peak(measured, key) <= fewest * (1.0 + _timing.PEAK_SLACK)),
                   key=lambda key: statistics.median(times[key]))
    if not _least(config):
        kept = _at_the_goal(kept, versions, times, measured, beside, float32_here,
                            priced if price else None) or kept
    record = kept or next((key for key, (source, _, _) in versions.items()
                           if source == chosen), next(iter(versions)))
    source, graph, changes = versions[record]
    results[_timing.LEAN] = _lean_result(
        _result_of(source, results, float32_graph, verdict.predicted), graph)
    peaks = {name: peak for name, peak in measured.items() if name not in versions}
    if record in measured:
        peaks[_timing.LEAN] = measured[record]
    stand = getattr(timer, "peaks", None)  # (what a refinement's _peaks_after reads)
    if isinstance(stand, dict):
        for key in versions:
            stand.pop(key, None)
        if _timing.LEAN in peaks:
            stand[_timing.LEAN] = peaks[_timing.LEAN]
    others = {_lean_label(versions[key][0], versions[key][2]):
              (statistics.median(times[key]), measured.get(key))
              for key in versions if key != record}
    if verdict.lean_from and _timing.LEAN in verdict.times:  # (_make_lean's, not kept)
        others = {verdict.lean_from: (statistics.median(verdict.times[_timing.LEAN]),
                                      verdict.peaks.get(_timing.LEAN)), **others}
    return dataclasses.replace(
        verdict, times={**verdict.times, _timing.LEAN: times[record]},
        pick=_timing.LEAN if kept else chosen, lean_from=source, lean_against=chosen,
        lean_beside=times[chosen], lean_changes=dict(changes), peaks=peaks,
        lean_others=others, memory_price=price if kept else 0.0)


def _at_the_goal(kept, versions, times, measured, beside, float32_here, priced=None):
    """Where `kept` (a key of `versions`, or None) holds over SMALLER_ABOVE of float32's peak:
    the fastest of `versions` (within MARGIN of it: the one holding least) that holds within
    it, not over HALF_MEMORY_PRICE slower than the pick (`times`: the rounds _make_smaller
    timed them in, the pick's median there `beside`) and over MARGIN faster than float32
    (`float32_here`: its median in those rounds' terms, None where not timed), or not over
    `priced` (TF_MPT_MEMORY_PRICE's bound: float32's median in those rounds times one plus
    the price; None where no price is set), or None."""
    if _timing.FLOAT32 not in measured or (float32_here is None and priced is None):
        return None
    goal = SMALLER_ABOVE * _timing.total_peak(measured, _timing.FLOAT32)
    if kept is not None and _timing.total_peak(measured, kept) <= goal:
        return None

    def affordable(key):
        median = statistics.median(times[key])
        return (float32_here is not None and median <= beside * (1.0 + HALF_MEMORY_PRICE) and
                median * (1.0 + _timing.MARGIN) <= float32_here) or \
            (priced is not None and median <= priced)
    at_goal = [key for key in versions
               if key in measured and _timing.total_peak(measured, key) <= goal and
               affordable(key)]
    if not at_goal:
        return None
    # (a tie in time goes to memory: a Keras Transformer's fit step kept contractions only's
    # lean version, 1% faster than the cost model's and 9% bigger, at 0.68x float32's peak
    # tensors under fit)
    fastest = min(statistics.median(times[key]) for key in at_goal)
    return min((key for key in at_goal
                if statistics.median(times[key]) <= fastest * (1.0 + _timing.MARGIN)),
               key=lambda key: _timing.total_peak(measured, key))


def _lean_label(source, changes):
    """How a lean version not kept is named in a verdict's lean_others: its source, and
    whether it was saved in half from half copies alone (_lean.FROM_COPIES)."""
    return f"{source} ({_lean.FROM_COPIES})" if _lean.FROM_COPIES in changes else source


def _lean_versions(graph_def, lean_inputs, tried):
    """(lean GraphDef, {change: count}) of each of `graph_def`'s lean versions in turn, from
    the cheapest: its weight gradients' products ordered alone (lean.lean's `only_ordered`),
    its lean version, its leaner one (weight gradients' products in float32); a version that
    changes nothing, or equals one in `tried` (a list, which each version yielded joins), is
    skipped."""
    for products_in_float32, only_ordered in ((False, True), (False, False), (True, False)):
        graph, changes = _lean.lean(graph_def, products_in_float32, *lean_inputs,
                                    only_ordered=only_ordered)
        if graph is graph_def or any(graph == t for t in tried):
            continue
        tried.append(graph)
        yield graph, changes


def _make_lean(verdict, results, graphs, config, lean_inputs, timer, budget):
    """Where the first rounds' fastest candidate is over float32's peak: its weight
    gradients' products ordered (lean.lean's cheapest version, `only_ordered`), then where
    that is still over its lean version (lean.lean, with `lean_inputs`, its lists and
    shapes), then its leaner one (weight gradients' products in float32), each timed beside
    the pick (the fastest within float32's peak) within what is left of `budget` and
    kept if within float32's peak and over MARGIN faster; a candidate's versions stop at
    the first within float32's peak. Then the same for the next fastest candidate over it
    that is over MARGIN faster than the pick (the Keras LSTM's fit step: contractions only's
    lean versions still hold more than float32, the cost model's holds less) and, where a
    version is kept, over MARGIN faster than it in the first rounds (the MLP on Sapphire
    Rapids: contractions only's leaner version, within at 1.03x float32's speed, ended the
    search before the cost model's, within at 2.2x); of those kept, the fastest against the
    pick. Returns the verdict, with the kept lean version's record, else the last one timed;
    `results` gets its RewriteResult."""
    fastest = _timing.pick(verdict.times,
                           verdict.same_as.get(verdict.predicted, verdict.predicted))
    if fastest in (verdict.pick, _timing.FLOAT32) or \
            not _timing.over_float32(verdict.peaks, fastest):
        return verdict  # (the pick is another for a tie in time: it holds less)
    against, tried = verdict.pick, []
    bound = statistics.median(verdict.times[against]) * (1.0 - _timing.MARGIN)
    over = sorted((name for name in graphs if name != _timing.FLOAT32 and
                   _timing.over_float32(verdict.peaks, name) and
                   statistics.median(verdict.times[name]) < bound),
                  key=lambda name: (name != fastest, statistics.median(verdict.times[name])))
    best = None  # (verdict, its lean version's time over the pick's, RewriteResult)
    first = statistics.median(verdict.times[against])
    for source in over:
        if best is not None and statistics.median(verdict.times[source]) / first >= \
                best[1] * (1.0 - _timing.MARGIN):
            continue  # (its lean versions cannot be over MARGIN faster than the kept one)
        for graph, changes in _lean_versions(graphs[source], lean_inputs, tried):
            left = budget.left()
            if left <= 0:
                break
            times = budget.spend(timer({against: graphs[against], _timing.LEAN: graph},
                                       config.cost_batch, left))
            result = _lean_result(results[source], graph)
            peaks = _peaks_after(timer, verdict)
            within = not _timing.over_float32(peaks, _timing.LEAN)
            ratio = statistics.median(times[_timing.LEAN]) / statistics.median(times[against])
            kept = within and ratio < 1.0 - _timing.MARGIN and (best is None or ratio < best[1])
            if kept or best is None:
                recorded = dataclasses.replace(
                    verdict, times={**verdict.times, _timing.LEAN: times[_timing.LEAN]},
                    pick=_timing.LEAN if kept else against, lean_from=source,
                    lean_against=against, lean_beside=times[against],
                    lean_changes=dict(changes), peaks=peaks)
                if kept:
                    best = (recorded, ratio, result)
                else:
                    verdict, results[_timing.LEAN] = recorded, result
            if within:
                break  # (its later versions hold less and run slower)
        if budget.left() <= 0:
            break
    if best is not None:
        verdict, _, results[_timing.LEAN] = best
    return verdict


# The key beside a stored verdict of a graph too slow to time (its peaks measured instead):
# the budget it was too slow for. Read again only under that budget (another is timed again).
CHECKED_BUDGET = "checked_budget"

_FLOAT32_HELD_LESS = ("graph timing: too slow to time; its half colouring and their lean "
                      "versions measured over float32's peak (TF_MPT_MEMORY)")


def _within_float32_untimed(verdict, graphs, results, same_as, config, lean_inputs, timer):
    """The memory check of a graph too slow to time (`verdict`: not timed, keeping the
    prediction) under TF_MPT_MEMORY=float32 or least: the peaks of float32 and of the
    prediction, one traced run each after a first run (the timer's `peaks_only`). Where the
    prediction's is over float32's (by over PEAK_SLACK), its lean versions in _make_lean's
    order (ordered products alone, lean, leaner) are measured and the first within float32's
    peak is kept; where none is, float32 is. Their speed is not measured. Returns the
    verdict, its peaks (and its lean version's record where one was measured) set; `results`
    gets a kept lean version's RewriteResult. Where the check fails, `verdict` as it was."""
    measure = getattr(timer, "peaks_only", None)
    source = same_as.get(verdict.predicted, verdict.predicted)
    if measure is None or source == _timing.FLOAT32 or source not in graphs:
        return verdict
    try:
        measure({_timing.FLOAT32: graphs[_timing.FLOAT32], source: graphs[source]},
                config.cost_batch)
        peaks = {name: peak for name, peak in timer.peaks.items()
                 if name in (_timing.FLOAT32, source, _timing.RESIDENT)}
        if _timing.FLOAT32 not in peaks or source not in peaks:
            return verdict
        if not _timing.over_float32(peaks, source):
            return dataclasses.replace(verdict, peaks=peaks)
        for graph, changes in _lean_versions(graphs[source], lean_inputs, []):
            measure({_timing.LEAN: graph}, config.cost_batch)
            if _timing.LEAN not in timer.peaks:
                break
            peaks[_timing.LEAN] = timer.peaks[_timing.LEAN]
            verdict = dataclasses.replace(verdict, peaks=dict(peaks), lean_from=source,
                                          lean_changes=dict(changes))
            if not _timing.over_float32(peaks, _timing.LEAN):
                results[_timing.LEAN] = _lean_result(results[source], graph)
                return dataclasses.replace(verdict, pick=_timing.LEAN)
        return dataclasses.replace(verdict, pick=_timing.FLOAT32, peaks=dict(peaks))
    except Exception as error:  # pylint: disable=broad-except
        _log.info("graph timing could not measure the peaks of a graph too slow to time "
                  "(%s: %s); it keeps the prediction", type(error).__name__, error)
        return dataclasses.replace(verdict, pick=verdict.predicted, peaks={}, lean_from="",
                                   lean_changes={})


def _lean_again(verdict, results, lean_inputs, float32_graph):
    """The RewriteResult of a verdict's lean pick, made again (a cached verdict; float32's
    own lean version from `float32_graph`)."""
    changes = verdict.lean_changes
    source = _result_of(verdict.lean_from, results, float32_graph, verdict.predicted)
    graph, _ = _lean.lean(source.graph_def,
                          "float32 products" in changes, *lean_inputs,
                          ordered="ordered products" in changes,
                          only_ordered=set(changes) == {"ordered products"},
                          new_copies=_lean.FROM_COPIES not in changes,
                          half=_dtypes.parse(source.report.dtype).enum)
    return _lean_result(source, graph)


def _close(timer):
    """Ends a timer's sandbox where it keeps one open across stages (a traced function's)."""
    close = getattr(timer, "close", None)
    if close is not None:
        try:
            close()
        except Exception as error:  # pylint: disable=broad-except
            _log.info("graph timing could not close its sandbox (%s: %s)",
                      type(error).__name__, error)


def applies(config, target, dtype):
    """Whether a rewrite for the resolved `target` goes through `decide`: for this CPU
    (`here`) with a budget; for a cost table file that holds verdicts (`tf-mpt measure
    --model`), or while such a table is being measured."""
    if timed_here(config, target):
        return True
    return target.kind == "table" and target.table is not None and (
        _verdicts.measuring_for_a_table() or bool(_verdicts.in_table(target.table, dtype)))


def step_applies(config, target, report):
    """Whether a traced tf.function rewritten with `report` for the resolved `target` has
    its candidates timed (on copies of its variables): step_reason says why."""
    return step_reason(config, target, report) is not None


def step_reason(config, target, report, compiled=False):
    """Why a traced tf.function rewritten with `report` for the resolved `target` has its
    candidates timed, or None: where step timing would time it
    (step_timing.timing_reason: decided for this CPU, TF_MPT_STEP_TIMING; with
    TF_MPT_MEMORY=least, auto acts as always: what a step holds is not predicted; with
    float32, the default, auto acts as always for a step computing gradients where the cost
    model kept a share of its nodes float32, step_timing.holds_float32_for_gradients, or
    through a loop whose buffers it keeps half, holds_half_loop_buffers_for_gradients; with
    TF_MPT_MEMORY_PRICE, for every step computing gradients; `compiled`, a step XLA compiles:
    always, the cost model's kernel times being TensorFlow's kernels', not XLA's) and the
    budget is not 0."""
    if config.timing_budget <= 0:
        return None
    mode = config.step_timing
    reason = _step_timing.timing_reason(report, target, mode)
    if reason is not None or mode != "auto" or \
            _step_timing.timing_reason(report, target, "always") is None:
        return reason
    if compiled:
        return ("XLA compiles it (jit_compile): the cost model adds up TensorFlow's kernels, "
                "not what XLA makes of the step (on a CPU it computes half contractions in "
                "float32 between converts)")
    if _least(config):
        return "TF_MPT_MEMORY=least: what each candidate holds is measured, not predicted"
    if prices_float32(config, report):
        return (f"it computes gradients and TF_MPT_MEMORY_PRICE={config.memory_price:g}: what "
                "it holds for the backward pass is measured, not predicted")
    if config.memory == "float32" and _step_timing.holds_float32_for_gradients(report):
        return (f"it computes gradients and the cost model kept {report.kept_by_cost_model} "
                f"of the {report.weighed_nodes[0]} nodes it weighed float32: what it holds "
                "for the backward pass is measured, not predicted")
    buffers = _step_timing.holds_half_loop_buffers_for_gradients(report) \
        if config.memory == "float32" else 0
    if buffers:
        return (f"it computes gradients through a loop with {buffers} buffer(s) (TensorLists, "
                "loop variables) kept half: what its iterations hold for the backward pass "
                "is measured, not predicted")
    return None


def decide(graph_def, predicted, rewrite, config, fetches, lists, target, timer=None,
           label=None, shapes=None):
    """The verdict for one graph: `predicted` (a RewriteResult) unless timing its candidates
    on this CPU (or a verdict cached here, or one a cost table file holds) finds another
    faster. `rewrite(target, lists, graph)` returns a candidate's RewriteResult (target
    'rules', or None: the prediction's; lists None: `lists`, the prediction's; graph None:
    `graph_def`). Where a half candidate wins with budget left (REFINE_SHARE), its refinement
    is timed too (_refine). Returns the RewriteResult kept, its report's
    `verdict` set (for a table without this graph's verdict: `predicted` as it is).

    timer: None, graph timing's sandbox (graph_timing.time_candidates), its verdicts cached;
    or `timer(graphs, batch, budget)` timing {candidate: GraphDef} another way (a traced
    tf.function's, on copies of its variables), its verdicts cached where it has a
    `key_graph(graph_def)` attribute (the graph the cache keys it by: a trace's names are
    its process's; raising NotTimed where it would not be timed); a timer with a
    `profile(graphs, batch)` attribute ({candidate: {node: seconds}}) can be refined.
    label: what the INFO line names (a tf.function). shapes: None, or a callable returning
    {node name: output shapes} of `graph_def` (a tf.function's carry its variables' shapes):
    what the lean versions size values by (None: lean.saved_in_half infers them from the
    GraphDef)."""
    dtype = predicted.report.dtype
    predicted_name = _timing.COST if predicted.report.weighed_nodes is not None \
        else _timing.RULES
    known, source, key = None, "timed", None
    if timer is None:
        view = _graph_view.GraphView(graph_def)
        names = sorted(_inputs.fetch_node_names(fetches, view) or
                       _inputs.fetch_node_names(None, view))
        key = _verdicts.fingerprint(graph_def, names, dtype, lists, config.cost_batch,
                                   memory_key(config))

        peaks = {}  # {candidate: step peak bytes}, filled as candidates are timed

        def timer(graphs, batch, budget):
            return _timing.time_candidates(graphs, names, batch, budget, peaks)
        timer.profile = lambda graphs, batch: _timing.profile_candidates(graphs, names, batch)
        timer.peaks_only = lambda graphs, batch: _timing.time_candidates(
            graphs, names, batch, 0.0, peaks, runs=_timing.first_runs)
        timer.peaks = peaks
        if target.kind == "table" and not _verdicts.measuring_for_a_table():
            known, source = _verdicts.in_table(target.table, dtype).get(key), "table"
            if known is None:
                return predicted
        elif target.kind != "table":
            known, source = _verdicts.cached(config, dtype).get(key), "cached"
    elif getattr(timer, "key_graph", None) is not None:
        try:  # (a traced function's, its names made the same in every process; timed on
            # this CPU, so this CPU's cache, whatever table stands in for its kernels)
            key = _verdicts.fingerprint(timer.key_graph(graph_def), ["(a traced function)"],
                                       dtype, lists, config.cost_batch,
                                       memory_key(config))
        except Exception:  # pylint: disable=broad-except
            key = None  # (NotTimed: it is not timed either; else timed, not cached)
        if key is not None:
            known, source = _verdicts.cached(config, dtype).get(key), "cached"
    # (lean.lean's lists and shapes: which readers may read a value rounded to half, and the
    # sizes of the values; a tf.function's shapes carry its variables')
    lean_inputs = (lists, _ShapeTable(shapes) if shapes is not None else None)
    results = {_timing.FLOAT32: None, predicted_name: predicted}
    same_as = {}  # candidate -> the candidate whose graph it equals
    graphs = {}
    try:
        for name in (_timing.RULES, _timing.CONTRACTIONS):
            if name != predicted_name:
                results[name] = _candidate_rewrite(name, rewrite, lists)(None)
        graphs, seen = {}, {}
        for name, result in results.items():
            graph = graph_def if result is None else result.graph_def
            serialized = graph.SerializeToString(deterministic=True)
            if serialized in seen:
                same_as[name] = seen[serialized]
                continue
            seen[serialized] = name
            graphs[name] = graph
        verdict = None
        if known is not None:
            verdict = _timing.Verdict.from_dict(known, source)
            if verdict is not None and not verdict.timed:
                # (a graph too slow to time, its peaks measured instead: the record stands
                # for the budget it was too slow for, and for its candidates)
                ok = known.get(CHECKED_BUDGET) == config.timing_budget and \
                    verdict.predicted == predicted_name and \
                    set(verdict.peaks) - {_timing.RESIDENT, _timing.LEAN} <= set(graphs) and \
                    (not verdict.lean_from or verdict.lean_from in graphs)
                verdict = dataclasses.replace(verdict, same_as=same_as) if ok else None
            elif verdict is None or not set(graphs) <= set(verdict.times):
                # a record this version cannot apply, or one that did not time every
                # candidate there is now (the prediction changed: a table measured since):
                # timed again
                verdict = None
            else:
                verdict = dataclasses.replace(verdict, same_as=same_as)
        if verdict is None:
            if len(graphs) == 1:
                raise _timing.NotTimed("every candidate is the float32 graph")
            budget = _Budget(config.timing_budget)
            times = budget.spend(timer(graphs, config.cost_batch,
                                       FIRST_SHARE * config.timing_budget))
            measured = dict(getattr(timer, "peaks", {}))
            chosen = _timing.pick(times, same_as.get(predicted_name, predicted_name),
                                  _bounded(config, measured), _least(config), _price(config))
            verdict = _timing.Verdict(times, chosen, predicted_name, "", same_as,
                                      peaks=measured,
                                      compiled=bool(getattr(timer, "compiled", False)))
            if _bounded(config, measured) and budget.left() > 0:
                try:
                    verdict = _make_lean(verdict, results, graphs, config, lean_inputs, timer,
                                         budget)
                except Exception as error:  # pylint: disable=broad-except
                    _log.info("graph timing did not time a lean candidate (%s: %s)",
                              type(error).__name__, error)
                try:  # (before the refinement, which would leave it no budget)
                    verdict = _make_smaller(verdict, results, config, lean_inputs, timer,
                                            budget, graph_def)
                except Exception as error:  # pylint: disable=broad-except
                    _log.info("graph timing did not time a smaller candidate (%s: %s)",
                              type(error).__name__, error)
                chosen = verdict.pick
            if getattr(timer, "profile", None) and chosen not in (_timing.FLOAT32,
                                                                  _timing.LEAN) and \
                    not _least(config) and \
                    budget.left() >= _timing.REFINE_SHARE * config.timing_budget:
                try:
                    verdict = _refine(graph_def, verdict, results, graphs, rewrite, lists,
                                      config, timer, budget)
                except Exception as error:  # pylint: disable=broad-except
                    # (the first rounds' pick stands; NotTimed: a run failed or was stopped)
                    _log.info("graph timing did not refine %s (%s: %s)", chosen,
                              type(error).__name__, error)
            if key is not None:
                _verdicts.store(config, dtype, key, verdict.to_dict())
        if verdict.pick == _timing.REFINED and _timing.REFINED not in results:
            results[_timing.REFINED] = _keeping_float32(graph_def, verdict.refined,
                                                        verdict.refined_from, rewrite, lists)
        if verdict.pick == _timing.LEAN and _timing.LEAN not in results:
            results[_timing.LEAN] = _lean_again(verdict, results, lean_inputs, graph_def)
    except _timing.NotTimed as error:
        verdict = _timing.Verdict({}, predicted_name, predicted_name, str(error))
        if isinstance(error, _timing.TooSlow) and _bounded(config, {}) is not None:
            verdict = _within_float32_untimed(verdict, graphs, results, same_as, config,
                                              lean_inputs, timer)
            if key is not None and verdict.peaks:
                _verdicts.store(config, dtype, key,
                                {**verdict.to_dict(), CHECKED_BUDGET: config.timing_budget})
    except Exception as error:  # pylint: disable=broad-except
        _state.warn_once(("graph_timing", type(error).__name__),
                         "tf_mpt could not time a graph's candidate colourings (%s: %s); it "
                         "keeps the predicted one", type(error).__name__, error)
        verdict = _timing.Verdict({}, predicted_name, predicted_name,
                                  f"timing failed: {type(error).__name__}: {error}")
    finally:
        _close(timer)
    if label is None:
        _log.info("%s", verdict.describe())
    elif verdict.timed:
        _log.info("tf_mpt timed %s on copies of its variables: %s", label, verdict.describe())
    else:
        _log.info("tf_mpt did not time %s: %s", label, verdict.describe())
    if verdict.pick in (predicted_name, same_as.get(predicted_name)):
        kept = predicted  # (the prediction's graph, whatever else equals it)
    elif verdict.pick == _timing.FLOAT32:
        kept = float32_result(graph_def, predicted, _FLOAT32_HELD_LESS if not verdict.timed
                              else "graph timing: the graph ran faster in float32")
    else:
        kept = results[verdict.pick]
    # the target decided for, and what its prediction weighed, whichever candidate is kept
    report = dataclasses.replace(kept.report, verdict=verdict, target=predicted.report.target,
                                 weighed_nodes=predicted.report.weighed_nodes,
                                 unweighed_nodes=predicted.report.unweighed_nodes,
                                 unweighed_why=predicted.report.unweighed_why)
    return type(kept)(kept.graph_def, report, kept.modified)
