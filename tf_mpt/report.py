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

# How the reason of a node kept float32 as a variable's update begins
# (tf_mpt/rewrite/paint/updates.py)
UPDATE_REASON = "update of a float32 variable"


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


@typing.runtime_checkable
class Verdict(typing.Protocol):
    """What a report holds of the choosing step's verdict (tf_mpt.choose.verdict.Verdict
    implements it): the candidate that runs, whether candidates were timed, one line that says
    why, and a record that JSON holds."""
    pick: str
    timed: bool

    def describe(self) -> str:
        ...

    def to_dict(self) -> dict:
        ...


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
        predicted_saving: with the cost model on, the seconds per run it predicts the
            rewritten graph saves over running all of it float32 (0.0: off, or nothing kept
            half by it); the graph's and its functions' together, a loop body's counted once
            (per iteration: its trip count is not known).
        predicted_changed: the seconds per run of faster kernels and of Casts that prediction
            adds up (its size: a saving small beside it is uncertain).
        predicted_elementwise: the seconds per run of half kernels faster than float32 in
            that prediction from ops other than matrix products and convolutions
            (element-wise ops, reductions: each costed from its op's line, a kernel probed
            alone at a few sizes): the share of the prediction that rests on such probes.
        weighed_nodes: with the cost model on, (nodes it could size, nodes with a float type):
            a node is sized when every output's static shape is known (from the graph's
            `_output_shapes`, TensorFlow's shape inference or a traced graph; an unknown
            batch read as TF_MPT_COST_BATCH); None with the model off. The op lists decide
            for what it cannot size.
        unweighed_nodes: the names of the nodes with a float type it could not size (keyed
            as in `decisions`).
        unweighed_why: why the shapes of a graph could not be inferred at all, or None.
        dispatch_kept: {op type: ratio} the dispatch check kept float32 (their half kernel,
            as TensorFlow runs it on this CPU, that many times slower than float32), where
            the graph runs here; {} otherwise.
        numerics_kept: {op type: error ratio} the numerics check kept float32 (their half
            kernel, as TensorFlow runs it on this CPU, erred that many times the rounding of
            float32's result to the half type), where the graph runs here; {} otherwise.
        verdict: where the graph was decided for this CPU with timing on, the choosing
            step's Verdict (tf_mpt.choose.verdict.Verdict): each candidate colouring's times
            and the pick (or why it was not timed); None otherwise.
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
    already_half_nodes: int = 0  # nodes that computed in the half type before the rewrite
    batch_norms_folded: int = 0  # inference batch norms folded into their convolutions
    target: typing.Optional[str] = None  # the target decided for: 'rules', 'here' or a table
    predicted_saving: float = 0.0
    predicted_changed: float = 0.0
    predicted_elementwise: float = 0.0
    weighed_nodes: typing.Optional[tuple] = None
    unweighed_nodes: tuple = ()
    unweighed_why: typing.Optional[str] = None
    verdict: typing.Optional[Verdict] = None
    dispatch_kept: typing.Mapping = dataclasses.field(default_factory=dict)
    numerics_kept: typing.Mapping = dataclasses.field(default_factory=dict)

    @property
    def kept_by_cost_model(self):
        """How many nodes the cost model kept float32 (their decision's reason says so)."""
        return sum(1 for d in self.decisions.values()
                   if not d.converted and d.reason.startswith("cost model:"))

    @property
    def kept_as_variable_updates(self):
        """How many nodes stayed float32 as a variable's update (an optimizer's step, a moving
        average: their decision's reason says so)."""
        return sum(1 for d in self.decisions.values()
                   if not d.converted and d.reason.startswith(UPDATE_REASON))

    def summary(self):
        """One line: 'Converted 18/40 nodes to bfloat16 using 6 cast(s)', and when the graph
        already computed in half (a Keras model under a mixed policy) how much:
        'Converted 0/1864 nodes to float16 using 0 cast(s); 412 more were float16 already',
        how many the cost model kept float32, and the target decided for (' for target rules')."""
        line = (f"Converted {self.converted_nodes}/{self.total_nodes} nodes to {self.dtype} "
                f"using {self.casts_added} cast(s)")
        if self.target is not None:
            line += f" for target {self.target}"
        if self.already_half_nodes:
            line += f"; {self.already_half_nodes} more were {self.dtype} already"
        by_cost = self.kept_by_cost_model
        if by_cost:
            where = "here" if self.target in (None, "here") else "on the target"
            line += (f"; {by_cost} kept float32 by the cost model ({self.dtype} would be slower "
                     f"{where}, Casts included)")
        updates = self.kept_as_variable_updates
        if updates:
            line += (f"; {updates} compute variable updates (an optimizer's step, moving "
                     "averages): kept float32")
        if self.weighed_nodes is not None:
            line += "; the cost model weighed {}/{} nodes".format(*self.weighed_nodes)
            if self.unweighed_why:
                line += f" (no shapes: {self.unweighed_why})"
        if self.dispatch_kept:
            kept = ", ".join(f"{op} ({ratio:.0f}x)" for op, ratio in
                             sorted(self.dispatch_kept.items()))
            line += (f"; kept float32 by the dispatch check ({self.dtype} kernel that many "
                     f"times slower here): {kept}")
        if self.numerics_kept:
            kept = ", ".join(f"{op} ({ratio:.0f}x)" for op, ratio in
                             sorted(self.numerics_kept.items()))
            line += (f"; kept float32 by the numerics check ({self.dtype} kernel error that "
                     f"many times {self.dtype} rounding here): {kept}")
        if self.verdict is not None:
            line += "; " + self.verdict.describe()
        if self.batch_norms_folded:
            line += (f"; {self.batch_norms_folded} batch norm(s) folded into their "
                     "convolutions")
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
            "already_half_nodes": self.already_half_nodes,
            "target": self.target,
            "predicted_saving": self.predicted_saving,
            "predicted_changed": self.predicted_changed,
            "predicted_elementwise": self.predicted_elementwise,
            "weighed_nodes": (list(self.weighed_nodes) if self.weighed_nodes is not None
                              else None),
            "unweighed_nodes": list(self.unweighed_nodes),
            "unweighed_why": self.unweighed_why,
            # (the verdict's record, and its line: each candidate's time and why the pick)
            "verdict": ({**self.verdict.to_dict(), "line": self.verdict.describe()}
                        if self.verdict is not None else None),
            "dispatch_kept": dict(self.dispatch_kept),
            "numerics_kept": dict(self.numerics_kept),
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
