"""The candidates: the colourings of one graph that are timed against each other.

    float32           the graph as given
    rules             the op lists' colouring
    cost model        the cost model's colouring (the prediction where the target has a table)
    contractions only matrix products and convolutions half, every other op float32
    rules checked     the op lists' colouring with the op types the dispatch or numerics
                      check flagged on this CPU float32 (where any was); an op type the
                      numerics check flagged is float32 in rules and contractions only too
    refined           a half candidate with the op types its profile showed slower float32
    lean              a candidate rearranged to hold less at its peak (transforms/)

Each is a Candidate: its recipe (recipes.Recipe), the graph it yields and that graph's hash.
It is made by the painter (`rewrite(target, lists, graph)`, the orchestrator's) or by a
transform of another's graph; nothing here measures or decides.
"""

import dataclasses
import functools
import hashlib
import typing

from tensorflow.core.framework import graph_pb2

from tf_mpt import _dtypes
from tf_mpt import lists as _lists
from tf_mpt.costs import contractions as _contractions
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import type_attrs as _ta


FLOAT32, RULES, COST, CONTRACTIONS = "float32", "rules", "cost model", "contractions only"
# the op lists' colouring with the op types the dispatch or numerics check flagged float32
CHECKED = "rules checked"
REFINED = "refined"  # the pick with the op types its profile shows slower in half float32
LEAN = "lean"  # the fastest candidate rearranged to hold less (transforms/)
CONTRACTION_OPS = _contractions.NODE_TIMED_OPS | frozenset((
    "Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2"))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One candidate of a decision.

    Attributes:
        name: what the verdict and the ledger call it (FLOAT32, RULES, ..., LEAN, REFINED).
        recipe: how its graph is made (recipes.Recipe), what a verdict stores for a replay.
        graph_def: the GraphDef it yields.
        result: its RewriteResult (None: float32's, the graph as given).
        hash: its graph's hash (graph_hash), computed once, when first read.
    """
    name: str
    recipe: typing.Any
    graph_def: typing.Any
    result: typing.Any = None

    @classmethod
    def of(cls, name, recipe, result):
        """The candidate `recipe` made as `result` (a RewriteResult)."""
        return cls(name, recipe, result.graph_def, result)

    @functools.cached_property
    def hash(self):
        return graph_hash(self.graph_def)


def contractions_only(lists):
    """The op lists with only their matrix products and convolutions allowed half and no op
    inferred or cleared: every other op float32, with Casts around each contraction."""
    return _lists.OpLists(allow=lists.allow & CONTRACTION_OPS, deny=lists.deny)


# The reason of each node of the float32 graph where it is kept for its speed
FLOAT32_FASTER = "graph timing: the graph ran faster in float32"


def graph_hash(graph_def):
    """The hash of a GraphDef's bytes (hex, 32 characters): what tells two candidates' graphs
    apart, and a replayed pick's graph from the one timed."""
    return hashlib.sha256(graph_def.SerializeToString(deterministic=True)).hexdigest()[:32]


def float32_result(graph_def, predicted, reason=FLOAT32_FASTER):
    """The RewriteResult of keeping the graph float32, its report the prediction's with
    nothing converted, each node's decision giving `reason`."""
    unchanged = graph_pb2.GraphDef()
    unchanged.CopyFrom(graph_def)
    decisions = {}
    for name, d in predicted.report.decisions.items():
        if d.converted:
            d = dataclasses.replace(d, colour="fp32", converted=False, reason=reason)
        decisions[name] = d
    report = dataclasses.replace(predicted.report, converted_nodes=0, casts_added=0,
                                 cast_names=(), decisions=decisions, predicted_saving=0.0,
                                 loop_variables_kept_half=0, call_values_kept_half=0,
                                 tensor_lists_kept_half=0, batch_norms_folded=0)
    return type(predicted)(unchanged, report, False)


def candidate_rewrite(name, rewrite, lists):
    """rewrite(graph) of candidate `name` (graph None: the graph decided): its target and
    op lists."""
    target_name, candidate_lists = {
        RULES: ("rules", None), COST: (None, None),
        CONTRACTIONS: ("rules", contractions_only(lists))}[name]
    return lambda graph: rewrite(target_name, candidate_lists, graph)


def keeping_float32(graph_def, reasons, candidate, rewrite, lists):
    """Candidate `candidate`'s RewriteResult for `graph_def` with the nodes of `reasons`
    ({node name: why}: a refinement's, the checked candidate's) kept float32, their
    decisions giving why."""
    keep = set(reasons)
    marked = graph_pb2.GraphDef()
    marked.CopyFrom(graph_def)
    for node in marked.node:
        if node.name in keep and _ta.KEEP_FP32_ATTR not in node.attr:
            node.attr[_ta.KEEP_FP32_ATTR].b = True
        else:
            keep.discard(node.name)  # (an attr of the graph's own stays)
    result = candidate_rewrite(candidate, rewrite, lists)(marked)
    for node in result.graph_def.node:
        if node.name in keep:
            del node.attr[_ta.KEEP_FP32_ATTR]
    decisions = dict(result.report.decisions)
    for name in keep:
        if name in decisions:
            decisions[name] = dataclasses.replace(decisions[name], colour="fp32",
                                                  converted=False, reason=reasons[name])
    return type(result)(result.graph_def,
                        dataclasses.replace(result.report, decisions=decisions),
                        result.modified)


FLOAT32_SAVED_IN_HALF = ("graph timing: float32, the values its backward pass reads saved "
                         "in half (TF_MPT_MEMORY_PRICE)")


def graph_of(name, results, float32_graph):
    """Candidate `name`'s GraphDef (float32's: `float32_graph`)."""
    return float32_graph if name == FLOAT32 else results[name].graph_def


def result_of(name, results, float32_graph, predicted):
    """Candidate `name`'s RewriteResult (float32's: made from `float32_graph` and the
    prediction's report, `predicted`, as a lean version's source)."""
    if name != FLOAT32:
        return results[name]
    return float32_result(float32_graph, results[predicted], FLOAT32_SAVED_IN_HALF)


# The reason of a node the candidate converted that its lean version runs float32 again
FLOAT32_IN_LEAN = ("graph timing: float32 in the lean version kept for memory (its products "
                   "read only as float32 computed in float32: float32 products)")


def lean_result(result, graph_def):
    """`result` (a candidate's RewriteResult) with the lean graph `graph_def`, its report that
    of the graph that runs: `casts_added` counts the lean graph's own tf_mpt Casts (the
    candidate's, less those a leaner version turned into Identities, plus the per-use copies
    and Casts back), and a node the candidate converted that `graph_def` holds in float32
    again (float32 products: a weight gradient's product) is reported float32
    (FLOAT32_IN_LEAN), `converted_nodes` less those."""
    report = dataclasses.replace(
        result.report, casts_added=result.report.casts_added +
        _casts.our_casts(graph_def.node) - _casts.our_casts(result.graph_def.node))
    half = _dtypes.parse(report.dtype).enum
    nodes = nodes_by_decision_name(graph_def)
    decisions, back = dict(report.decisions), 0
    for name, decision in report.decisions.items():
        node = nodes.get(name)
        if decision.converted and node is not None and not holds_half(node, half):
            attrs = {key: ("fp32", FLOAT32_IN_LEAN) if colour == "allow" else (colour, why)
                     for key, (colour, why) in decision.attrs.items()}
            decisions[name] = dataclasses.replace(decision, colour="fp32", converted=False,
                                                  reason=FLOAT32_IN_LEAN, attrs=attrs)
            back += 1
    if back:
        report = dataclasses.replace(report, decisions=decisions,
                                     converted_nodes=report.converted_nodes - back)
    return type(result)(graph_def, report, True)


def nodes_by_decision_name(graph_def):
    """{name as a report's decisions key it: NodeDef} of `graph_def` and of its library
    functions ('<function>/<node>')."""
    nodes = {node.name: node for node in graph_def.node}
    for function in graph_def.library.function:
        for node in function.node_def:
            nodes[f"{function.signature.name}/{node.name}"] = node
    return nodes


def holds_half(node, half):
    """Whether a type attr of `node` is the half type `half` (a DataType enum)."""
    return any(value.type == half or half in value.list.type for value in node.attr.values())
