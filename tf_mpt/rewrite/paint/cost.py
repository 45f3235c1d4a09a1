"""The cost model's facts: what a vertex and a Cast cost in half vs float32, fusions, floors.

The decisions are made by `cuts.choose_precision_by_measured_cost`, a minimum cut whose
weights come from here:

    vertex  = its op's half kernel time minus its float32 kernel time (op_costs: measured on
              this machine), at the vertex's size: FLOPs for matrix products and
              convolutions, elements (the largest input or output) otherwise
    Cast    = a Cast's measured time at the tensor's elements

An op that TensorFlow's remapper fuses into the kernel before it (`fusion`: BiasAdd, an Add
and an activation after a matrix product or convolution; x * sigmoid(x) as one Swish) costs
0 in either dtype, or, where only float32 fuses it (an inference batch norm after a
convolution, as measured on Zen 4: `python benchmarks/real_models.py --profile`), its half
time.
A matrix product or convolution whose size is unknown is left half; an op that was not
measured costs 0 (only its Casts count). The model is on by default for bfloat16 only
(TF_MPT_COST_MODEL=auto); TF_MPT_COST_MODEL=1 applies this CPU's float16 times to float16,
=0 turns it off.
"""

import typing

from tf_mpt import _cpu
from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.costs import contractions as _contractions
from tf_mpt.costs import flops as _flops
from tf_mpt.costs import op_costs as _op_costs
from tf_mpt.rewrite.paint import shapes as _shapes
from tf_mpt.rewrite import type_attrs as ta


# A graph is changed only if the model's changes save at least this much per run in all:
# below it the difference drowns in Session.run overhead and timing noise (tens of
# microseconds), and a tiny graph keeps the name-based decisions.
NOISE_FLOOR = 50e-6
# ... and at least this share of the float32 time of the kernels it weighs: its kernel times
# are probes' (each op alone, or a node in a chain of its copies), and a change predicted to
# save less than the error they carry into a big graph is a guess. ResNet50's training step
# (~700 ms of float32 kernels): the model predicted 4 ms (0.6%) from keeping 181 nodes
# float32 (51 BiasAddGrads among them) and the step ran 3% slower than all-bfloat16.
RELATIVE_FLOOR = 0.02



def noise_floor(loop_body):
    """The seconds a graph's changes must save per run: NOISE_FLOOR, or 0 in a While body,
    whose savings repeat every iteration."""
    return 0.0 if loop_body else NOISE_FLOOR


def floor(noise, float32_time):
    """The least saving (seconds per run) worth a change: the larger of the graph's noise
    floor (noise_floor) and RELATIVE_FLOOR of its weighed kernels' float32 time."""
    return max(noise, RELATIVE_FLOOR * float32_time)


def choose_colouring(over_rules, over_float32, rules_slower, least):
    """The floor rule, over a graph's weighed regions: 'rules' (keep the rules' colours R),
    'float32' (all weighed regions float32, F) or 'best' (the cheapest colouring B).

    over_rules / over_float32: seconds B saves per run over R / over F; rules_slower: R is
    slower than F; least: floor(...). R stays when B saves less than the floor over it and R
    is not slower than F (the rules' half colours never cost more than float32 by the model);
    F when R is slower than F and B's half saves less than the floor over F (a half region
    that saves less is not worth its Casts); else B.
    """
    if over_rules < least and not rules_slower:
        return "rules"
    if rules_slower and over_float32 < least:
        return "float32"
    return "best"


# What TensorFlow's remapper fuses into a preceding matrix product or convolution (in
# float32 and bfloat16 alike): BiasAdd, then Add (a residual) and an activation (see fusion).
FUSED_AFTER_CONTRACTION = frozenset(("BiasAdd", "Relu", "Relu6", "Elu", "LeakyRelu", "Tanh",
                                     "Sigmoid", "Add", "AddV2"))


def loop_bodies(graph_def):
    """Names of the functions a While of the graph or of any function runs as its body."""
    return {node.attr["body"].func.name for node in _function_bodies.all_nodes(graph_def)
            if node.op in ("While", "StatelessWhile") and "body" in node.attr}


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


def _only_reader(view, i):
    """The node index reading node i, if exactly one node reads it."""
    readers = view.readers(i)
    return next(iter(readers)) if len(readers) == 1 else None


