"""The stages of a decision, in the order decide runs them (STAGES), each a function of the
Choice so far returning the verdict, and the rule of when it applies:

    first rounds      every candidate timed side by side; the pick (first.py)
    lean versions     a pick over float32's peak: its lean versions (lean.py)
    smaller versions  a pick holding over smaller_above of float32's peak: the lean versions
                      of the candidates near its time (smaller.py)
    refinement        a half pick: its op types profiled slower in half kept float32
                      (refinement.py)

A graph too slow to time has its peaks measured instead (untimed.py: decide's, where the
first rounds raise TooSlow). A stage that fails leaves the verdict as it was (but the first
rounds: the graph then keeps the prediction), said in one INFO line.

In full (the thresholds are the Policy's fields):

    prediction    the rewrite's colouring for the target: the cost model's where the target
                  has a table (`here`, a FILE), else the op lists' (`rules`)
    candidates    where the decisions are for this CPU (target `here`) and graph timing is on
                  (TF_MPT_TIMING_BUDGET > 0; `--no-timing` off): float32, the rules', the cost
                  model's and contractions only, each a full rewrite of the same GraphDef
    measurement   timers.graphs.time_candidates: each candidate run on made-up inputs in a
                  sandbox; candidates whose graphs are equal are timed once. A traced
                  tf.function (step_applies: TF_MPT_STEP_TIMING) has the same candidates,
                  timed on copies of its variables (timers.steps.time_versions), in one
                  sandbox kept open across the stages below (a candidate timed again is not
                  imported or set up again)
    budget        TF_MPT_TIMING_BUDGET counts timed runs (Budget), each stage's set-up
                  apart: the first rounds spend up to policy.first_share of it, the stages below
                  what is left
    refinement    (graph timing) where a half candidate wins with a third of the budget left:
                  one per-node profile of it and of float32 (timers.graphs.profile_candidates);
                  the op types whose half nodes ran slower than their float32 nodes (by over
                  10%) kept float32 in a new candidate (`refined`), timed beside the winner
                  and kept if over 3% faster
    memory        (graph timing) each candidate's step peak, from one traced run's allocation
                  records after its rounds, printed beside its time and flagged where over
                  float32's by more than 2%. With TF_MPT_MEMORY=float32 (the default) such a
                  candidate is not kept, and a tie in time (policy.margin) goes to the candidate
                  holding least (policy.pick); where the fastest is one, its lean version
                  (lean.lean; then, if still over, its leaner one) is timed beside the
                  fastest within float32's peak and kept if it is within that peak and over
                  3% faster (before any refinement: a lean pick is not refined). Where
                  no lean version was kept and the pick holds more than
                  policy.smaller_above of float32's peak, its lean version without ordered products
                  (activations saved in half, late casts), those of the half candidates
                  within policy.smaller_window of its time, and its own from its half copies alone
                  (no new Cast down: lean.FROM_COPIES) are timed beside it, and the one
                  holding least of those holding less (by over 2%) and not slower (by over
                  3%), nor slower than float32, is kept: a tie in time goes to memory;
                  where that one (or the pick) still holds over policy.smaller_above, the fastest
                  that holds within it is kept if not over policy.half_memory_price slower than
                  the pick and over 3% faster than float32 (make_smaller; before the
                  refinement, and a lean pick is not refined). TF_MPT_MEMORY_PRICE (a share
                  of float32's speed): where the pick, float32 included, holds over
                  policy.smaller_above, float32's own lean version (compute float32, saved in
                  half) and those of the candidates within the price of float32's time are
                  timed too, with float32 in the same rounds, and the fastest within
                  policy.smaller_above is kept where not over the price slower than float32 (under
                  least: the bound of the one holding least). A traced tf.function's step
                  timer measures its candidates' peaks the same way
    too slow      where the first rounds of every candidate would not fit in the budget, a
                  candidate over policy.drop_slower slower than the fastest runs no more rounds
                  (timers.rounds.rounds); where the others' still do not fit (TooSlow) and
                  the peak is bounded (TF_MPT_MEMORY=float32 or least): the peaks of float32
                  and of the prediction are measured instead, one traced run each after a
                  first run; the prediction runs where within float32's, else its first lean
                  version within it (make_lean's order), else float32
                  (within_float32_untimed: ResNet50's fit step at batch 64, 7.2 s a round,
                  ran the cost model's colouring untimed at 1.13x float32's peak tensors);
                  that check is cached beside the budget (CHECKED_BUDGET) and read again
                  under the same budget only
    verdict       verdict.Verdict: every time and the pick, in the report
                  (RewriteReport.verdict) and in one INFO line

A graph that cannot be timed keeps the prediction, and its verdict says why.
"""

import dataclasses
import typing

from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose.stages import first as _first
from tf_mpt.choose.stages import lean as _lean
from tf_mpt.choose.stages import refinement as _refinement
from tf_mpt.choose.stages import smaller as _smaller


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: `run(choice)` returns the verdict; it runs where `applies(choice)`; a
    failure is said as `fails_as` (its `{pick}`: the pick it started from), or raised where
    that is ''."""
    name: str
    run: typing.Callable
    applies: typing.Callable
    fails_as: str = ""


def _refines(choice):
    """A half pick, a timer that profiles, not TF_MPT_MEMORY=least, and refine_share of the
    budget left."""
    policy = choice.policy
    return choice.timer.profiles and \
        choice.verdict.pick not in (_candidates.FLOAT32, _candidates.LEAN) and \
        not policy.least and choice.budget.left() >= policy.refine_share * policy.budget


STAGES = (
    Stage("first rounds", _first.first_rounds, lambda choice: True),
    Stage("lean versions", _lean.make_lean, lambda choice: choice.bounded,
          "graph timing did not time a lean candidate"),
    # (before the refinement, which would leave it no budget)
    Stage("smaller versions", _smaller.make_smaller, lambda choice: choice.bounded,
          "graph timing did not time a smaller candidate"),
    Stage("refinement", _refinement.refine, _refines, "graph timing did not refine {pick}"),
)
