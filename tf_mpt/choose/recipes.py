"""Recipes: how each candidate's graph is made, as a value that a verdict stores and a replay
makes again (its graph then checked against the hash of the graph that was timed).

    base              a colouring: float32 (the graph as given), the op lists' (rules), the
                      cost model's, contractions only
    then, in order    nodes kept float32 (`float32_nodes`: the refinement's; `float32_ops`:
                      every node of these op types), then a lean version (`lean`: the
                      options of transforms.lean.lean)

make_base gives the recipes the first rounds time; a stage that makes a version of one (a
refinement, a lean version) makes its recipe from the source's.
"""

import dataclasses

from tf_mpt import _dtypes
from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose.transforms import lean as _lean

# The reasons of the nodes a recipe keeps float32
REFINED_WHY = ("graph timing: its op type ran slower in half than in float32 in this graph's "
               "per-node profile (the refinement)")
CHECKED_WHY = ("graph timing: its op type's half kernel was flagged on this CPU by the "
               "dispatch or numerics check")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one candidate's graph is made (see the module's docstring).

    Attributes:
        base: candidates.FLOAT32, RULES, COST or CONTRACTIONS.
        float32_nodes: node names kept float32 where the base colours them half.
        float32_ops: op types whose nodes are kept float32 likewise.
        lean: () or (products_in_float32, ordered, only_ordered, new_copies): the lean
            version of the graph so far (transforms.lean.lean's options).
    """
    base: str
    float32_nodes: tuple = ()
    float32_ops: tuple = ()
    lean: tuple = ()

    def make(self, choice):
        """The RewriteResult this recipe makes of `choice`'s graph (a Choice): the base's
        (the painter's, `choice.rewrite`; float32's from the prediction's report), its nodes
        kept float32, then its lean version (with `choice.lean_inputs`)."""
        if self.base == _candidates.FLOAT32:
            result = _candidates.float32_result(
                choice.graph_def, choice.predicted,
                _candidates.FLOAT32_SAVED_IN_HALF if self.lean else _candidates.FLOAT32_FASTER)
        elif self.float32_nodes or self.float32_ops:
            reasons = {node.name: CHECKED_WHY for node in choice.graph_def.node
                       if node.op in self.float32_ops}
            reasons.update((name, REFINED_WHY) for name in self.float32_nodes)
            result = _candidates.keeping_float32(choice.graph_def, reasons, self.base,
                                                 choice.rewrite, choice.lists)
        elif self.base == choice.predicted_name:
            result = choice.predicted
        elif choice.results.get(self.base) is not None:
            result = choice.results[self.base]
        else:
            result = _candidates.candidate_rewrite(self.base, choice.rewrite, choice.lists)(None)
        if self.lean:
            products_in_float32, ordered, only_ordered, new_copies = self.lean
            graph, _ = _lean.lean(result.graph_def, products_in_float32, *choice.lean_inputs,
                                  ordered=ordered, only_ordered=only_ordered,
                                  new_copies=new_copies,
                                  half=_dtypes.parse(result.report.dtype).enum,
                                  policy=choice.policy)
            result = _candidates.lean_result(result, graph)
        return result

    def made_lean(self, products_in_float32=False, ordered=True, only_ordered=False,
                  new_copies=True):
        """This recipe with a lean version last (transforms.lean.lean's options)."""
        return dataclasses.replace(
            self, lean=(products_in_float32, ordered, only_ordered, new_copies))

    def to_dict(self):
        return {"base": self.base, "float32_nodes": list(self.float32_nodes),
                "float32_ops": list(self.float32_ops), "lean": list(self.lean)}

    @classmethod
    def from_dict(cls, data):
        """A recipe as to_dict wrote it (None where it does not read as one)."""
        try:
            lean = tuple(bool(v) for v in data.get("lean", ()))
            recipe = cls(str(data["base"]),
                         tuple(str(n) for n in data.get("float32_nodes", ())),
                         tuple(str(op) for op in data.get("float32_ops", ())), lean)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return recipe if len(lean) in (0, 4) else None


def checked(choice):
    """The recipe of the op lists' colouring with the op types the dispatch or numerics check
    flagged here (the prediction's report: dispatch_kept, numerics_kept) kept float32, or
    None where none was flagged (the rules' candidate is made for target `rules`, which
    applies no check of this CPU's kernels: its slow half kernels are timed beside it)."""
    report = choice.predicted.report
    flagged = tuple(sorted(set(report.dispatch_kept) | set(report.numerics_kept)))
    if not flagged:
        return None
    return Recipe(_candidates.RULES, float32_ops=flagged)


def inaccurate(choice):
    """The op types the numerics check flagged here (their half kernel errs over
    dispatch.INACCURATE times the rounding of float32's result): no candidate runs them
    half, whatever its speed (timing sees speed, not error)."""
    return tuple(sorted(choice.predicted.report.numerics_kept))


def make_base(choice):
    """Fills `choice` with the base candidates the first rounds time (choice.add): float32
    (the graph as given), the prediction, and the op lists' colouring, contractions only
    and, where the checks flagged an op type here, the checked one (checked), made by the
    painter, the op types the numerics check flagged float32 in each (inaccurate); `graphs`
    with one GraphDef per distinct graph, in that order (float32, the prediction, rules,
    contractions only, rules checked). A candidate whose graph equals an earlier one is in
    `choice.same_as` instead."""
    choice.add(_candidates.Candidate(_candidates.FLOAT32, Recipe(_candidates.FLOAT32),
                                     choice.graph_def))
    choice.add(_candidates.Candidate.of(choice.predicted_name, Recipe(choice.predicted_name),
                                        choice.predicted))
    kept = inaccurate(choice)
    proposed = {_candidates.RULES: Recipe(_candidates.RULES, float32_ops=kept),
                _candidates.CONTRACTIONS: Recipe(_candidates.CONTRACTIONS, float32_ops=kept)}
    flagged = checked(choice)
    if flagged is not None:
        proposed[_candidates.CHECKED] = flagged
    for name, recipe in proposed.items():
        if name != choice.predicted_name:
            choice.add(_candidates.Candidate.of(name, recipe, recipe.make(choice)))
    seen = {}  # {graph hash: the first candidate with that graph}
    for name, candidate in choice.candidates.items():
        digest, graph = candidate.hash, candidate.graph_def
        if digest in seen:
            choice.same_as[name] = seen[digest]
            continue
        seen[digest] = name
        choice.graphs[name] = graph
