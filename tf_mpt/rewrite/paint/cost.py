"""The cost model's facts: static shapes, and what one vertex costs in half vs float32.

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

import math

from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.rewrite.paint import contractions as _contractions
from tf_mpt.rewrite.paint import flops as _flops
from tf_mpt.rewrite.paint import op_costs as _op_costs
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

# What TensorFlow's remapper fuses into a preceding matrix product or convolution (in
# float32 and bfloat16 alike): BiasAdd, then Add (a residual) and an activation (see fusion).
FUSED_AFTER_CONTRACTION = frozenset(("BiasAdd", "Relu", "Relu6", "Elu", "LeakyRelu", "Tanh",
                                     "Sigmoid", "Add", "AddV2"))


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


# Ops of the main graph that call library functions: (function attrs, first data input that
# is the functions' first argument).
_CALLERS = {"While": (("body", "cond"), 0), "StatelessWhile": (("body", "cond"), 0),
            "If": (("then_branch", "else_branch"), 1),
            "StatelessIf": (("then_branch", "else_branch"), 1),
            "PartitionedCall": (("f",), 0), "StatefulPartitionedCall": (("f",), 0)}


def call_argument_shapes(graph_def, shape_table):
    """{function name: [static shape or None per argument]} from the main graph's calls
    (While, If, PartitionedCall); an argument whose callers disagree is None."""
    found = {}
    for node in graph_def.node:
        if node.op not in _CALLERS:
            continue
        attrs, first = _CALLERS[node.op]
        shapes = []
        for ref in [t for t in node.input if not t.startswith("^")][first:]:
            name, _, port = ref.partition(":")
            entry = shape_table.get(name)
            port = int(port or 0)
            shapes.append(entry[port] if entry is not None and port < len(entry) else None)
        for attr in attrs:
            if attr not in node.attr:
                continue
            name = node.attr[attr].func.name
            if name in found:
                found[name] = [a if a == b else None for a, b in zip(found[name], shapes)]
            else:
                found[name] = shapes
    return found


def loop_bodies(graph_def):
    """Names of the functions a While of the graph or of any function runs as its body."""
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return {node.attr["body"].func.name for node in nodes
            if node.op in ("While", "StatelessWhile") and "body" in node.attr}


def function_body_shapes(body, fdef, library, caller_shapes):
    """{node name: output shapes} of a function body (a GraphDef from
    function_bodies.function_to_graph_def) by TensorFlow's shape inference, its arguments
    shaped by the FunctionDef's `_output_shapes` arg attrs or else by its callers'; {} when
    TensorFlow cannot import it."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    graph_def = type(body)()
    functions = {f.signature.name: f for f in library.function}
    needed, stack = set(), [n for n in body.node]
    while stack:  # only the functions the body calls, directly or not
        for func in _function_bodies.called_functions(stack.pop()):
            if func.name in functions and func.name not in needed:
                needed.add(func.name)
                stack.extend(functions[func.name].node_def)
    graph_def.library.function.extend(functions[name] for name in sorted(needed))
    # the return-value Identity nodes have names TensorFlow refuses; nothing else reads them
    graph_def.node.extend(n for n in body.node if not n.name.startswith("__"))
    args = {arg.name: k for k, arg in enumerate(fdef.signature.input_arg)}
    for node in graph_def.node:
        k = args.get(node.name)
        if node.op != "Placeholder" or k is None:
            continue
        attrs = fdef.arg_attr[k].attr if k in fdef.arg_attr else {}
        if "_output_shapes" in attrs and attrs["_output_shapes"].list.shape:
            node.attr["shape"].shape.CopyFrom(attrs["_output_shapes"].list.shape[0])
        elif caller_shapes and k < len(caller_shapes) and caller_shapes[k] is not None:
            for d in caller_shapes[k]:
                node.attr["shape"].shape.dim.add(size=d)
    try:
        with tf.Graph().as_default() as graph:
            tf.graph_util.import_graph_def(graph_def, name="")
    except Exception:  # pylint: disable=broad-except
        return {}  # a body TensorFlow cannot import alone: its sizes stay unknown
    return shapes_of_graph(graph)