def swish_parts(view, i):
    """For the Sigmoid of x * sigmoid(x) or x * sigmoid(beta * x) (Keras's swish, beta a
    Const), which TensorFlow's remapper runs as one Swish kernel: (the outer Mul, the inner
    Mul or None); else None. The Sigmoid and the inner Mul must be read only by the next."""
    if view.nodes[i].op != "Sigmoid" or not view.fanin[i]:
        return None
    src = view.fanin[i][0][0]
    x, inner = src, None
    if view.nodes[src].op == "Mul" and _only_reader(view, src) == i:
        others = [s for s, _ in view.fanin[src] if view.nodes[s].op != "Const"]
        if len(others) == 1 and len(view.fanin[src]) == 2:
            x, inner = others[0], src
    mul = _only_reader(view, i)
    if mul is None or view.nodes[mul].op != "Mul":
        return None
    inputs = {s for s, _ in view.fanin[mul]}
    if inputs == {i, x}:
        return mul, inner
    return (mul, None) if inputs == {i, src} else None


def _swish_role(view, i, fusions=_cpu.REMAPPER_FUSIONS):
    """'inside' for the Sigmoid and inner Mul of a swish, 'outer' for its outer Mul, or
    None (also where the target does not fuse a swish)."""
    if "swish" not in fusions:
        return None
    node = view.nodes[i]
    if node.op == "Sigmoid":
        return "inside" if swish_parts(view, i) is not None else None
    if node.op != "Mul":
        return None
    for src, _ in view.fanin[i]:
        if view.nodes[src].op == "Sigmoid":
            parts = swish_parts(view, src)
            if parts is not None and parts[0] == i:
                return "outer"
    readers = _only_reader(view, i)
    if readers is not None and view.nodes[readers].op == "Sigmoid":
        parts = swish_parts(view, readers)
        if parts is not None and parts[1] == i:
            return "inside"
    return None


def fusion(view, i, fusions=_cpu.REMAPPER_FUSIONS, depth=3):
    """How TensorFlow's remapper runs node i on a target with `fusions`
    (_cpu.REMAPPER_FUSIONS names): 'both' (inside the kernel before it, in float32 and in
    half alike), 'float32' (inside it in float32 only), or None.

        contraction -> BiasAdd -> [Add] -> [activation]      'both'  (one fused kernel;
                                                             contraction_bias_activation)
        the Sigmoid (and beta * x) of x * sigmoid(beta * x)   'both'  (inside Swish; swish)
        Conv2D / depthwise -> FusedBatchNorm (inference)
            -> [Relu, Relu6, Elu, LeakyRelu]                  'float32' (unfused in half;
                                                             conv_batch_norm)
        FusedBatchNorm (training) -> Relu                     'both'  (_FusedBatchNormEx;
            batch_norm_relu; its other outputs may feed the gradient, its first only the
            Relu: DenseNet121's training step runs no Relu kernel in float32, Grappler's
            bfloat16 or tf_mpt's)
    """
    node = view.nodes[i]
    role = _swish_role(view, i, fusions)
    if role == "inside":
        return "both"
    if not view.fanin[i] or depth == 0:
        return None
    src, port = view.fanin[i][0]
    if node.op == "Relu" and port == 0 and _cost_key(view.nodes[src]) == "FusedBatchNormV3" \
            and [dst for dst, _ in view.fanout_of(src).get(0, ())] == [i] \
            and not view.has_control_fanout[src]:
        # training batch norm + Relu: one _FusedBatchNormEx kernel
        return "both" if "batch_norm_relu" in fusions else None
    if _only_reader(view, src) != i:
        return None
    src_op = view.nodes[src].op
    if _cost_key(node) == "FusedBatchNormV3:inference":
        return "float32" if src_op in ("Conv2D", "DepthwiseConv2dNative") and \
            "conv_batch_norm" in fusions else None
    if src_op in _contractions.FUSING_OPS:
        return "both" if node.op == "BiasAdd" and \
            "contraction_bias_activation" in fusions else None
    if node.op in FUSED_AFTER_CONTRACTION or role == "outer":
        before = fusion(view, src, fusions, depth - 1)
        if before == "float32" and node.op in ("Relu", "Relu6", "Elu", "LeakyRelu"):
            return "float32"
        return "both" if before == "both" else None
    return None


def _units(p, shapes, v, op):
    """FLOPs (matrix products, convolutions) or elements (the largest input or output) of
    vertex v's node; None if a shape it needs is unknown."""
    i = p.v_node[v]
    node = p.view.nodes[i]
    if op in _contractions.FLOP_OPS:
        attr = _flops.transposed_attr(op) if op in _contractions.MATMUL_OPS else None
        transposed = attr is not None and attr in node.attr and node.attr[attr].b
        return _flops.flops_from_shapes(
            op, transposed, lambda port: _shapes.dims(shapes.input(i, port)),
            lambda port: _shapes.dims(shapes.output(i, port)),
            equation=node.attr["equation"].s.decode() if "equation" in node.attr else None)
    sizes = [shapes.elements(i, port) for port in range(len(p.types[i].out_keys))]
    sizes += [shapes.elements(*source) for source in p.view.fanin[i]]
    known = [s for s in sizes if s is not None]
    return max(known) if known else None


