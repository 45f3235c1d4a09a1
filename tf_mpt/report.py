"""RewriteReport: what the rewrite did to each node and why.

Colours:
* ``allow``: the node (at least one of its type attrs) now runs in half precision, or already did;
* ``deny``: kept float32 because it is numerically unsafe (a deny op, or downstream of one);
* ``fp32``: kept float32 for another reason (fetched, opted out, no kernel, no rule applies);
* ``none``: the node has no float32 type attribute to decide about.

Example:
    >>> result = tf_mpt.rewrite_graph_def(graph_def, dtype="bfloat16")
    >>> print(result.report.summary())
    Converted 18/40 nodes to bfloat16 using 6 cast(s)
    >>> result.report.decisions["dense/MatMul"].reason
    'op MatMul is on the allow list'
"""

import dataclasses
import json
import typing

from tensorflow.core.framework import types_pb2


@dataclasses.dataclass(frozen=True)
class NodeDecision:
    """The decision for one node.

    Attributes:
        name, op: the node.
        colour: 'allow', 'deny', 'fp32' or 'none' (see the module docstring).
        reason: one sentence, e.g. "downstream of deny op 'Exp_1' through clear/infer ops".
        attrs: type attr -> (colour, reason), e.g. {'T': ('allow', ...), 'U': ('fp32', ...)}.
        converted: True if the rewrite changed at least one of its type attrs to half.
        function: the library function holding the node, or None for the main graph.
    """
    name: str
    op: str
    colour: str
    reason: str
    attrs: typing.Mapping
    converted: bool
    function: typing.Optional[str] = None

    def __str__(self):
        where = f"{self.function}: " if self.function else ""
        return f"{where}{self.name} ({self.op}): {self.colour}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class RewriteReport:
    """Counts, per-node decisions and the Casts added by one rewrite.

    Attributes:
        dtype: 'float16' or 'bfloat16'.
        total_nodes: nodes in the input graph.
        converted_nodes: nodes with at least one type attr changed to half.
        casts_added: Cast nodes added.
        cast_names: their names, in the order added.
        decisions: node name -> NodeDecision, in GraphDef order; nodes of library functions
            follow, keyed '<function>/<node>'.
        error: None, or the message of the internal error that made the rewrite give up.
        functions: names of the library functions whose bodies were rewritten or examined.
        loop_variables_kept_half: While loop variables switched to half across the loop.
        call_values_kept_half: call/If/Case arguments and results switched to half across
            the call (Casts on both sides of the boundary removed).
        tensor_lists_kept_half: TF2 TensorLists (e.g. a while_v2 gradient's accumulators)
            whose elements were switched to half across the loops that carry them.
    """
    dtype: str
    total_nodes: int
    converted_nodes: int
    casts_added: int
    cast_names: tuple = ()
    decisions: typing.Mapping = dataclasses.field(default_factory=dict)
    error: typing.Optional[str] = None
    functions: tuple = ()
    loop_variables_kept_half: int = 0
    call_values_kept_half: int = 0
    tensor_lists_kept_half: int = 0

    def summary(self):
        """One line: 'Converted 18/40 nodes to bfloat16 using 6 cast(s)'."""
        line = (f"Converted {self.converted_nodes}/{self.total_nodes} nodes to {self.dtype} "
                f"using {self.casts_added} cast(s)")
        if self.error is not None:
            line += f" (rewrite abandoned: {self.error})"
        return line

    def nodes_with_colour(self, colour):
        """Names of the nodes with the given colour, in GraphDef order."""
        return [name for name, d in self.decisions.items() if d.colour == colour]

    def to_dict(self):
        return {
            "dtype": self.dtype,
            "total_nodes": self.total_nodes,
            "converted_nodes": self.converted_nodes,
            "casts_added": self.casts_added,
            "cast_names": list(self.cast_names),
            "error": self.error,
            "functions": list(self.functions),
            "loop_variables_kept_half": self.loop_variables_kept_half,
            "call_values_kept_half": self.call_values_kept_half,
            "tensor_lists_kept_half": self.tensor_lists_kept_half,
            "summary": self.summary(),
            "nodes": {
                name: {
                    "op": d.op,
                    "colour": d.colour,
                    "reason": d.reason,
                    "converted": d.converted,
                    "function": d.function,
                    "attrs": {label: {"colour": c, "reason": r}
                              for label, (c, r) in d.attrs.items()},
                }
                for name, d in self.decisions.items()
            },
        }

    def to_json(self, indent=None):
        """The report as a JSON string (see `to_dict` for the layout)."""
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self):
        return self.summary()