def _batch_unknown(shape):
    return shape is not None and len(shape) > 1 and shape[0] == -1 and \
        all(d >= 0 for d in shape[1:])


def _declared_batch_open(node):
    return node.op == "Placeholder" and "shape" in node.attr and \
        not node.attr["shape"].shape.unknown_rank and \
        _batch_unknown(tuple(d.size for d in node.attr["shape"].shape.dim))


def batch_left_open(view, fetched):
    """Whether a placeholder the `fetched` nodes (names; none: every node) read, directly or
    not, is declared [None, d1, ...] with the other dimensions known: the graph is fed
    batches of any size. Only then is a batch assumed (a graph fed a known batch that
    leaves a leading dimension unknown inside, a loop's iteration count, a tiling, a
    function traced first for any batch, has no batch to assume there). A placeholder no
    fetch reads does not count: a tf_keras model called on a placeholder of the script's
    leaves the layers it built on its own Input [None, ...] in the graph."""
    open_placeholders = {i for i, node in enumerate(view.nodes) if _declared_batch_open(node)}
    if not open_placeholders:
        return False
    stack = [view.index[name] for name in fetched if name in view.index]
    if not stack:
        return True
    seen = set(stack)
    while stack:
        i = stack.pop()
        if i in open_placeholders:
            return True
        for j in [src for src, _ in view.fanin[i]] + view.control_fanin[i]:
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return False


