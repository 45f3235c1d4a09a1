"""tf_mpt against Grappler's AMP on loop, TensorArray and function-call graphs: Casts, converted
nodes, and float32 walls at call and loop boundaries.

The graphs are those of tests/integration/test_grappler_compare.py (v1 and v2 while loop +
cond, the v1 LSTM over a TensorArray with its gradients, a tf.function with a call and a cond).
Grappler's pass runs alone in a subprocess (tests/support/grappler_oracle.py); for bfloat16 it is
skipped with the reason where TensorFlow runs it as a no-op (no AVX512F).

A float32 wall is a value that is half on both sides of a While / call / If boundary but
crosses it as float32 between two Casts: a loop or call input produced by a Cast to float32
and read inside by a Cast to half, or a result returned through a Cast to float32 and read
outside by a Cast to half. Counted in the main graph's boundaries.

Usage: python benchmarks/control_flow_compare.py
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_REPO, "tests"))
sys.path.insert(0, os.path.join(_REPO, "tests", "integration"))
sys.path.insert(0, os.path.join(_REPO, "tests", "support"))

import grappler_oracle  # noqa: E402
import test_grappler_compare as cases  # noqa: E402
import tf_mpt  # noqa: E402
from tf_mpt.rewrite.boundaries.calls import CALL_OPS  # noqa: E402

CASES = ("loop_and_cond_control_flow_v1", "loop_and_cond_control_flow_v2",
         "lstm_tensor_array_control_flow_v1", "function_call_and_cond")
BOUNDARY_OPS = dict(CALL_OPS, While=(("body", "cond"), 0), StatelessWhile=(("body", "cond"), 0))
DT_FLOAT = 1


def _cast_to(node, float32):
    if node is None or node.op != "Cast":
        return False
    return (node.attr["DstT"].type == DT_FLOAT) == float32


def _functions(node):
    attrs, _ = BOUNDARY_OPS[node.op]
    names = []
    for attr in attrs:
        value = node.attr[attr]
        names.extend(f.name for f in value.list.func) if attr == "branches" else names.append(
            value.func.name)
    return names


def float32_walls(graph_def):
    """Values half on both sides of a main-graph boundary that cross it as float32."""
    library = {f.signature.name: f for f in graph_def.library.function}
    nodes = {n.name: n for n in graph_def.node}
    walls = 0
    for node in graph_def.node:
        if node.op not in BOUNDARY_OPS:
            continue
        bodies = [library[name] for name in _functions(node) if name in library]
        _, offset = BOUNDARY_OPS[node.op]
        for k, tensor in enumerate(list(node.input)[offset:]):
            if tensor.startswith("^") or not _cast_to(nodes.get(tensor.split(":")[0]), True):
                continue
            for body in bodies:
                if k >= len(body.signature.input_arg):
                    continue
                arg = body.signature.input_arg[k].name
                readers = [n for n in body.node_def if arg in n.input]
                if readers and all(_cast_to(n, False) for n in readers):
                    walls += 1
                    break
        for body in bodies[:1] if node.op in ("While", "StatelessWhile") else bodies:
            for k, out in enumerate(body.signature.output_arg):
                ret = {n.name: n for n in body.node_def}.get(body.ret[out.name].split(":")[0])
                if not _cast_to(ret, True):
                    continue
                port = node.name if k == 0 else f"{node.name}:{k}"
                readers = [n for n in graph_def.node if port in n.input]
                if any(_cast_to(n, False) for n in readers):
                    walls += 1
                    break
    return walls


def main():
    built = cases._cases()  # pylint: disable=protected-access
    support = grappler_oracle.native_bf16()
    print(f"CPU: {support.cpu_model}; native bfloat16: {support.native}.")
    rows = []
    for dtype in ("float16", "bfloat16"):
        results = grappler_oracle.run_grappler_amp_batch(
            [(built[name].graph_def, built[name].fetches) for name in CASES], dtype,
            timeout=300.0)
        for name, (grappler_def, info) in zip(CASES, results):
            case = built[name]
            ours = tf_mpt.rewrite_graph_def(case.graph_def, dtype=dtype, fetches=case.fetches)
            our_casts = len(grappler_oracle.added_casts(case.graph_def, ours.graph_def,
                                                        grappler_oracle.TF_MPT_CAST_SUFFIX))
            our_nodes = len(grappler_oracle.converted_nodes(case.graph_def, ours.graph_def,
                                                            dtype))
            if info["skip_reason"] is not None:
                rows.append(f"| {name} | {dtype} | {our_casts} | n/a | {our_nodes} | n/a | "
                            f"{float32_walls(ours.graph_def)} | n/a ({info['skip_reason']}) |")
                continue
            their_nodes = len(grappler_oracle.converted_nodes(case.graph_def, grappler_def,
                                                              dtype))
            rows.append(f"| {name} | {dtype} | {our_casts} | {len(info['casts'])} | "
                        f"{our_nodes} | {their_nodes} | {float32_walls(ours.graph_def)} | "
                        f"{float32_walls(grappler_def)} |")
    print("| graph | dtype | tf_mpt Casts | Grappler Casts | tf_mpt converted nodes | "
          "Grappler converted nodes | tf_mpt float32 walls | Grappler float32 walls |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
