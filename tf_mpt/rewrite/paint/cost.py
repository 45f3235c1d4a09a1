"""The cost model: keep a half-precision cluster float32 when its Casts cost more than it saves.

Grappler converts by op name, so a tiny MatMul pays two Casts and a slower small-size half
kernel for nothing. After the painting passes, the converted vertices form connected clusters;
for each cluster whose MatMul/Conv ops and boundary tensors all have static shapes:

    saved  = sum over its MatMul/Conv ops of  t_fp32(flops) - t_half(flops),
             t(flops) = op overhead + flops / FLOP rate
    cost   = sum over the Casts it needs of   cast overhead + elements * time per element
             (one Cast per boundary tensor; a float32 Const read by the cluster is stored
              in half and needs none)

and the cluster goes back to float32 if saved < cost, provided the flips of the whole graph
save at least NOISE_FLOOR per run (otherwise nothing changes). A cluster with an allow op the model
cannot count (no FLOP formula) or a shape it does not know is left half: the model only acts
where it is sure.

The constants were measured with `python benchmarks/calibrate_cost_model.py` on an AMD Zen 4
CPU with native bfloat16 (2 cores); see README. There is no calibration for float16 (its
speed target is the GPU, and none was available), so the model is on by default for bfloat16
only (TF_MPT_COST_MODEL=auto); TF_MPT_COST_MODEL=1 applies the same constants to float16,
=0 turns the model off.
"""

import dataclasses
import math

from tf_mpt.rewrite.paint import flops as _flops
from tf_mpt.rewrite import type_attrs as ta


@dataclasses.dataclass(frozen=True)
class Constants:
    """Seconds per op and FLOP rates (FLOP/s) of one device and half type."""
    op_fp32: float
    op_half: float
    rate_fp32: float
    rate_half: float
    cast_op: float
    cast_element: float

    def op_saving(self, flops):
        return (self.op_fp32 + flops / self.rate_fp32) - (self.op_half + flops / self.rate_half)

    def cast_cost(self, elements):
        return self.cast_op + elements * self.cast_element


# A graph is changed only if the model's flips save at least this much per run in all: below
# it the difference drowns in Session.run overhead and timing noise (tens of microseconds),
# and a tiny graph keeps the name-based decisions.
NOISE_FLOOR = 50e-6

# benchmarks/calibrate_cost_model.py on Zen 4 (avx512_bf16), bfloat16.
CPU_BFLOAT16 = Constants(op_fp32=2.0e-6, op_half=4.0e-6, rate_fp32=100e9, rate_half=190e9,
                         cast_op=0.7e-6, cast_element=0.3e-9)


def _dims(shape):
    return None if shape is None or any(d is None or d < 0 for d in shape) else list(shape)


def output_shapes_from_attrs(view):
    """{node name: [shape or None per output]} from `_output_shapes` attrs (as written by
    as_graph_def(add_shapes=True)); nodes without the attr are absent."""
    shapes = {}
    for node in view.nodes:
        if "_output_shapes" in node.attr:
            shapes[node.name] = [
                None if s.unknown_rank else tuple(d.size for d in s.dim)
                for s in node.attr["_output_shapes"].list.shape]
    return shapes


def shapes_of_graph(graph):
    """{op name: [static shape or None per output]} of a tf.Graph (or FuncGraph)."""
    shapes = {}
    for op in graph.get_operations():
        entry = []
        for tensor in op.outputs:
            shape = tensor.shape
            entry.append(None if shape.rank is None else tuple(
                -1 if d is None else d for d in shape.as_list()))
        shapes[op.name] = entry
    return shapes


class Shapes:
    def __init__(self, view, shapes):
        self.view, self.shapes = view, shapes

    def output(self, i, port):
        entry = self.shapes.get(self.view.nodes[i].name)
        return None if entry is None or port >= len(entry) else entry[port]

    def input(self, i, port):
        src, src_port = self.view.fanin[i][port]
        return self.output(src, src_port)

    def elements(self, i, port):
        dims = _dims(self.output(i, port))
        return None if dims is None else math.prod(dims)


