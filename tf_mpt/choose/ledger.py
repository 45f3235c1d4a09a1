"""What was measured: the names of the measurements beside the candidates', and the budget.

    RESIDENT      peaks[RESIDENT]: the bytes every candidate holds alike (its variables, an
                  optimizer's slots, its inputs), added to each step peak where compared
    Budget        seconds of timed runs left of TF_MPT_TIMING_BUDGET, each stage's spent
    peaks_after   the peaks after a later stage's rounds: the verdict's own, the new
                  version's added
"""

from tf_mpt.choose import candidates as _candidates


# peaks[RESIDENT] (time_versions, timers.graphs.time_candidates): the bytes every candidate
# holds alike across its steps (its variables, the optimizer's slots, its inputs)
RESIDENT = "(resident)"


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


def peaks_after(timer, verdict):
    """The peaks after another round of timing: the verdict's stand (the pick was made with
    them; a candidate timed again does not change them), the new version's (refined, lean:
    the last timed) added."""
    peaks = dict(timer.peaks)
    peaks.update((name, peak) for name, peak in verdict.peaks.items()
                 if name not in (_candidates.LEAN, _candidates.REFINED))
    return peaks