def leading_size(values):
    """The one leading size of `values` (a call's arguments, the arrays a Session.run feeds:
    a batch of data), or None where none has one or they disagree. Variables are not data.
    Reads only `shape` (nothing is converted) and never raises."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    sizes = set()
    try:
        for value in tf.nest.flatten(values):
            shape = getattr(value, "shape", None)
            if shape is None or isinstance(value, tf.Variable):
                continue
            if isinstance(shape, tf.TensorShape):
                shape = shape.as_list() if shape.rank is not None else ()
            dims = tuple(shape)
            if dims and isinstance(dims[0], int) and dims[0] > 0:
                sizes.add(dims[0])
    except Exception:  # pylint: disable=broad-except
        return None
    return sizes.pop() if len(sizes) == 1 else None


class AssumedBatch(dict):
    """A shape table whose unknown leading dimensions read as `batch`; `assumed`: the names
    of the nodes with such an output."""

    def __init__(self, table, batch):
        super().__init__(table)
        self.batch, self.assumed = batch, set()
        for name, entry in table.items():
            if entry and any(_batch_unknown(s) for s in entry):
                self[name] = [(batch,) + tuple(s[1:]) if _batch_unknown(s) else s
                              for s in entry]
                self.assumed.add(name)


def with_assumed_batch(shape_source, batch):
    """A shape source (a callable giving a shape table) whose tables read an unknown leading
    dimension as `batch` where only that dimension is unknown: a graph fed [None, ...]
    batches (batch_left_open) is costed at that size (TF_MPT_COST_BATCH) rather than left to
    the op lists. `batch` 0: the source itself."""
    if not batch:
        return shape_source
    return lambda: AssumedBatch(shape_source(), batch)


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


def _swish_role(view, i):
    """'inside' for the Sigmoid and inner Mul of a swish, 'outer' for its outer Mul, or
    None."""
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


def fusion(view, i, depth=3):
    """How TensorFlow's remapper runs node i on this CPU: 'both' (inside the kernel before
    it, in float32 and in half alike), 'float32' (inside it in float32 only), or None.

        contraction -> BiasAdd -> [Add] -> [activation]      'both'  (one fused kernel)
        the Sigmoid (and beta * x) of x * sigmoid(beta * x)   'both'  (inside Swish)
        Conv2D / depthwise -> FusedBatchNorm (inference)
            -> [Relu, Relu6, Elu, LeakyRelu]                  'float32' (unfused in half)
        FusedBatchNorm (training) -> Relu                     'both'  (_FusedBatchNormEx;
            its other outputs may feed the gradient, its first only the Relu: DenseNet121's
            training step runs no Relu kernel in float32, Grappler's bfloat16 or tf_mpt's)
    """
    node = view.nodes[i]
    role = _swish_role(view, i)
    if role == "inside":
        return "both"
    if not view.fanin[i] or depth == 0:
        return None
    src, port = view.fanin[i][0]
    if node.op == "Relu" and port == 0 and _cost_key(view.nodes[src]) == "FusedBatchNormV3" \
            and [dst for dst, _ in view.fanout_of(src).get(0, ())] == [i] \
            and not view.has_control_fanout[src]:
        return "both"  # training batch norm + Relu: one _FusedBatchNormEx kernel
    if _only_reader(view, src) != i:
        return None
    src_op = view.nodes[src].op
    if _cost_key(node) == "FusedBatchNormV3:inference":
        return "float32" if src_op in ("Conv2D", "DepthwiseConv2dNative") else None
    if src_op in _contractions.FUSING_OPS:
        return "both" if node.op == "BiasAdd" else None
    if node.op in FUSED_AFTER_CONTRACTION or role == "outer":
        before = fusion(view, src, depth - 1)
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
            op, transposed, lambda port: _dims(shapes.input(i, port)),
            lambda port: _dims(shapes.output(i, port)),
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


def _shape_text(shapes, i, ports):
    return " x ".join("[" + "x".join(str(d) for d in (shapes.input(i, port) or ())) + "]"
                      for port in ports)


def vertex_cost(p, shapes, costs, v, node_seconds=None):
    """(seconds v's half kernel takes more than float32's, or None if unknown, a phrase
    saying what was measured, seconds its float32 kernel takes), e.g. (1.2e-05, 'bfloat16
    Sigmoid over 8192 elements measured 2.41x slower than float32 here', 8.6e-06).

    node_seconds: (float32, half) seconds measured for this very node (a matrix product or
    convolution at its shapes), used instead of the op's line when given.
    """
    i = p.v_node[v]
    node = p.view.nodes[i]
    key = _cost_key(node)
    if node_seconds is not None:
        single, half = node_seconds
        ports = [port for port in range(len(p.view.fanin[i]))
                 if (node.op, port) not in _op_costs.SIZE_INPUTS]
        what = f"{costs.dtype} {node.op} {_shape_text(shapes, i, ports)}"
        return half - single, f"{what} {_ratio(single, half)}", single
    fused = fusion(p.view, i)
    if key in _op_costs.FREE_OPS or fused == "both":
        return 0.0, "", 0.0
    if _swish_role(p.view, i) == "outer":
        key = "Swish"
    if not costs.knows(key):
        return None, "", None
    units = _units(p, shapes, v, key)
    if units is None:
        return None, "", None
    half, single = costs.time(key, units, True), costs.time(key, units, False)
    if fused == "float32":
        return half, (f"{costs.dtype} {node.op} over {units} elements runs as its own kernel "
                      "here, while float32 fuses it into the convolution before it"), 0.0
    what = (f"{units / 1e6:.2g} MFLOP" if key in _contractions.FLOP_OPS
            else f"{units} elements")
    return (half - single, f"{costs.dtype} {node.op} over {what} {_ratio(single, half)}",
            single)


def _ratio(single, half):
    if half > single:
        return f"measured {half / single:.2f}x slower than float32 here" if single else ""
    return f"measured {single / half:.2f}x faster than float32 here" if half else ""


def costs_for(target, config, dtype_enum):
    """The OpCosts the decisions for `target` (a tf_mpt.targets.Target) read, or None for the
    `rules` target (the cost model off: the op lists decide)."""
    name = "bfloat16" if dtype_enum == ta.DT_BFLOAT16 else "float16"
    return _op_costs.table_for(target, config, name)
