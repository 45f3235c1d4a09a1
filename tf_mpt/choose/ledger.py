"""The Ledger: every measurement of one decision, in the order made, append-only; the one place
times and peaks live once measured (a Timer hands them over, measure() records them).

    Entry         (stage, candidate, seconds per round, step peak bytes): one candidate
                  timed (or, a graph too slow to time, its peak alone) in one stage's rounds
    RESIDENT      the bytes every candidate holds alike (its variables, an optimizer's slots,
                  its inputs), added to each step peak where compared (peaks()[RESIDENT]);
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
    """One measurement: `candidate` (its name in that stage's rounds) timed by `stage`."""
    stage: str
    candidate: str
    seconds: tuple  # per round; () where only its peak was measured
    peak: typing.Optional[int] = None  # the step peak of one traced run, bytes


class Ledger:
    """The measurements of one decision (see the module's docstring)."""

    def __init__(self, predicted=""):
        self.entries = []
        self.predicted = predicted  # the candidate the prediction's graph is timed as

    def record(self, stage, times, peaks):
        """Appends what one call of a timer measured: {candidate: seconds per round} and
        {candidate: peak bytes} (and RESIDENT) of the candidates it ran."""
        for name in list(times) + [n for n in peaks if n not in times]:
            self.entries.append(Entry(stage, name, tuple(times.get(name, ())),
                                      peaks.get(name)))

    def relabel(self, stage, kept, name):
        """Records stage's candidate `kept` again as `name` (a smaller version kept as the
        lean one: the same measurement)."""
        entry = next(e for e in reversed(self.entries) if e.stage == stage and
                     e.candidate == kept)
        self.entries.append(dataclasses.replace(entry, candidate=name))

    def times(self, stage):
        """{candidate: seconds per round} measured by `stage` (its latest where it measured
        one more than once), in the order measured."""
        return {entry.candidate: entry.seconds for entry in self.entries
                if entry.stage == stage and entry.seconds}

    def peaks(self, names=None):
        """{candidate: its latest measured peak} (of `names` only, where given) and
        RESIDENT (the latest) where measured."""
        found = {}
        for entry in self.entries:
            if entry.peak is not None and (names is None or entry.candidate in names or
                                           entry.candidate == RESIDENT):
                found[entry.candidate] = entry.peak
        return found

    def to_list(self):
        return [dataclasses.asdict(entry) for entry in self.entries]


def measure(choice, stage, graphs, budget_seconds):
    """{candidate: seconds per round} of `graphs` ({candidate: GraphDef}) timed by
    `choice.timer` within `budget_seconds`, spent from `choice.budget` and recorded in
    `choice.ledger` with their peaks, under `stage`."""
    timer = choice.timer
    times = choice.budget.spend(timer.time(graphs, budget_seconds, choice.policy))
    choice.ledger.record(stage, times, _measured_peaks(timer, graphs))
    return times


def measure_peaks(choice, stage, graphs):
    """The peaks of `graphs` measured alone (one first run and one traced run each: a graph
    too slow to time), recorded in `choice.ledger` under `stage`; returns them."""
    choice.timer.peaks_only(graphs, choice.policy)
    peaks = _measured_peaks(choice.timer, graphs)
    choice.ledger.record(stage, {}, peaks)
    return peaks


def _measured_peaks(timer, graphs):
    """The peaks `timer` just measured of `graphs`' candidates, and RESIDENT."""
    return {name: peak for name, peak in timer.peaks.items()
            if name in graphs or name == RESIDENT}


def peaks_after(choice, verdict, also=()):
    """The peaks after a later stage's rounds: the verdict's stand (the pick was made with
    them; a candidate timed again does not change them), the new version's (refined, lean:
    the last measured) added; of the candidates the verdict timed, the lean and refined
    ones, those named in `also` (a stage's versions), and RESIDENT."""
    names = set(verdict.times) | {_candidates.LEAN, _candidates.REFINED} | set(also)
    peaks = choice.ledger.peaks(names)
    peaks.update((name, peak) for name, peak in verdict.peaks.items()
                 if name not in (_candidates.LEAN, _candidates.REFINED))
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
