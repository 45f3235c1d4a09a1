"""Every threshold the choosing step decides by, and the rules that read them.

    the pick          pick: the fastest median, the prediction kept within MARGIN, a
                      candidate over float32's peak (over_float32, PEAK_SLACK) not kept
                      where the memory is bounded, a tie in time going to memory
    the rounds        MIN_ROUNDS, MAX_ROUNDS, clear_winner, DROP_SLOWER, FIRST_SHARE of the
                      budget for the first rounds
    the refinement    slower_ops (SLOWER, FLOOR_SECONDS), tried while REFINE_SHARE is left
    memory            SMALLER_ABOVE, SMALLER_WINDOW, HALF_MEMORY_PRICE; TF_MPT_MEMORY's mode
                      and price as the config gives them (bounded_peaks, holds_least,
                      memory_price, memory_key)
    a traced step     THIN, ELEMENTWISE_SHARE, KEPT_SHARE (when.py)

Nothing here measures: the rules read times and peaks already measured.
"""

import statistics

from tf_mpt import targets as _targets
from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose import ledger as _ledger

# The first rounds and the pick
MARGIN = 0.03  # another candidate must be this much faster than the prediction's to win
# Memory: a candidate whose measured step peak is over float32's by more than
# this share is not kept (TF_MPT_MEMORY=float32) and is flagged in the verdict.
PEAK_SLACK = 0.02
MIN_ROUNDS = 3
MAX_ROUNDS = 15
# Where MIN_ROUNDS rounds of every candidate would not fit in the budget, a candidate slower
# than the fastest by over this share in every round so far runs no more rounds (it cannot
# win), and the others' rounds are timed if they fit: ResNet50's fit step at batch 64 (7.2 s
# a round: float32 2.1 s against the op lists' 1.5 s) did not fit in the default budget with
# float32 and fits without it.
DROP_SLOWER = 0.2
# The budget (TF_MPT_TIMING_BUDGET) counts timed runs, each stage's own set-up apart (a
# sandbox, a new candidate's import and warm-up run, the traced runs of its peak): the first
# rounds may spend this share of it, the later stages (a lean version, a smaller one, a
# refinement) what is left. ResNet50's fit step spent ~36 s setting up its four candidates
# (~23 s now) and ~2.2 s per round: a budget that counted set-up left its lean version no
# time at all.
FIRST_SHARE = 0.6
BUDGET_SECONDS = 20.0  # of timed rounds, after the warm-up runs (TF_MPT_TIMING_BUDGET)

# The refinement: an op type goes float32 where its half nodes' summed time in the pick's
# per-node profile is over (1 + SLOWER) times the same nodes' float32 time, by FLOOR_SECONDS
# at least; it is tried only while REFINE_SHARE of the budget is left.
SLOWER = 0.1
FLOOR_SECONDS = 5e-6
PROFILE_RUNS = 3
REFINE_SHARE = 1.0 / 3.0

# Memory, the smaller versions: a pick holding more than this share of float32's peak (step
# peak and resident bytes) has its lean version timed beside it (stages/smaller.py): mixed
# precision's "half the memory" where activations dominate, short of the weights and inputs
# every candidate holds in float32.
SMALLER_ABOVE = 0.65
# make_smaller also makes lean the other half candidates within this share of the pick's
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

# Whether a traced step is timed (TF_MPT_STEP_TIMING=auto: when.py)
THIN = 0.3  # auto: time where the predicted saving is below this share of what it adds up
# auto: also time where half kernels other than matrix products and convolutions account for
# more than this share of the predicted saving (report.predicted_elementwise). Such a
# kernel's time is read from its op's line, probed alone at a few sizes; in a graph it may
# run several times slower than the probe said (Sapphire Rapids: a table whose bfloat16 Mul,
# AddV2 and Sub probed 1.3-1.5x faster at 1 M elements left MobileNetV2's Keras predict step
# untimed, its saving all element-wise, and it ran at 0.80x float32)
ELEMENTWISE_SHARE = 0.2
# auto, memory bounded (TF_MPT_MEMORY=float32): also time a step that computes gradients where
# the cost model kept at least this share of the nodes it weighed float32 (values the backward
# pass reads may then be held in float32: what the step holds is measured, not predicted)
KEPT_SHARE = 0.1


def timed_here(config, target):
    """Whether a rewrite for the resolved `target` times its candidates: only where its
    decisions are for this CPU as measured (`here`) and the budget is not 0."""
    return config.timing_budget > 0 and target.kind == _targets.HERE


