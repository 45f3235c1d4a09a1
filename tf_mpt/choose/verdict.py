"""The verdict for one graph: the pick, why, and where in the ledger its measurements are.

It is what the report holds (RewriteReport.verdict), what the cache stores (to_dict /
from_dict) and what one INFO line prints (describe). Its times and peaks are read from the
ledger it holds (ledger.py, the one place they live): the first rounds' entries, and the
entries it points at for the versions later stages timed (`lean_at`, `refined_at`,
`others_at`; `peaks_at` for a graph too slow to time).
"""

import dataclasses
import functools
import statistics

from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose import ledger as _ledger
from tf_mpt.choose import policy as _policy


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What graph timing found for one graph.

    Attributes:
        pick: the candidate the graph runs as.
        predicted: the candidate the prediction (the cost model, or the op lists) chose.
        why: '' where timed; else why the graph was not timed (it keeps the prediction).
        same_as: {candidate: the candidate whose graph it equals} for candidates not timed
            because their graph was another's.
        source: 'timed' (here, now), 'cached' (here, by an earlier process: nothing timed)
            or 'table' (a cost table file's, `tf-mpt measure --model`: nothing timed).
        ledger: every measurement made for it, in order (ledger.Entry each), whatever was
            kept: what `times`, `peaks`, `beside`, `lean_beside` and `lean_others` read.
        refined: the node names the refinement kept float32 (() where none was tried);
            times[REFINED] its candidate's rounds, timed beside `refined_from`'s (`beside`).
        refined_from: the candidate refined (the pick of the first rounds).
        refined_ops: {op type: nodes kept float32}.
        refined_at: (round, candidate) of the refined version's entry in the ledger; ().
        lean_from: the candidate made lean (LEAN; '' where none was); times[LEAN] its
            rounds, timed beside `lean_against`'s (`lean_beside`).
        lean_against: the candidate the lean one was timed beside (the fastest within
            float32's peak in the first rounds).
        lean_changes: {change: count} (lean.lean).
        lean_at: (round, candidate) of the lean version's entry (its name in that round); ().
        others_at: {label: (round, candidate)} of the other lean versions timed and not
            recorded as LEAN (stages/smaller.py: those of candidates near the pick's time),
            read as `lean_others`.
        peaks_at: {candidate: (round, candidate)}: the peaks of a graph too slow to time
            (stages/untimed.py), measured alone.
        memory_price: TF_MPT_MEMORY_PRICE where the lean pick was kept under it (0: none).
        compiled: the candidates were timed as XLA compiles them (a jit_compile step:
            timers.compiled.time_compiled; no step peaks, nor a refinement, are measured there).
        policy: the Policy it was decided by (policy.Policy; None: the default one), which
            its line reads (what counts as over float32's peak, as slower).
        reason: why the pick was kept, in a few words (policy.pick's, or the stage's that
            changed it); '' where nothing was timed.
    """
    pick: str
    predicted: str
    why: str = ""
    same_as: dict = dataclasses.field(default_factory=dict)
    source: str = "timed"
    ledger: tuple = dataclasses.field(default=(), repr=False)
    refined: tuple = ()
    refined_from: str = ""
    refined_ops: dict = dataclasses.field(default_factory=dict)
    refined_at: tuple = ()
    lean_from: str = ""
    lean_against: str = ""
    lean_changes: dict = dataclasses.field(default_factory=dict)
    lean_at: tuple = ()
    others_at: dict = dataclasses.field(default_factory=dict)
    peaks_at: dict = dataclasses.field(default_factory=dict)
    memory_price: float = 0.0
    compiled: bool = False
    policy: object = dataclasses.field(default=None, compare=False, repr=False)
    reason: str = ""

    # --- what the ledger holds, where the verdict points ----------------------------------

    def _seconds(self, at, name=None):
        """The seconds of the entry `at` ((round, candidate)), or of `name` in that round."""
        entry = _ledger.find(self.ledger, at[0], name or at[1])
        return entry.seconds if entry is not None else ()

    @functools.cached_property
    def times(self):
        """{candidate: (seconds per run, one per round)} of the candidates timed: the first
        rounds' in the order timed, then the refined and lean versions'; {} where nothing
        was timed."""
        times = _ledger.times_of(self.ledger, _ledger.FIRST_ROUNDS)
        for name, at in ((_candidates.REFINED, self.refined_at),
                         (_candidates.LEAN, self.lean_at)):
            seconds = self._seconds(at) if at else ()
            if seconds:
                times[name] = seconds
        return times

    @functools.cached_property
    def peaks(self):
        """{candidate: step peak bytes of a traced run} where measured ({} otherwise), and
        RESIDENT: the first rounds', the refined and lean versions' (or, a graph too slow to
        time, those of `peaks_at` and the lean version's). A candidate over policy.peak_slack
        above float32's is flagged where it is printed."""
        if self.peaks_at:
            peaks = {name: _ledger.find(self.ledger, *at).peak for name, at in
                     self.peaks_at.items()}
            rounds = {at[0] for at in self.peaks_at.values()}
        else:
            peaks = _ledger.peaks_of(self.ledger, _ledger.FIRST_ROUNDS)
            peaks.pop(_ledger.RESIDENT, None)
            rounds = {entry.round for entry in self.ledger
                      if entry.stage == _ledger.FIRST_ROUNDS}
        for name, at in ((_candidates.REFINED, self.refined_at),
                         (_candidates.LEAN, self.lean_at)):
            entry = _ledger.find(self.ledger, *at) if at else None
            if entry is not None and entry.peak is not None:
                peaks[name] = entry.peak
        resident = [entry.peak for entry in self.ledger
                    if entry.candidate == _ledger.RESIDENT and entry.round in rounds]
        if peaks and resident:
            peaks[_ledger.RESIDENT] = resident[0]
        return {name: peak for name, peak in peaks.items() if peak is not None}

    @property
    def beside(self):
        """`refined_from`'s seconds in the refinement's rounds."""
        return self._seconds(self.refined_at, self.refined_from) if self.refined_at else ()

    @property
    def lean_beside(self):
        """`lean_against`'s seconds in the rounds the lean version was timed in."""
        return self._seconds(self.lean_at, self.lean_against) if self.lean_at else ()

    @property
    def lean_others(self):
        """{label: (median seconds, step peak bytes or None)} of the other lean versions
        timed and not recorded as LEAN (`others_at`)."""
        found = {}
        for label, at in self.others_at.items():
            entry = _ledger.find(self.ledger, *at)
            if entry is not None and entry.seconds:
                found[label] = (statistics.median(entry.seconds), entry.peak)
        return found

    @classmethod
    def from_dict(cls, data, source, policy=None):
        """A verdict as `to_dict` wrote it (None where it does not read as one)."""
        try:
            ledger = tuple(_ledger.Entry.from_dict(e) for e in data["ledger"])
            pick, predicted = str(data["pick"]), str(data["predicted"])

            def at(value):
                return () if not value else (int(value[0]), str(value[1]))
            verdict = cls(
                pick, predicted, str(data.get("why", "")), {}, source, ledger,
                tuple(str(n) for n in data.get("refined", ())),
                str(data.get("refined_from", "")),
                {str(k): int(v) for k, v in data.get("refined_ops", {}).items()},
                at(data.get("refined_at")), str(data.get("lean_from", "")),
                str(data.get("lean_against", "")),
                {str(k): int(v) for k, v in data.get("lean_changes", {}).items()},
                at(data.get("lean_at")),
                {str(k): at(v) for k, v in data.get("others_at", {}).items()},
                {str(k): at(v) for k, v in data.get("peaks_at", {}).items()},
                float(data.get("memory_price", 0.0)), bool(data.get("compiled", False)),
                policy, str(data.get("reason", "")))
            times, peaks = verdict.times, verdict.peaks
            if any(_ledger.find(ledger, *a) is None for a in
                   [verdict.refined_at, verdict.lean_at, *verdict.others_at.values(),
                    *verdict.peaks_at.values()] if a):
                return None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            return None
        if not times:  # (a graph too slow to time, its peaks measured instead: decision's
            # memory check; the prediction, float32 or a lean version of the prediction)
            float32, lean = _candidates.FLOAT32, _candidates.LEAN
            if not verdict.why or float32 not in peaks or \
                    not set(peaks) - {float32, _ledger.RESIDENT} or \
                    pick not in (predicted, float32, lean) or (
                    pick == lean and not (verdict.lean_from and lean in peaks and
                                          verdict.lean_changes)):
                return None
            return verdict
        if pick not in times or not all(times.values()) or (
                pick == _candidates.REFINED and
                not (verdict.refined and verdict.refined_from in times and verdict.beside)) or (
                pick == _candidates.LEAN and not (verdict.lean_from in times and
                                                  verdict.lean_beside)):
            return None
        return dataclasses.replace(verdict, why="")

    @property
    def rules(self):
        """The Policy it was decided by (the default one where none was given)."""
        return self.policy or _policy.DEFAULT

    @property
    def timed(self):
        return bool(self.times)

    def median(self, name):
        return statistics.median(self.times[name]) if name in self.times else None

    def describe(self):
        """One line: each candidate's median time and the pick."""
        if not self.timed:
            return self._describe_untimed()
        later = (_candidates.REFINED, _candidates.LEAN)  # (timed beside another, later)
        first = {name: len(t) for name, t in self.times.items() if name not in later}
        dropped = {name for name, n in first.items() if n < max(first.values(), default=0)}
        rounds = min(len(t) for name, t in self.times.items() if name not in dropped)
        where = {"cached": "cached here, ", "table": "from the target's table, "}.get(
            self.source, "")
        # (a cached verdict's come sorted)
        listed = (_candidates.FLOAT32, _candidates.COST, _candidates.RULES,
                  _candidates.CONTRACTIONS, _candidates.CHECKED)
        parts = [f"{name} {self.median(name) * 1e3:.3g} ms" + (
                    f" (over {self.rules.drop_slower:.0%} slower: {first[name]} round"
                    f"{'s' if first[name] > 1 else ''})" if name in dropped else "") +
                 self._peak(name)
                 for name in sorted(self.times, key=lambda n: (
                     listed.index(n) if n in listed else len(listed), n))
                 if name not in later]
        parts += [f"{name} = {other}" for name, other in self.same_as.items()]
        if _candidates.REFINED in self.times:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(self.refined_ops.items()))
            parts.append(f"{_candidates.REFINED} ({ops} float32) "
                         f"{self.median(_candidates.REFINED) * 1e3:.3g} ms"
                         f"{self._peak(_candidates.REFINED)} beside {self.refined_from} "
                         f"{statistics.median(self.beside) * 1e3:.3g} ms")
        if _candidates.LEAN in self.times:
            changes = ", ".join(f"{change} x{n}" for change, n in
                                sorted(self.lean_changes.items()) if n)
            parts.append(f"{_candidates.LEAN} {self.lean_from} ({changes}) "
                         f"{self.median(_candidates.LEAN) * 1e3:.3g} ms"
                         f"{self._peak(_candidates.LEAN)} beside {self.lean_against} "
                         f"{statistics.median(self.lean_beside) * 1e3:.3g} ms")
        for name, (median, peak) in self.lean_others.items():
            mark = ": over float32's" if peak is not None and self.rules.over_float32(
                {**self.peaks, _candidates.LEAN: peak}, _candidates.LEAN) else ""
            held = "" if peak is None else f" (peak {peak / 2**20:.1f} MiB{mark})"
            parts.append(f"{_candidates.LEAN} {name} {median * 1e3:.3g} ms{held}, not kept")
        base = self.median(_candidates.FLOAT32)
        speed = (f", {base / self.median(self.pick):.2f}x float32" if base and
                 self.pick not in (_candidates.FLOAT32,) + later else "")
        if base and self.pick == _candidates.LEAN:
            ratio = (base / self.median(self.lean_against) *
                     statistics.median(self.lean_beside) / self.median(_candidates.LEAN))
            speed = f", {ratio:.2f}x float32"
            slower = self.median(_candidates.LEAN) / statistics.median(self.lean_beside) - 1.0
            if slower > self.rules.margin and _candidates.FLOAT32 in self.peaks and \
                    _candidates.LEAN in self.peaks:
                share = (_policy.total_peak(self.peaks, _candidates.LEAN) /
                         _policy.total_peak(self.peaks, _candidates.FLOAT32))
                price = (f": TF_MPT_MEMORY_PRICE={self.memory_price:g}"
                         if self.memory_price and ratio < 1.0 else "")
                speed += (f" ({slower:.0%} slower than {self.lean_against}, holding "
                          f"{share:.2f}x float32's peak{price})")
        # (two ratios, each measured in one set of rounds)
        if base and self.pick == _candidates.REFINED:
            ratio = (base / self.median(self.refined_from) *
                     statistics.median(self.beside) / self.median(_candidates.REFINED))
            speed = f", {ratio:.2f}x float32"
        predicted = self.same_as.get(self.predicted, self.predicted)
        over = sorted(name for name in self.times if self.rules.over_float32(self.peaks, name) and
                      self.median(name) < (self.median(self.pick) or 0))
        held = (f" (faster but over float32's peak: {', '.join(over)})" if over else "")
        how = ", compiled by XLA as the step runs" if self.compiled else ""
        return (f"graph timing ({where}median of {rounds} rounds{how}): {', '.join(parts)}; "
                f"picked {self.pick}{speed}" + ("" if self.pick == predicted else
                                                f" over the prediction ({self.predicted})") + held)

    def _describe_untimed(self):
        """The line of a verdict not timed: why, and where its peaks were measured instead
        (decision's memory check of a graph too slow to time), what they were and what was
        kept."""
        text = f"graph not timed ({self.why})"
        if not any(name in self.peaks for name in (_candidates.FLOAT32, self.predicted)):
            return f"{text}: kept the prediction ({self.predicted})"
        parts = [f"{name}{self._peak(name)}" for name in (_candidates.FLOAT32, self.predicted)
                 if name in self.peaks]
        if _candidates.LEAN in self.peaks:
            changes = ", ".join(f"{change} x{n}" for change, n in
                                sorted(self.lean_changes.items()) if n)
            parts.append(f"{_candidates.LEAN} {self.lean_from} ({changes})"
                         f"{self._peak(_candidates.LEAN)}")
        kept = {_candidates.FLOAT32: "float32",
                _candidates.LEAN: f"{_candidates.LEAN} {self.lean_from}"}.get(
            self.pick, f"the prediction ({self.predicted})")
        where = "cached here: " if self.source == "cached" else ""
        return (f"{text}; {where}its peaks measured instead (one traced run each): "
                f"{', '.join(parts)}; kept {kept}, "
                + ("the only one within float32's peak" if self.pick == _candidates.FLOAT32 else
                   "within float32's peak") + " (its speed not measured)")

    def _peak(self, name):
        """' (peak 12.3 MiB)' where `name`'s step peak was measured, ' (peak 12.3 MiB: over
        float32's)' where it is over float32's by more than policy.peak_slack."""
        if name not in self.peaks:
            return ""
        over = "" if name == _candidates.FLOAT32 or \
            not self.rules.over_float32(self.peaks, name) else ": over float32's"
        return f" (peak {self.peaks[name] / 2**20:.1f} MiB{over})"

    def to_dict(self):
        """The record the cache stores: what from_dict reads (the ledger and where the
        verdict points in it), and the times, peaks and other versions read from it (for a
        reader of inspect --json)."""
        def at(value):
            return list(value) if value else []
        return {"pick": self.pick, "predicted": self.predicted, "why": self.why,
                "same_as": dict(self.same_as), "source": self.source,
                "ledger": [dataclasses.asdict(entry) for entry in self.ledger],
                "refined": list(self.refined), "refined_from": self.refined_from,
                "refined_ops": dict(self.refined_ops), "refined_at": at(self.refined_at),
                "lean_from": self.lean_from, "lean_against": self.lean_against,
                "lean_changes": dict(self.lean_changes), "lean_at": at(self.lean_at),
                "others_at": {k: at(v) for k, v in self.others_at.items()},
                "peaks_at": {k: at(v) for k, v in self.peaks_at.items()},
                "memory_price": self.memory_price, "compiled": self.compiled,
                "reason": self.reason,
                # (read from the ledger: not read back)
                "times": {k: list(v) for k, v in self.times.items()},
                "peaks": dict(self.peaks), "beside": list(self.beside),
                "lean_beside": list(self.lean_beside),
                "lean_others": {k: list(v) for k, v in self.lean_others.items()}}
