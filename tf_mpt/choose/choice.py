"""The Choice: one graph's decision in progress, as decide's stages pass it on (the way the
paint passes pass a Paint): what the stages read and what they add.

    given         the graph as given (float32's candidate), the prediction, the painter
                  (`rewrite(target, lists, graph)`) and its lists, the Policy, the Timer, the
                  lean transforms' inputs (the lists, the values' shapes)
    candidates    `candidates` {name: candidates.Candidate} (its recipe, its graph and
                  the graph's hash), added as made (add); read as `results` {name:
                  RewriteResult} (float32's: None); `graphs`
                  {name: GraphDef} one per distinct graph (what the first rounds time),
                  `same_as` {name: the one it equals}
    so far        the ledger of what was measured, the budget left (a ledger.Budget, set by
                  the first rounds), the verdict, and whether the first rounds measured
                  peaks a pick is bounded by
"""

import dataclasses
import typing

from tf_mpt.choose import ledger as _ledger


@dataclasses.dataclass
class Choice:
    """One graph's choice in progress (see the module's docstring)."""
    graph_def: typing.Any
    predicted: typing.Any
    predicted_name: str
    rewrite: typing.Callable
    lists: typing.Any
    policy: typing.Any
    timer: typing.Any
    lean_inputs: tuple
    candidates: dict = dataclasses.field(default_factory=dict)  # {name: Candidate}
    graphs: dict = dataclasses.field(default_factory=dict)
    same_as: dict = dataclasses.field(default_factory=dict)
    ledger: typing.Any = dataclasses.field(default_factory=_ledger.Ledger)  # measured
    budget: typing.Any = None
    verdict: typing.Any = None
    bounded: bool = False  # peaks bound the pick, measured in the first rounds, budget left

    def add(self, candidate):
        """Adds (or replaces: a later stage's LEAN) a candidates.Candidate; returns it."""
        self.candidates[candidate.name] = candidate
        return candidate

    @property
    def results(self):
        """{name: RewriteResult} of the candidates made (float32's: None)."""
        return {name: c.result for name, c in self.candidates.items()}

    @property
    def predicted_graph(self):
        """The name of the candidate the prediction's graph is timed as."""
        return self.same_as.get(self.predicted_name, self.predicted_name)