def bounded_peaks(config, peaks):
    """The peaks the pick is bounded by (TF_MPT_MEMORY=float32 or least), or None."""
    return peaks if config.memory in ("float32", "least") else None


def holds_least(config):
    """Whether the pick is the candidate holding least of those not slower than float32
    (TF_MPT_MEMORY=least)."""
    return config.memory == "least"


def memory_price(config):
    """The share of float32's speed a timed graph may give up for memory
    (TF_MPT_MEMORY_PRICE; 0 where nothing is bounded: TF_MPT_MEMORY=any)."""
    return config.memory_price if config.memory in ("float32", "least") else 0.0


def memory_key(config):
    """What bounds a pick's memory, as a verdict's cache key reads it: TF_MPT_MEMORY's mode,
    with TF_MPT_MEMORY_PRICE where one is set."""
    price = memory_price(config)
    return f"{config.memory} price {price:g}" if price else config.memory


def total_peak(peaks, name):
    """Candidate `name`'s measured peak: its step peak plus peaks[RESIDENT], the bytes every
    candidate holds alike."""
    return peaks[name] + peaks.get(_ledger.RESIDENT, 0)


def over_float32(peaks, name):
    """Whether candidate `name`'s measured peak (total_peak) is over PEAK_SLACK above
    float32's."""
    return _candidates.FLOAT32 in peaks and name in peaks and \
        total_peak(peaks, name) > total_peak(peaks, _candidates.FLOAT32) * (1.0 + PEAK_SLACK)


def pick(times, predicted, peaks=None, least=False, price=0.0):
    """The candidate to keep from {candidate: per-round seconds}: the fastest median, unless
    the prediction's is within MARGIN of it. With `peaks` ({candidate: step peak bytes}, and
    RESIDENT): only among the candidates not over float32's (over_float32; float32 never
    is), and among those within MARGIN of the fastest, the ones holding least (within
    PEAK_SLACK of the lowest total) first: a tie in time goes to memory. With `least`
    (TF_MPT_MEMORY=least) and peaks: among the candidates not slower than float32 (their
    median not above float32's times one plus `price`, TF_MPT_MEMORY_PRICE), the one
    holding least (within PEAK_SLACK: the fastest of those)."""
    medians = {name: statistics.median(t) for name, t in times.items()
               if not (peaks and over_float32(peaks, name))}
    if least and peaks and _candidates.FLOAT32 in medians and set(medians) <= set(peaks):
        fast_enough = [name for name, m in medians.items()
                       if m <= medians[_candidates.FLOAT32] * (1.0 + price)]
        fewest = min(total_peak(peaks, name) for name in fast_enough)
        return min((name for name in fast_enough
                    if total_peak(peaks, name) <= fewest * (1.0 + PEAK_SLACK)),
                   key=medians.get)
    fastest = min(medians, key=medians.get)
    near = {name for name, m in medians.items() if m <= medians[fastest] * (1.0 + MARGIN)}
    if peaks and near <= set(peaks):
        least = min(total_peak(peaks, name) for name in near)
        near = {name for name in near if total_peak(peaks, name) <= least * (1.0 + PEAK_SLACK)}
        if predicted in near:
            return predicted
        return min(near, key=medians.get)
    if predicted in medians and medians[predicted] <= medians[fastest] * (1.0 + MARGIN):
        return predicted
    return fastest


def clear_winner(times):
    """After MIN_ROUNDS: the fastest median's slowest run is below every other candidate's
    fastest run (more rounds would not change the pick)."""
    if len(times) < 2 or min(len(t) for t in times.values()) < MIN_ROUNDS:
        return False
    medians = {name: statistics.median(t) for name, t in times.items()}
    best = min(medians, key=medians.get)
    return all(max(times[best]) < min(t) for name, t in times.items() if name != best)


def slower_ops(half_profile, float32_profile, half_nodes):
    """{op type: (half seconds, float32 seconds, node names)} for the op types whose half
    nodes (`half_nodes`: {node name: op type}, the converted nodes of a candidate) took more
    than (1 + SLOWER) times their float32 time in the profiles ({node name: seconds}), by at
    least FLOOR_SECONDS. Nodes absent from either profile (fused into another kernel) are
    not counted."""
    sums = {}
    for name, op in half_nodes.items():
        if name in half_profile and name in float32_profile:
            half, single, names = sums.get(op, (0.0, 0.0, ()))
            sums[op] = (half + half_profile[name], single + float32_profile[name],
                        names + (name,))
    return {op: (half, single, tuple(sorted(names)))
            for op, (half, single, names) in sorted(sums.items())
            if half > single * (1.0 + SLOWER) and half - single >= FLOOR_SECONDS}
