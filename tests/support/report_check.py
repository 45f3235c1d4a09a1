"""The report of a rewrite held against the graph that runs: the per-node decisions are those
of the picked candidate's graph (issue "one verdict", item 2)."""

from tf_mpt._dtypes import parse
from tf_mpt.choose import candidates as _candidates


def assert_report_is_the_graphs(result):
    """Each node the report says converted holds the half type in `result.graph_def`, each
    other node it decided holds no half type (but one already half in the input: allowed,
    not converted), and `converted_nodes` counts the converted ones. Returns (converted,
    float32) counts of the nodes decided, as the graph holds them."""
    report = result.report
    half = parse(report.dtype).enum
    nodes = _candidates.nodes_by_decision_name(result.graph_def)
    converted, float32, wrong = 0, 0, []
    for name, decision in report.decisions.items():
        node = nodes.get(name)
        if node is None:
            continue
        held = _candidates.holds_half(node, half)
        if decision.converted:
            converted += 1
            if not held:
                wrong.append(f"{name} ({node.op}): reported converted, runs float32")
        elif held and decision.colour != "allow":
            wrong.append(f"{name} ({node.op}): reported {decision.colour}, runs half")
        elif not held:
            float32 += 1
    assert not wrong, wrong[:10]
    assert report.converted_nodes == sum(d.converted for d in report.decisions.values()), \
        (report.converted_nodes, sum(d.converted for d in report.decisions.values()))
    return converted, float32
