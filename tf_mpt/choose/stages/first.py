"""The first rounds: every candidate whose graph differs timed side by side within the first
rounds' share of the budget, their peaks measured, and the policy's pick."""

from tf_mpt.choose import ledger as _ledger
from tf_mpt.choose import policy as _policy
from tf_mpt.choose import verdict as _verdict
from tf_mpt.choose.timers import safety as _safety


def first_rounds(choice):
    """The verdict of the first rounds: each of `choice.graphs` timed within
    policy.first_share of the budget (the rest is the later stages'), the pick the policy's
    (bounded by the measured peaks where the memory is). NotTimed where every candidate is
    the float32 graph, or where they cannot be timed (TooSlow: their rounds do not fit)."""
    if len(choice.graphs) == 1:
        raise _safety.NotTimed("every candidate is the float32 graph")
    policy, timer = choice.policy, choice.timer
    choice.budget = _ledger.Budget(policy.budget)
    choice.ledger.predicted = choice.predicted_graph
    _, at = _ledger.measure(choice, _ledger.FIRST_ROUNDS, choice.graphs,
                            policy.first_share * policy.budget)
    chosen, reason = _policy.pick(choice.ledger, policy)
    choice.bounded = bool(policy.bounded_peaks(choice.ledger.peaks(at=at))) and \
        choice.budget.left() > 0
    return _verdict.Verdict(chosen, choice.predicted_name, "", choice.same_as,
                            ledger=choice.ledger.snapshot(), compiled=timer.compiled,
                            policy=policy, reason=reason)
