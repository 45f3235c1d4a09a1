"""Building the RewriteReport (tf_mpt/report.py) from a finished Paint and the edited graphs."""

import dataclasses

from tensorflow.core.framework import types_pb2

from tf_mpt import report as _report
from tf_mpt.rewrite.casts import CAST_SUFFIX
from tf_mpt.rewrite.function_bodies import RET_PREFIX
from tf_mpt.rewrite.paint import shapes as _shapes


def _attr_label(key):
    return f"{key[0]}[{key[1]}]" if isinstance(key, tuple) else key


def build_report(paint, cast_names, explain):
    """Builds the report from a finished Paint (`explain(paint, v)` gives unpainted reasons)."""
    decisions = {}
    converted_nodes = already_half = 0
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
        already_half += rank == 1  # allow, already half, nothing converted
        decisions[node.name] = _report.NodeDecision(node.name, node.op, node_colour, node_reason,
                                            attrs, converted)
    weighed, unweighed, unweighed_why = _weighed(paint)
    return _report.RewriteReport(dtype=paint.half_name, total_nodes=len(view.nodes),
                         converted_nodes=converted_nodes, casts_added=len(cast_names),
                         cast_names=tuple(cast_names), decisions=decisions,
                         already_half_nodes=already_half,
                         predicted_saving=paint.cost_prediction[0],
                         predicted_changed=paint.cost_prediction[1],
                         predicted_elementwise=paint.cost_prediction[2],
                         weighed_nodes=weighed, unweighed_nodes=unweighed,
                         unweighed_why=unweighed_why)


def _weighed(paint):
    """With the cost model on: ((nodes with a float type whose output shapes are all known,
    nodes with a float type), the names of the others, why the graph has no shapes at all or
    None); else (None, (), None). A function body's return-value stand-ins do not count."""
    if paint.cost is None:
        return None, (), None
    table = paint.static_shapes()
    known = _shapes.known_nodes(paint.view, table)
    floats = (types_pb2.DT_FLOAT, paint.half_enum)
    typed = [node.name for i, node in enumerate(paint.view.nodes)
             if any(paint.v_dtype[v] in floats for v in paint.node_vertex[i].values())
             and not node.name.startswith(RET_PREFIX)]
    unknown = tuple(name for name in typed if name not in known)
    return (len(typed) - len(unknown), len(typed)), unknown, getattr(table, "why", None)


def merge_function_reports(report, function_reports):
    """One report for a graph and the bodies of its library functions."""
    decisions = dict(report.decisions)
    total, converted, casts = report.total_nodes, report.converted_nodes, report.casts_added
    already_half = report.already_half_nodes
    cast_names = list(report.cast_names)
    saving, changed = report.predicted_saving, report.predicted_changed
    elementwise = report.predicted_elementwise
    weighed, why = report.weighed_nodes, report.unweighed_why
    unweighed = list(report.unweighed_nodes)
    for function, sub in function_reports.items():
        saving += sub.predicted_saving
        changed += sub.predicted_changed
        elementwise += sub.predicted_elementwise
        if sub.weighed_nodes is not None:
            weighed = tuple(a + b for a, b in zip(weighed or (0, 0), sub.weighed_nodes))
            why = why or (sub.unweighed_why and f"function {function}: {sub.unweighed_why}")
            unweighed.extend(f"{function}/{name}" for name in sub.unweighed_nodes)
        for name, d in sub.decisions.items():
            if name.startswith(RET_PREFIX) or (d.op == "Placeholder" and not d.converted):
                continue  # the conversion's stand-ins for arguments and return values
            decisions[f"{function}/{name}"] = dataclasses.replace(d, function=function)
            total += 1
            converted += d.converted
            already_half += d.colour == "allow" and not d.converted
        casts += sub.casts_added
        cast_names.extend(f"{function}/{c}" for c in sub.cast_names)
    return dataclasses.replace(report, total_nodes=total, converted_nodes=converted,
                               already_half_nodes=already_half,
                               casts_added=casts, cast_names=tuple(cast_names),
                               decisions=decisions, functions=tuple(function_reports),
                               predicted_saving=saving, predicted_changed=changed,
                               predicted_elementwise=elementwise,
                               weighed_nodes=weighed, unweighed_nodes=tuple(unweighed),
                               unweighed_why=why)


def recount_casts(report, before, after, kept):
    """The report after values were kept half across loop, call and TensorList boundaries
    (`kept`: the Counts of rewrite.boundaries): Casts counted again in every graph."""

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
