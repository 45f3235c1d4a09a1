"""The Ledger: every measurement of one decision, in the order made, append-only; the one place
times and peaks live once measured (a Timer hands them over, measure() records them). A
verdict points into it (verdict.py: its times, peaks and the rounds each later version was
timed beside are read from the entries it points at).

    Entry         (stage, candidate, seconds per round, step peak bytes, round): one
                  candidate timed (or, a graph too slow to time, its peak alone) in one call
                  of a timer, `round` (0, 1, ...: the calls in order); a candidate is named
                  as that call named it
    RESIDENT      the bytes every candidate holds alike (its variables, an optimizer's slots,
                  its inputs), added to each step peak where compared (peaks[RESIDENT]);
                  recorded as an entry of its own, candidate RESIDENT, no seconds
    Budget        seconds of timed runs left of TF_MPT_TIMING_BUDGET, each stage's spent
"""

import dataclasses
import typing

from tf_mpt.choose import candidates as _candidates

# peaks[RESIDENT] (the timers'): the bytes every candidate holds alike across its steps (its
# variables, the optimizer's slots, its inputs)
RESIDENT = "(resident)"
# The stage whose times the pick is made from (policy.pick)
FIRST_ROUNDS = "first rounds"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One measurement: `candidate` (its name in that call) timed by `stage` in call `round`."""
    stage: str
    candidate: str
    seconds: tuple  # per round; () where only its peak was measured
    peak: typing.Optional[int] = None  # the step peak of one traced run, bytes
    round: int = 0

    @classmethod
    def from_dict(cls, data):
        """An entry as dataclasses.asdict wrote it (KeyError, TypeError, ValueError where it
        does not read as one)."""
        return cls(str(data["stage"]), str(data["candidate"]),
                   tuple(float(t) for t in data["seconds"]),
                   None if data["peak"] is None else int(data["peak"]), int(data["round"]))


class Ledger:
    """The measurements of one decision (see the module's docstring)."""

    def __init__(self, predicted=""):
        self.entries = []
        self.rounds = 0  # the timer calls recorded
        self.predicted = predicted  # the candidate the prediction's graph is timed as

    def record(self, stage, times, peaks):
        """Appends what one call of a timer measured: {candidate: seconds per round} and
        {candidate: peak bytes} (and RESIDENT) of the candidates it ran, as a new round;
        returns its number."""
        at = self.rounds
        self.rounds += 1
        for name in list(times) + [n for n in peaks if n not in times]:
            self.entries.append(Entry(stage, name, tuple(times.get(name, ())),
                                      peaks.get(name), at))
        return at

    def times(self, stage):
        """{candidate: seconds per round} measured by `stage` (its latest where it measured
        one more than once), in the order measured."""
        return times_of(self.entries, stage)

    def peaks(self, stage=None, at=None):
        """{candidate: its measured peak} and RESIDENT, of `stage`'s entries (None: every
        stage's) in round `at` (None: every round), the latest where measured more than
        once."""
        return peaks_of(self.entries, stage, at)

    def snapshot(self):
        """The entries so far (a tuple: what a verdict holds)."""
        return tuple(self.entries)


def times_of(entries, stage):
    """Ledger.times of `entries`."""
    return {entry.candidate: entry.seconds for entry in entries
            if entry.stage == stage and entry.seconds}


def peaks_of(entries, stage=None, at=None):
    """Ledger.peaks of `entries`."""
    return {entry.candidate: entry.peak for entry in entries
            if entry.peak is not None and (stage is None or entry.stage == stage) and
            (at is None or entry.round == at)}


def find(entries, at, candidate):
    """The entry of `candidate` in round `at` of `entries`, or None."""
    return next((entry for entry in entries
                 if entry.round == at and entry.candidate == candidate), None)


def measure(choice, stage, graphs, budget_seconds):
    """({candidate: seconds per round}, its round in the ledger) of `graphs` ({candidate:
    GraphDef}) timed by `choice.timer` within `budget_seconds`, spent from `choice.budget`
    and recorded in `choice.ledger` with their peaks, under `stage`."""
    timer = choice.timer
    times = choice.budget.spend(timer.time(graphs, budget_seconds, choice.policy))
    return times, choice.ledger.record(stage, times, _measured_peaks(timer, graphs))


def measure_peaks(choice, stage, graphs):
    """({candidate: peak}, its round) of `graphs` measured alone (one first run and one
    traced run each: a graph too slow to time), recorded in `choice.ledger` under `stage`."""
    choice.timer.peaks_only(graphs, choice.policy)
    peaks = _measured_peaks(choice.timer, graphs)
    return peaks, choice.ledger.record(stage, {}, peaks)


def _measured_peaks(timer, graphs):
    """The peaks `timer` just measured of `graphs`' candidates, and RESIDENT."""
    return {name: peak for name, peak in timer.peaks.items()
            if name in graphs or name == RESIDENT}


def peaks_after(choice, verdict, at, names=()):
    """The peaks after a later stage's round `at`: the verdict's (the pick was made with
    them; a candidate timed again in that round does not change them), with that round's
    peaks of the new versions (LEAN, REFINED and `names`: a stage's versions) and
    RESIDENT."""
    peaks = dict(verdict.peaks)
    new = set(names) | {_candidates.LEAN, _candidates.REFINED, RESIDENT}
    peaks.update((name, peak) for name, peak in choice.ledger.peaks(at=at).items()
                 if name in new)
    return peaks


class Budget:
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