def _cost_key(node):
    op = node.op
    if op in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"):
        training = "is_training" not in node.attr or node.attr["is_training"].b
        return "FusedBatchNormV3" if training else "FusedBatchNormV3:inference"
    if op in ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"):
        return "FusedBatchNormGradV3"
    return op


def node_spec(p, shapes, v):
    """The op_costs.node_spec key of vertex v's node (a matrix product or convolution with
    static shapes), or None."""
    i = p.v_node[v]
    node = p.view.nodes[i]
    if node.op not in _contractions.NODE_TIMED_OPS:
        return None
    ports = range(len(p.view.fanin[i]))
    return _op_costs.node_spec(
        node, [shapes.input(i, port) for port in ports], shapes.output(i, 0),
        [p.view.nodes[p.view.fanin[i][port][0]].op == "Const" for port in ports])


def cost_keys(view):
    """The op types (op_costs keys) a graph's vertices may be costed as: what the measuring
    step has this CPU's table hold before the cost model decides."""
    keys = {_cost_key(node) for node in view.nodes}
    if "Sigmoid" in keys:
        keys.add("Swish")
    return keys


def workloads(view, shape_table):
    """The op_costs.node_spec keys of every float32 matrix product and convolution of a graph
    with static shapes: what the cost model may ask times for, collected before it decides
    (the measuring step times them; the decisions only read)."""
    shapes = _shapes.Shapes(view, shape_table)
    found = set()
    for i, node in enumerate(view.nodes):
        if node.op not in _contractions.NODE_TIMED_OPS or \
                node.attr["T"].type != ta.DT_FLOAT:
            continue
        ports = range(len(view.fanin[i]))
        spec = _op_costs.node_spec(
            node, [shapes.input(i, port) for port in ports], shapes.output(i, 0),
            [view.nodes[view.fanin[i][port][0]].op == "Const" for port in ports])
        if spec is not None:
            found.add(spec)
    return found


def _shape_text(shapes, i, ports):
    return " x ".join("[" + "x".join(str(d) for d in (shapes.input(i, port) or ())) + "]"
                      for port in ports)


class VertexCost(typing.NamedTuple):
    """What one vertex costs: `extra`, the seconds its half kernel takes more than float32's
    (None: unknown); `what`, a phrase saying what was measured; `float32`, the seconds its
    float32 kernel takes (None: unknown). E.g. VertexCost(1.2e-05, 'bfloat16 Sigmoid over
    8192 elements measured 2.41x slower than float32 here', 8.6e-06)."""
    extra: typing.Optional[float]
    what: str
    float32: typing.Optional[float]


def vertex_cost(p, shapes, target, v, node_seconds=None):
    """The VertexCost of vertex v on `target` (a bound tf_mpt.targets.Target: its table and
    fusions).

    node_seconds: the op_costs.NodeTime measured for this very node (a matrix product or
    convolution at its shapes), used instead of the op's line when given.
    """
    costs = target.costs
    i = p.v_node[v]
    node = p.view.nodes[i]
    key = _cost_key(node)
    if node_seconds is not None:
        single, half = node_seconds
        ports = [port for port in range(len(p.view.fanin[i]))
                 if (node.op, port) not in _op_costs.SIZE_INPUTS]
        what = f"{costs.dtype} {node.op} {_shape_text(shapes, i, ports)}"
        return VertexCost(half - single, f"{what} {_ratio(single, half, target.where)}",
                          single)
    fused = fusion(p.view, i, target.fusions)
    if key in _op_costs.FREE_OPS or fused == "both":
        return VertexCost(0.0, "", 0.0)
    if _swish_role(p.view, i, target.fusions) == "outer":
        key = "Swish"
    if not costs.knows(key):
        return VertexCost(None, "", None)
    units = _units(p, shapes, v, key)
    if units is None:
        return VertexCost(None, "", None)
    half, single = costs.time(key, units, True), costs.time(key, units, False)
    if fused == "float32":
        return VertexCost(half, f"{costs.dtype} {node.op} over {units} elements runs as its "
                          f"own kernel {target.where}, while float32 fuses it into the "
                          "convolution before it", 0.0)
    what = (f"{units / 1e6:.2g} MFLOP" if key in _contractions.FLOP_OPS
            else f"{units} elements")
    return VertexCost(half - single, f"{costs.dtype} {node.op} over {what} "
                      f"{_ratio(single, half, target.where)}", single)


def _ratio(single, half, where):
    if half > single:
        return f"measured {half / single:.2f}x slower than float32 {where}" if single else ""
    return f"measured {single / half:.2f}x faster than float32 {where}" if half else ""
