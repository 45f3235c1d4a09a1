"""The pick as a pure function of the ledger and the policy (tf_mpt.choose.policy.pick): the
first rounds' times and the peaks measured decide, the reason says why, and nothing else the
ledger holds (a later stage's rounds) changes it. No graph is built or run here."""

import dataclasses

import pytest

from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose import ledger as _ledger
from tf_mpt.choose import policy as _policy
from tf_mpt.choose import verdict as _verdict

F32, RULES, COST, CONTR = (_candidates.FLOAT32, _candidates.RULES, _candidates.COST,
                           _candidates.CONTRACTIONS)
MIB = 1 << 20


def _ledger_of(times, peaks=None, predicted=COST, resident=None):
    """A ledger whose first rounds measured `times` ({candidate: seconds per round}) and
    `peaks` ({candidate: bytes})."""
    ledger = _ledger.Ledger(predicted)
    measured = dict(peaks or {})
    if resident is not None:
        measured[_ledger.RESIDENT] = resident
    ledger.record(_ledger.FIRST_ROUNDS, times, measured)
    return ledger


def test_the_fastest_is_picked_and_the_reason_says_so():
    ledger = _ledger_of({F32: (2.0,) * 3, COST: (1.5,) * 3, RULES: (1.0,) * 3})
    assert _policy.pick(ledger, _policy.DEFAULT) == (
        RULES, "the fastest, over 3% faster than the prediction")


def test_the_prediction_within_the_margin_of_the_fastest_is_kept():
    margin = _policy.DEFAULT.margin
    ledger = _ledger_of({F32: (2.0,) * 3, COST: (1.0 * (1 + margin / 2),) * 3,
                         RULES: (1.0,) * 3})
    assert _policy.pick(ledger, _policy.DEFAULT) == (
        COST, "the prediction, within 3% of the fastest (rules)")
    # a wider margin of another policy: the same ledger, the same pick; a narrower: the fastest
    narrow = dataclasses.replace(_policy.DEFAULT, margin=margin / 4)
    assert _policy.pick(ledger, narrow)[0] == RULES


def test_a_candidate_over_float32s_peak_is_not_kept_and_a_tie_goes_to_memory():
    slack = _policy.DEFAULT.peak_slack
    times = {F32: (2.0,) * 3, COST: (1.0,) * 3, RULES: (1.01,) * 3, CONTR: (1.5,) * 3}
    peaks = {F32: 100 * MIB, COST: int(100 * MIB * (1 + 2 * slack)), RULES: 90 * MIB,
             CONTR: 60 * MIB}
    candidate, reason = _policy.pick(_ledger_of(times, peaks), _policy.DEFAULT)
    assert candidate == RULES, reason
    assert reason == "the fastest; over float32's peak, not kept: cost model"
    # within float32's peak, the prediction and rules tie in time: memory decides
    peaks[COST] = 95 * MIB
    assert _policy.pick(_ledger_of(times, peaks), _policy.DEFAULT) == (
        RULES, "it holds least of the candidates within 3% of the fastest (cost model)")
    peaks[RULES] = 96 * MIB  # (within peak_slack of the prediction's: the prediction)
    assert _policy.pick(_ledger_of(times, peaks), _policy.DEFAULT) == (
        COST, "the prediction, the fastest, it holds least of the candidates within 3% of "
        "the fastest (cost model)")
    peaks[RULES] = 90 * MIB
    # with the memory unbounded (TF_MPT_MEMORY=any) the peaks do not bound the pick
    unbounded = dataclasses.replace(_policy.DEFAULT, memory="any")
    assert _policy.pick(_ledger_of(times, peaks), unbounded) == (
        COST, "the prediction, the fastest")


def test_the_resident_bytes_count_in_each_candidates_peak():
    """RESIDENT (the bytes every candidate holds alike) is added to each step peak before the
    shares are compared: 10% more of a small step peak is within the slack of the total."""
    times = {F32: (2.0,) * 3, COST: (1.0,) * 3}
    peaks = {F32: 10 * MIB, COST: 11 * MIB}
    assert _policy.pick(_ledger_of(times, peaks), _policy.DEFAULT)[0] == F32
    assert _policy.pick(_ledger_of(times, peaks, resident=1000 * MIB), _policy.DEFAULT) == (
        COST, "the prediction, the fastest")


def test_memory_least_picks_the_least_held_not_slower_than_float32():
    least = dataclasses.replace(_policy.DEFAULT, memory="least")
    times = {F32: (2.0,) * 3, COST: (1.0,) * 3, CONTR: (1.9,) * 3, RULES: (2.5,) * 3}
    peaks = {F32: 100 * MIB, COST: 90 * MIB, CONTR: 50 * MIB, RULES: 10 * MIB}
    assert _policy.pick(_ledger_of(times, peaks), least) == (
        CONTR, "memory least: it holds least of the candidates not slower than float32")
    priced = dataclasses.replace(least, memory_price=0.3)
    assert _policy.pick(_ledger_of(times, peaks), priced) == (
        RULES, "memory least: it holds least of the candidates not slower than float32 "
        "times 1.3")


def test_only_the_first_rounds_decide_the_pick():
    """A later stage's rounds (a lean version faster than every candidate, another
    candidate timed again slower) do not change what pick reads; the same ledger gives the
    same pick every time."""
    ledger = _ledger_of({F32: (2.0,) * 3, COST: (1.0,) * 3, RULES: (1.5,) * 3})
    first = _policy.pick(ledger, _policy.DEFAULT)
    ledger.record("lean versions", {COST: (3.0,) * 3, _candidates.LEAN: (0.1,) * 3}, {})
    ledger.record("refinement", {RULES: (0.2,) * 3}, {})
    assert _policy.pick(ledger, _policy.DEFAULT) == first == (
        COST, "the prediction, the fastest")
    assert ledger.times(_ledger.FIRST_ROUNDS) == {
        F32: (2.0,) * 3, COST: (1.0,) * 3, RULES: (1.5,) * 3}


def test_the_pick_is_the_policy_method_the_stages_use():
    """Policy.pick (the lean stage's, over a verdict's times) is choose's candidate."""
    times = {F32: (2.0,) * 3, COST: (1.2,) * 3, RULES: (1.0,) * 3}
    for predicted in (F32, COST, RULES):
        assert _policy.DEFAULT.pick(times, predicted) == \
            _policy.DEFAULT.choose(times, predicted)[0] == \
            _policy.pick(_ledger_of(times, predicted=predicted), _policy.DEFAULT)[0]


@pytest.mark.parametrize("source", ["cached", "table"])
def test_a_verdicts_reason_is_stored_and_read_back(source):
    ledger = _ledger_of({F32: (2.0,) * 3, COST: (1.0,) * 3})
    verdict = _verdict.Verdict(COST, COST, ledger=ledger.snapshot(),
                               reason="the prediction, the fastest")
    back = _verdict.Verdict.from_dict(verdict.to_dict(), source)
    assert back.reason == "the prediction, the fastest" and back.source == source
    assert back.times == verdict.times == {F32: (2.0,) * 3, COST: (1.0,) * 3}
