"""The memory check of a graph too slow to time: the peaks of float32 and of the prediction
measured instead (one traced run each), and the first lean version within float32's peak."""

import dataclasses
import logging

from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose import ledger as _ledger
from tf_mpt.choose.stages import lean as _lean_stage

_log = logging.getLogger("tf_mpt.rewrite")


def within_float32_untimed(choice):
    """The memory check of a graph too slow to time (`verdict`: not timed, keeping the
    prediction) under TF_MPT_MEMORY=float32 or least: the peaks of float32 and of the
    prediction, one traced run each after a first run (the timer's `peaks_only`). Where the
    prediction's is over float32's (by over policy.peak_slack), its lean versions in make_lean's
    order (ordered products alone, lean, leaner) are measured and the first within float32's
    peak is kept; where none is, float32 is. Their speed is not measured. Returns the
    verdict, its peaks (and its lean version's record where one was measured) set; `choice`
    gets a kept lean version as a candidate. Where the check fails, `verdict` as it was."""
    verdict, graphs, results, policy, lean_inputs = (
        choice.verdict, choice.graphs, choice.results, choice.policy, choice.lean_inputs)
    source = choice.same_as.get(verdict.predicted, verdict.predicted)
    if source == _candidates.FLOAT32 or source not in graphs:
        return verdict
    given = verdict
    try:
        peaks, at = _ledger.measure_peaks(choice, "peaks", {
            _candidates.FLOAT32: graphs[_candidates.FLOAT32], source: graphs[source]})
        if _candidates.FLOAT32 not in peaks or source not in peaks:
            return verdict
        verdict = dataclasses.replace(
            verdict, ledger=choice.ledger.snapshot(),
            peaks_at={_candidates.FLOAT32: (at, _candidates.FLOAT32), source: (at, source)})
        if not policy.over_float32(peaks, source):
            return dataclasses.replace(
                verdict, reason="not timed: the prediction is within float32's peak")
        for graph, changes, options in _lean_stage.lean_versions(graphs[source], lean_inputs,
                                                                 [], policy):
            measured, at = _ledger.measure_peaks(choice, "peaks", {_candidates.LEAN: graph})
            if _candidates.LEAN not in measured:
                break
            peaks[_candidates.LEAN] = measured[_candidates.LEAN]
            verdict = dataclasses.replace(verdict, ledger=choice.ledger.snapshot(),
                                          lean_at=(at, _candidates.LEAN), lean_from=source,
                                          lean_changes=dict(changes))
            if not policy.over_float32(peaks, _candidates.LEAN):
                choice.add(_candidates.Candidate.of(
                    _candidates.LEAN, choice.candidates[source].recipe.made_lean(*options),
                    _candidates.lean_result(results[source], graph)))
                return dataclasses.replace(
                    verdict, pick=_candidates.LEAN,
                    reason=f"not timed: {source}'s lean version is within float32's peak")
        return dataclasses.replace(
            verdict, pick=_candidates.FLOAT32,
            reason=f"not timed: {source} and its lean versions are over float32's peak")
    except Exception as error:  # pylint: disable=broad-except
        _log.info("graph timing could not measure the peaks of a graph too slow to time "
                  "(%s: %s); it keeps the prediction", type(error).__name__, error)
        return dataclasses.replace(given, pick=given.predicted)
