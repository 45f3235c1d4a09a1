"""Static shapes: what the cost model and the Cast-byte cut weigh (no costs here).

Sources, each a {node name: [static shape or None per output]} table (a dimension TensorFlow
does not know is -1):

    output_shapes_from_attrs   `_output_shapes` attrs (as_graph_def(add_shapes=True))
    graph_def_shapes           the attrs where every node has one, else TensorFlow's shape
                               inference over the GraphDef imported alone (a frozen graph,
                               a SavedModel's graph, rewrite_graph_def's input)
    shapes_of_graph            a tf.Graph's (or FuncGraph's) own inference, with the shapes
                               of the variables its resource handles hold
    function_body_shapes       a library function's body, imported alone, its arguments
                               shaped by its signature attrs or its callers
                               (call_argument_shapes)
    with_assumed_batch         a table whose unknown leading dimension reads as a batch size,
                               for a graph fed batches of any size (batch_left_open)

`Shapes` answers per vertex: a node's output or input shape and its element count.
"""

import math

from tf_mpt.rewrite import function_bodies as _function_bodies


def dims(shape):
    """`shape` as a list of ints, or None if it or a dimension is unknown."""
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


def has_all_shape_attrs(view):
    """Whether every node of the graph carries `_output_shapes`."""
    return all("_output_shapes" in node.attr for node in view.nodes)


class InferredShapes(dict):
    """A shape table with how it was made: `source` ('attrs', 'inferred' or 'none') and,
    for 'none', `why` (TensorFlow's error importing the graph)."""

    def __init__(self, table, source, why=None):
        super().__init__(table)
        self.variables = getattr(table, "variables", {})
        self.source, self.why = source, why


def graph_def_shapes(graph_def, view):
    """The static shapes of a GraphDef: its `_output_shapes` attrs where every node has one,
    else TensorFlow's own shape inference (the GraphDef imported into a new tf.Graph: its
    placeholders' declared shapes, its constants' and variables' shapes carried forward by
    each op's shape function), the attrs filling in nodes it could not shape. Where
    TensorFlow cannot import the graph (an op this process has not registered, say), the
    attrs alone, with `why`. Never raises."""
    attrs = output_shapes_from_attrs(view)
    if len(attrs) == len(view.nodes):
        return InferredShapes(attrs, "attrs")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    try:
        with tf.Graph().as_default() as graph:
            tf.graph_util.import_graph_def(graph_def, name="")
    except Exception as error:  # pylint: disable=broad-except
        first = (str(error).splitlines() or [""])[0].split(". ")[0]
        return InferredShapes(attrs, "none", f"{type(error).__name__}: {first}"[:200])
    table = shapes_of_graph(graph)
    for name, entry in attrs.items():
        if all(s is None for s in table.get(name, [None])):
            table[name] = entry
    return InferredShapes(table, "inferred")


def known_nodes(view, table):
    """Names of the nodes every output of which has a fully known static shape in `table`
    (a node with no outputs counts as known)."""
    known = set()
    for node in view.nodes:
        entry = table.get(node.name)
        if entry is not None and all(dims(s) is not None for s in entry):
            known.add(node.name)
    return known


class ShapeTable(dict):
    """{node name: [static shape or None per output]}, and `variables`: {(node name, port):
    static shape of the variable whose resource handle that output is} (a handle is a
    scalar; what the function bodies it is passed to read from it has this shape)."""

    def __init__(self):
        super().__init__()
        self.variables = {}


class VariableValue(tuple):
    """A function argument's entry in call_argument_shapes when the argument is a resource
    handle: the shape of the variable's value (the handle itself is a scalar)."""


def _handle_value_shape(tensor):
    """The static shape of the variable a graph tensor of dtype resource is a handle to,
    from TensorFlow's handle data; None if unknown."""
    from tensorflow.python.ops import handle_data_util  # pylint: disable=import-outside-toplevel
    try:
        data = handle_data_util.get_resource_handle_data(tensor)
    except Exception:  # pylint: disable=broad-except
        return None
    if not data.is_set or len(data.shape_and_type) != 1:
        return None
    shape = data.shape_and_type[0].shape
    return None if shape.unknown_rank else tuple(d.size for d in shape.dim)


