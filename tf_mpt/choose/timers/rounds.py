"""The rounds: candidates run one after another, the order rotating, until the budget is
spent, policy.max_rounds, or a clear winner; a candidate far slower than the fastest dropped."""

import logging
import statistics
import time

from tf_mpt._process import state as _state
from tf_mpt.choose import policy as _policy
from tf_mpt.choose.timers import safety as _safety

_log = logging.getLogger("tf_mpt.rewrite")

# What the timing loop reads (tests put an injected clock and sandbox here: a verdict never
# comes from the test machine's clock).
_clock = time.perf_counter


def rounds(runners, budget_seconds, clock=None, policy=None):
    """Times {candidate: run()}: one warm-up run each (Grappler, kernel set-up), then rounds
    of one run each, the order rotating, until the budget is spent, policy.max_rounds, or a clear
    winner. Where policy.min_rounds rounds would not fit in the budget, the candidates over
    policy.drop_slower slower than the fastest in every round so far run no more (their times stay,
    fewer); TooSlow (a NotTimed) where the others' still would not fit. Returns {candidate:
    (seconds per run, ...)}; NotTimed where a run fails."""
    policy = policy or _policy.DEFAULT
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    clock = clock or _clock
    try:
        first_runs(runners, clock=clock)  # (the warm-up)
        times = {name: [] for name in runners}
        order, start = list(runners), clock()
        for index in range(policy.max_rounds):
            for name in order:
                began = clock()
                runners[name]()
                times[name].append(clock() - began)
            order = order[1:] + order[:1]
            spent = clock() - start
            left = policy.min_rounds - index - 1
            if left > 0 and spent + left * _round_seconds(times, order) > budget_seconds:
                racing = _racing(times, order, policy.drop_slower)
                if len(racing) == len(order) or \
                        spent + left * _round_seconds(times, racing) > budget_seconds:
                    raise _safety.TooSlow(
                        f"one round of the {len(order)} candidates takes "
                        f"{_round_seconds(times, order):.1f} s: {policy.min_rounds} rounds do "
                        f"not fit in the {budget_seconds:.3g} s the rounds may spend of the "
                        "budget (TF_MPT_TIMING_BUDGET)")
                _log.debug("graph timing: %s over %.0f%% slower than the fastest, run no more "
                           "rounds", ", ".join(n for n in order if n not in racing),
                           policy.drop_slower * 100)
                order = racing
            if spent > budget_seconds or \
                    policy.clear_winner({name: times[name] for name in order}):
                break
            if _state.STATE.deferred_signals:  # (a rewrite inside Session.run defers them)
                raise _safety.NotTimed("a signal arrived: it is handled when the run returns, "
                                       "and the timing stops")
    except tf.errors.OpError as error:
        raise _safety.NotTimed(
            f"a run on made-up inputs failed ({_safety.first_line(error)})") from None
    return {name: tuple(t) for name, t in times.items()}


def first_runs(runners, budget_seconds=0.0, clock=None):
    """Runs each of {candidate: run()} once (its first run: Grappler, kernel set-up) and
    returns {candidate: (its seconds,)}: no timing (a first run says little of the speed);
    `rounds`' warm-up, and what a traced run's peak needs before it (decision's memory check
    of a graph too slow to time). NotTimed where a run fails."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    del budget_seconds  # (one run each, whatever the budget)
    clock = clock or _clock
    found = {}
    try:
        for name, run in runners.items():
            began = clock()
            run()
            found[name] = (clock() - began,)
            _log.debug("graph timing: %s's warm-up run took %.2f s", name, found[name][0])
    except tf.errors.OpError as error:
        raise _safety.NotTimed(
            f"a run on made-up inputs failed ({_safety.first_line(error)})") from None
    return found


def _round_seconds(times, order):
    """The seconds a round of the candidates `order` takes: the sum of their mean runs."""
    return sum(statistics.mean(times[name]) for name in order)


def _racing(times, order, drop_slower):
    """The candidates of `order` not slower than the fastest by over policy.drop_slower in every
    round so far (their order kept)."""
    rounds_run = min(len(times[name]) for name in order)
    fastest = [min(times[name][k] for name in order) for k in range(rounds_run)]
    return [name for name in order
            if not all(times[name][k] > fastest[k] * (1.0 + drop_slower)
                       for k in range(rounds_run))]
