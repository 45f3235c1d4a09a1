"""The Policy: every threshold the choosing step decides by, and the user's settings it reads,
in one value built once from the Config; the rules that read them are its methods.

    the pick          pick: the fastest median, the prediction kept within `margin`, a
                      candidate over float32's peak (over_float32, `peak_slack`) not kept
                      where the memory is bounded, a tie in time going to memory
    the rounds        `min_rounds`, `max_rounds`, clear_winner, `drop_slower`; the first
                      rounds spend `first_share` of the budget
    the refinement    slower_ops (`slower`, `floor_seconds`), tried while `refine_share` of
                      the budget is left
    memory            `smaller_above`, `smaller_window`, `half_memory_price`; TF_MPT_MEMORY's
                      mode and price (bounded, least, price, memory_key)
    a traced step     `thin`, `elementwise_share`, `kept_share` (when.py)
    lean versions     `late_levels`, `min_saved_elements` (transforms/saving.py, reduce.py)
    a sandbox         `max_copy_bytes`, `run_timeout_ms`, `step_budget` (timers/)

Nothing here measures: the rules read times and peaks already measured.
"""

import dataclasses
import statistics

from tf_mpt import config as _config
from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose import ledger as _ledger


@dataclasses.dataclass(frozen=True)
class Policy:
    """What a decision is made by (see the module's docstring); DEFAULT holds the defaults.

    Attributes (the user's, from the Config):
        budget: TF_MPT_TIMING_BUDGET, seconds of timed runs for one graph (0: none timed).
        memory: TF_MPT_MEMORY, 'float32' (a pick holds no more than float32), 'least' or
            'any'.
        memory_price: TF_MPT_MEMORY_PRICE as set (`price`: as it applies).
        step_timing: TF_MPT_STEP_TIMING, 'auto', 'always' or 'off'.
        batch: TF_MPT_COST_BATCH, an unknown leading dimension of a made-up input.
    """
    budget: float = _config.DEFAULT_TIMING_BUDGET
    memory: str = "float32"
    memory_price: float = 0.0
    step_timing: str = "auto"
    batch: int = _config.DEFAULT_COST_BATCH
    # The first rounds and the pick: another candidate must be `margin` faster than the
    # prediction's to win
    margin: float = 0.03
    # a candidate whose measured peak is over float32's by more than this share is not kept
    # where the memory is bounded (TF_MPT_MEMORY=float32, least) and is flagged in the verdict
    peak_slack: float = 0.02
    min_rounds: int = 3
    max_rounds: int = 15
    # Where `min_rounds` rounds of every candidate would not fit in the budget, a candidate
    # slower than the fastest by over this share in every round so far runs no more rounds
    # (it cannot win), and the others' rounds are timed if they fit: ResNet50's fit step at
    # batch 64 (7.2 s a round: float32 2.1 s against the op lists' 1.5 s) did not fit in the
    # default budget with float32 and fits without it.
    drop_slower: float = 0.2
    # The budget counts timed runs, each stage's own set-up apart (a sandbox, a new
    # candidate's import and warm-up run, the traced runs of its peak): the first rounds may
    # spend this share of it, the later stages (a lean version, a smaller one, a refinement)
    # what is left. ResNet50's fit step spent ~36 s setting up its four candidates (~23 s now)
    # and ~2.2 s per round: a budget that counted set-up left its lean version no time.
    first_share: float = 0.6
    # the rounds of a traced step's sandbox where its caller gives no budget
    step_budget: float = 20.0
    # The refinement: an op type goes float32 where its half nodes' summed time in the pick's
    # per-node profile is over (1 + slower) times the same nodes' float32 time, by
    # `floor_seconds` at least; it is tried only while `refine_share` of the budget is left.
    slower: float = 0.1
    floor_seconds: float = 5e-6
    profile_runs: int = 3
    refine_share: float = 1.0 / 3.0
    # Memory, the smaller versions: a pick holding more than this share of float32's peak
    # (step peak and resident bytes) has its lean version timed beside it (stages/smaller.py):
    # mixed precision's "half the memory" where activations dominate, short of the weights
    # and inputs every candidate holds in float32.
    smaller_above: float = 0.65
    # make_smaller also makes lean the other half candidates within this share of the pick's
    # time: a colouring a little slower than the pick may hold much less made lean, and run
    # as fast (its half Casts made at each use)
    smaller_window: float = 0.15
    # Where no lean version within `margin` of the pick's time reaches `smaller_above` of
    # float32's peak, the fastest that does is kept if it is at most this share slower than
    # the pick and still over `margin` faster than float32: on Sapphire Rapids a Cast to half
    # and back costs ~0.9 ms per 4M elements each way, as much as any element-wise op, so a
    # Keras Transformer's fit step holding its Gelu intermediates in half (0.59x float32's
    # step peak against the pick's 0.92x) ran 7% slower than the pick (184 ms against 172;
    # float32 273 ms).
    half_memory_price: float = 0.10
    # A traced step, TF_MPT_STEP_TIMING=auto: timed where the predicted saving is below this
    # share of the kernel and Cast times it adds up
    thin: float = 0.3
    # also where half kernels other than matrix products and convolutions account for more
    # than this share of the predicted saving (report.predicted_elementwise). Such a kernel's
    # time is read from its op's line, probed alone at a few sizes; in a graph it may run
    # several times slower than the probe said (Sapphire Rapids: a table whose bfloat16 Mul,
    # AddV2 and Sub probed 1.3-1.5x faster at 1 M elements left MobileNetV2's Keras predict
    # step untimed, its saving all element-wise, and it ran at 0.80x float32)
    elementwise_share: float = 0.2
    # memory bounded (TF_MPT_MEMORY=float32): also a step that computes gradients where the
    # cost model kept at least this share of the nodes it weighed float32 (values the
    # backward pass reads may then be held in float32: what it holds is measured)
    kept_share: float = 0.1
    # The lean versions' saved in half (transforms/saving.py): a reader is late where one of
    # its inputs is this many ops (longest path from the graph's sources) deeper than the
    # value it reads (a forward reader is within a few) ...
    late_levels: int = 16
    # ... and values of fewer elements than this (an unknown dimension counted as 1: a
    # reduction's [batch, 1] result, a bias) or of unknown rank are not worth their two Casts
    # (nor, transforms/reduce.py, a reduction's result this small or larger is moved first)
    min_saved_elements: int = 1 << 14
    # A sandbox (timers/): the bytes of variables and inputs it may copy, and how long one
    # run may take (a warm-up includes Grappler's optimisation): a loop that made-up inputs
    # never end stops there, and the graph is not timed
    max_copy_bytes: int = 1 << 30
    run_timeout_ms: int = 30_000

    @classmethod
    def from_config(cls, config):
        """The policy of a decision made with `config` (a tf_mpt.config.Config)."""
        return cls(budget=config.timing_budget, memory=config.memory,
                   memory_price=config.memory_price, step_timing=config.step_timing,
                   batch=config.cost_batch)

    @property
    def bounded(self):
        """Whether the pick is bounded by memory (TF_MPT_MEMORY=float32 or least)."""
        return self.memory in ("float32", "least")

    @property
    def least(self):
        """Whether the pick is the candidate holding least of those not slower than float32
        (TF_MPT_MEMORY=least)."""
        return self.memory == "least"

    @property
    def price(self):
        """The share of float32's speed a timed graph may give up for memory
        (TF_MPT_MEMORY_PRICE; 0 where nothing is bounded: TF_MPT_MEMORY=any)."""
        return self.memory_price if self.bounded else 0.0

    def bounded_peaks(self, peaks):
        """`peaks` where the pick is bounded by them, else None."""
        return peaks if self.bounded else None

    def memory_key(self):
        """What bounds a pick's memory, as a verdict's cache key reads it: TF_MPT_MEMORY's
        mode, with TF_MPT_MEMORY_PRICE where one is set."""
        return f"{self.memory} price {self.price:g}" if self.price else self.memory

    def over_float32(self, peaks, name):
        """Whether candidate `name`'s measured peak (total_peak) is over `peak_slack` above
        float32's."""
        return _candidates.FLOAT32 in peaks and name in peaks and \
            total_peak(peaks, name) > \
            total_peak(peaks, _candidates.FLOAT32) * (1.0 + self.peak_slack)

    def pick(self, times, predicted, peaks=None):
        """The candidate `choose` keeps, without its reason."""
        return self.choose(times, predicted, peaks)[0]

    def choose(self, times, predicted, peaks=None):
        """(candidate, reason): the candidate to keep from {candidate: per-round seconds},
        and why, in a few words. It is the fastest median,
        unless the prediction's is within `margin` of it. With `peaks` ({candidate: step peak
        bytes}, and RESIDENT: the peaks the pick is bounded by): only among the candidates
        not over float32's (over_float32; float32 never is), and among those within `margin`
        of the fastest, the ones holding least (within `peak_slack` of the lowest total)
        first: a tie in time goes to memory. With `least` (TF_MPT_MEMORY=least) and peaks:
        among the candidates not slower than float32 (their median not above float32's
        times one plus `price`), the one holding least (within `peak_slack`: the fastest)."""
        medians = {name: statistics.median(t) for name, t in times.items()
                   if not (peaks and self.over_float32(peaks, name))}
        over = sorted(set(times) - set(medians))
        held = f"; over float32's peak, not kept: {', '.join(over)}" if over else ""
        if self.least and peaks and _candidates.FLOAT32 in medians and \
                set(medians) <= set(peaks):
            fast_enough = [name for name, m in medians.items()
                           if m <= medians[_candidates.FLOAT32] * (1.0 + self.price)]
            fewest = min(total_peak(peaks, name) for name in fast_enough)
            chosen = min((name for name in fast_enough
                          if total_peak(peaks, name) <= fewest * (1.0 + self.peak_slack)),
                         key=medians.get)
            bound = f" times {1.0 + self.price:g}" if self.price else ""
            return chosen, (f"memory least: it holds least of the candidates not slower than "
                            f"float32{bound}" + held)
        fastest = min(medians, key=medians.get)
        near = {name for name, m in medians.items()
                if m <= medians[fastest] * (1.0 + self.margin)}
        within = f"within {self.margin:.0%} of the fastest ({fastest})"
        if peaks and near <= set(peaks):
            least = min(total_peak(peaks, name) for name in near)
            fewest = {name for name in near
                      if total_peak(peaks, name) <= least * (1.0 + self.peak_slack)}
            chosen = predicted if predicted in fewest else min(fewest, key=medians.get)
            which = "the prediction, " if chosen == predicted else ""
            if len(near) == 1:
                return chosen, (f"{which}the fastest" if which or predicted not in medians else
                                f"the fastest, over {self.margin:.0%} faster than the "
                                "prediction") + held
            return chosen, (f"{which}{'the fastest, ' if chosen == fastest else ''}it holds "
                            f"least of the candidates {within}" + held)
        if predicted in medians and medians[predicted] <= medians[fastest] * (1.0 + self.margin):
            return predicted, ("the prediction, the fastest" if predicted == fastest else
                               f"the prediction, {within}") + held
        return fastest, (f"the fastest, over {self.margin:.0%} faster than the prediction"
                         if predicted in medians else "the fastest") + held

    def clear_winner(self, times):
        """After `min_rounds`: the fastest median's slowest run is below every other
        candidate's fastest run (more rounds would not change the pick)."""
        if len(times) < 2 or min(len(t) for t in times.values()) < self.min_rounds:
            return False
        medians = {name: statistics.median(t) for name, t in times.items()}
        best = min(medians, key=medians.get)
        return all(max(times[best]) < min(t) for name, t in times.items() if name != best)

    def slower_ops(self, half_profile, float32_profile, half_nodes):
        """{op type: (half seconds, float32 seconds, node names)} for the op types whose half
        nodes (`half_nodes`: {node name: op type}, the converted nodes of a candidate) took
        more than (1 + `slower`) times their float32 time in the profiles ({node name:
        seconds}), by at least `floor_seconds`. Nodes absent from either profile (fused into
        another kernel) are not counted."""
        sums = {}
        for name, op in half_nodes.items():
            if name in half_profile and name in float32_profile:
                half, single, names = sums.get(op, (0.0, 0.0, ()))
                sums[op] = (half + half_profile[name], single + float32_profile[name],
                            names + (name,))
        return {op: (half, single, tuple(sorted(names)))
                for op, (half, single, names) in sorted(sums.items())
                if half > single * (1.0 + self.slower) and half - single >= self.floor_seconds}


DEFAULT = Policy()


def pick(ledger, policy):
    """(candidate, reason): the pick of a decision's first rounds as `policy` makes it
    (Policy.choose), read from `ledger` alone (a ledger.Ledger: the first rounds' times,
    every peak measured and the candidate the prediction is timed as), bounded by the peaks
    where the memory is (Policy.bounded_peaks)."""
    return policy.choose(ledger.times(_ledger.FIRST_ROUNDS), ledger.predicted,
                         policy.bounded_peaks(ledger.peaks(_ledger.FIRST_ROUNDS)))


def total_peak(peaks, name):
    """Candidate `name`'s measured peak: its step peak plus peaks[RESIDENT], the bytes every
    candidate holds alike."""
    return peaks[name] + peaks.get(_ledger.RESIDENT, 0)