def shapes_of_graph(graph):
    """ShapeTable of a tf.Graph (or FuncGraph): its ops' static output shapes, and the
    shapes of the variables its resource outputs are handles to."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    shapes = ShapeTable()
    for op in graph.get_operations():
        entry = []
        for port, tensor in enumerate(op.outputs):
            shape = tensor.shape
            entry.append(None if shape.rank is None else tuple(
                -1 if d is None else d for d in shape.as_list()))
            if tensor.dtype == tf.resource:
                value = _handle_value_shape(tensor)
                if value is not None:
                    shapes.variables[op.name, port] = value
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
    (While, If, PartitionedCall); an argument that is a variable's resource handle is the
    VariableValue of that variable's shape; an argument whose callers disagree is None."""
    found = {}
    variables = getattr(shape_table, "variables", {})  # (a ShapeTable's: shapes_of_graph)
    for node in graph_def.node:
        if node.op not in _CALLERS:
            continue
        attrs, first = _CALLERS[node.op]
        shapes = []
        for ref in [t for t in node.input if not t.startswith("^")][first:]:
            name, _, port = ref.partition(":")
            entry = shape_table.get(name)
            port = int(port or 0)
            if (name, port) in variables:
                shapes.append(VariableValue(variables[name, port]))
                continue
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


def function_body_shapes(body, fdef, library, caller_shapes):
    """{node name: output shapes} of a function body (a GraphDef from
    function_bodies.function_to_graph_def) by TensorFlow's shape inference, its arguments
    shaped by the FunctionDef's `_output_shapes` arg attrs or else by its callers'; a
    ReadVariableOp of a resource argument whose callers pass a variable of known shape
    (VariableValue) reads a value of that shape (imported alone, the body's handles carry
    no shapes: a loop body's matrix products would have unknown sizes); {} when TensorFlow
    cannot import it."""
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
    variables = {}  # argument placeholder name -> the shape of the variable it handles
    for node in graph_def.node:
        k = args.get(node.name)
        if node.op != "Placeholder" or k is None:
            continue
        attrs = fdef.arg_attr[k].attr if k in fdef.arg_attr else {}
        caller = caller_shapes[k] if caller_shapes and k < len(caller_shapes) else None
        if isinstance(caller, VariableValue):
            variables[node.name] = caller
        elif "_output_shapes" in attrs and attrs["_output_shapes"].list.shape:
            node.attr["shape"].shape.CopyFrom(attrs["_output_shapes"].list.shape[0])
        elif caller is not None:
            for d in caller:
                node.attr["shape"].shape.dim.add(size=d)
    for node in graph_def.node:  # (this copy is for shape inference only)
        if node.op == "ReadVariableOp" and node.input and \
                node.input[0].partition(":")[0] in variables:
            shape = variables[node.input[0].partition(":")[0]]
            dtype = node.attr["dtype"].type
            node.op = "Placeholder"
            del node.input[:]
            node.attr.clear()
            node.attr["dtype"].type = dtype
            for d in shape:
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
            each = tuple(shape)
            if each and isinstance(each[0], int) and each[0] > 0:
                sizes.add(each[0])
    except Exception:  # pylint: disable=broad-except
        return None
    return sizes.pop() if len(sizes) == 1 else None


class AssumedBatch(dict):
    """A shape table whose unknown leading dimensions read as `batch`; `assumed`: the names
    of the nodes with such an output."""

    def __init__(self, table, batch):
        super().__init__(table)
        self.batch, self.assumed = batch, set()
        self.source, self.why = getattr(table, "source", None), getattr(table, "why", None)
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
        known = dims(self.output(i, port))
        return None if known is None else math.prod(known)