def _attr_label(key):
    return f"{key[0]}[{key[1]}]" if isinstance(key, tuple) else key


def build_report(paint, cast_names, explain):
    """Builds the report from a finished Paint (`explain(paint, v)` gives unpainted reasons)."""
    decisions = {}
    converted_nodes = 0
    view = paint.view
    for i, node in enumerate(view.nodes):
        attrs = {}
        node_colour, node_reason, converted = "none", "no float32 type attribute", False
        rank = 0  # allow(converted)=4 > deny=3 > fp32=2 > allow(already half)=1 > none=0
        for key, v in paint.node_vertex[i].items():
            if paint.converted[v]:
                colour, reason, r = "allow", paint.reason[v], 4
                converted = True
            elif paint.allow[v]:
                colour, reason, r = "allow", paint.reason[v], 1
            elif paint.v_dtype[v] != types_pb2.DT_FLOAT:  # nothing to decide
                continue
            elif paint.deny[v]:
                colour, reason, r = "deny", paint.reason[v], 3
            else:
                colour, reason, r = "fp32", explain(paint, v), 2
            attrs[_attr_label(key)] = (colour, reason)
            if r > rank:
                rank, node_colour, node_reason = r, colour, reason
        if not paint.node_vertex[i] and paint.node_skip_reason[i] is not None:
            node_colour, node_reason = "fp32", paint.node_skip_reason[i]
        converted_nodes += converted
        decisions[node.name] = NodeDecision(node.name, node.op, node_colour, node_reason,
                                            attrs, converted)
    return RewriteReport(dtype=paint.target_name, total_nodes=len(view.nodes),
                         converted_nodes=converted_nodes, casts_added=len(cast_names),
                         cast_names=tuple(cast_names), decisions=decisions)


def merge_function_reports(report, function_reports):
    """One report for a graph and the bodies of its library functions."""
    from tf_mpt.rewrite.function_bodies import RET_PREFIX  # pylint: disable=g-import-not-at-top
    decisions = dict(report.decisions)
    total, converted, casts = report.total_nodes, report.converted_nodes, report.casts_added
    cast_names = list(report.cast_names)
    for function, sub in function_reports.items():
        for name, d in sub.decisions.items():
            if name.startswith(RET_PREFIX) or (d.op == "Placeholder" and not d.converted):
                continue  # the conversion's stand-ins for arguments and return values
            decisions[f"{function}/{name}"] = dataclasses.replace(d, function=function)
            total += 1
            converted += d.converted
        casts += sub.casts_added
        cast_names.extend(f"{function}/{c}" for c in sub.cast_names)
    return dataclasses.replace(report, total_nodes=total, converted_nodes=converted,
                               casts_added=casts, cast_names=tuple(cast_names),
                               decisions=decisions, functions=tuple(function_reports))


def recount_casts(report, before, after, kept):
    """The report after values were kept half across loop, call and TensorList boundaries
    (`kept`: the Counts of rewrite.boundaries): Casts counted again in every graph."""
    from tf_mpt.rewrite.casts import CAST_SUFFIX  # pylint: disable=g-import-not-at-top

    def cast_names(graph_def):
        names = {n.name for n in graph_def.node if n.op == "Cast"}
        for fdef in graph_def.library.function:
            names |= {f"{fdef.signature.name}/{n.name}" for n in fdef.node_def if n.op == "Cast"}
        return names

    added = sorted(n for n in cast_names(after) - cast_names(before)
                   if n.endswith(CAST_SUFFIX))
    # functions keep their names (a specialised copy's Casts count under its new name)
    return dataclasses.replace(report, casts_added=len(added), cast_names=tuple(added),
                               loop_variables_kept_half=kept.loop_variables,
                               call_values_kept_half=kept.call_values,
                               tensor_lists_kept_half=kept.tensor_lists)
