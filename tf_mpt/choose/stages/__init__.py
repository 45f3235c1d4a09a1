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