def connected_components(p, members):
    """Connected components of the vertex set `members` (through its own vertices only),
    each in the order found, the components in order of their first vertex."""
    seen, components = set(), []
    for start in sorted(members):
        if start in seen:
            continue
        seen.add(start)
        stack, component = [start], []
        while stack:
            v = stack.pop()
            component.append(v)
            for w in p.fanin[v] + p.fanout[v]:
                if w in members and w not in seen:
                    seen.add(w)
                    stack.append(w)
        components.append(component)
    return components


def _clusters(p):
    """Connected components of converted vertices (through converted vertices only)."""
    return connected_components(p, {v for v, c in enumerate(p.converted) if c})


def _boundary_tensors(p, members):
    """The (node, port) tensors that need a Cast around the cluster, or None if unknown."""
    tensors = set()
    view, types = p.view, p.types
    for v in members:
        i, key = p.v_node[v], p.v_key[v]
        nt = types[i]
        for port, in_key in enumerate(nt.in_keys):
            if in_key != key:
                continue
            src, src_port = view.fanin[i][port]
            src_key = (types[src].out_keys[src_port]
                       if src_port < len(types[src].out_keys) else None)
            sv = p.node_vertex[src].get(src_key) if src_key is not None else None
            if sv is not None and (sv in members or p.allow[sv]):
                continue
            if view.nodes[src].op == "Const":
                continue  # stored in half when every reader is half
            tensors.add((src, src_port))
        for port, out_key in enumerate(nt.out_keys):
            if out_key == key and any(c is None or (c not in members and not p.allow[c])
                                      for c in p.consumers_of_output(i, port)):
                tensors.add((i, port))
    return tensors


def keep_unprofitable_clusters_fp32(p):
    """The cost-model pass (see the module docstring).

    Kind: un-paint. Needs: the rules' final paint (after cast_the_selected_part_not_the_whole)
    and p.cost.
    """
    if p.cost is None:
        return
    constants, shape_table = p.cost
    shapes = Shapes(p.view, shape_table)
    flips, total_loss = [], 0.0
    for cluster in _clusters(p):
        estimate = _estimate(p, shapes, constants, cluster)
        if estimate is not None and estimate[0] < estimate[1]:
            flips.append((cluster, estimate))
            total_loss += estimate[1] - estimate[0]
    if total_loss < NOISE_FLOOR:
        return
    for cluster, (saved, cost) in flips:
        reason = (f"cost model: its cluster of {len(cluster)} would save ~{saved * 1e6:.1f} us "
                  f"in half but its Casts cost ~{cost * 1e6:.1f} us")
        for v in cluster:
            p.unpaint(v, reason)


def _estimate(p, shapes, constants, cluster):
    """(seconds half saves, seconds its Casts cost) of one cluster, or None if unknown or if
    the cluster has no allow op (the model weighs compute against Casts, nothing else)."""
    if not any(p.v_list[v] == "allow" for v in cluster):
        return None
    saved = 0.0
    for v in cluster:
        if p.v_list[v] != "allow":
            continue
        i = p.v_node[v]
        node = p.view.nodes[i]
        if node.op not in _flops.COUNTED_OPS:
            return None
        attr = _flops.transposed_attr(node.op)  # absent when default (false): never add it
        transposed = node.op in _flops.MATMUL_OPS and attr in node.attr and node.attr[attr].b
        flops = _flops.flops_from_shapes(
            node.op, transposed, lambda port, i=i: _dims(shapes.input(i, port)),
            lambda port, i=i: _dims(shapes.output(i, port)))
        if flops is None:
            return None
        saved += constants.op_saving(flops)
    cost = 0.0
    for i, port in _boundary_tensors(p, set(cluster)):
        elements = shapes.elements(i, port)
        if elements is None:
            return None
        cost += constants.cast_cost(elements)
    return saved, cost


def constants_for(setting, dtype_enum):
    """The Constants to use, or None when the model is off for this setting and dtype."""
    if setting == "0":
        return None
    if setting == "auto" and dtype_enum != ta.DT_BFLOAT16:
        return None
    return CPU_BFLOAT16
