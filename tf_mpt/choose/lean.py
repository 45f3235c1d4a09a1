"""Lean: a candidate's graph rearranged to hold fewer bytes at its peak (issue "memory").

Nine changes, each leaving every op's dtype what the candidate decided except where said:

    late casts       a half Cast of a value that lives across the step anyway (a variable's
                     read, a constant, a fed input, a stack of a loop's forward values: see
                     HELD_SOURCES, through Identity / Enter) gets one Cast per consumer, each
                     run only once the consumer's other input is ready (a control input from
                     its producer). The half copy of a weight is then made where it is used
                     instead of being held from the forward pass to the backward pass, and a
                     loop's iterations do not cast ahead of the ones that use the copy.
    ordered products a half matrix product read only as float32 (a weight's gradient on its
                     way to a float32 optimizer) runs after the products that read its
                     inputs and after the previous such product's Casts, and its Casts run
                     after those products' readers: a weight gradient is held in both
                     dtypes only while it is cast, not beside the next, nor beside an
                     activation that the input gradient's ReluGrad is about to free.
    float32 products (the leaner version) such a product computes in float32: its result is
                     never held in both dtypes; its inputs (activations, the incoming
                     gradient) are cast to float32 instead.
    saved in half    a float32 value that a late reader (one that waits for an input at least
                     LATE_LEVELS ops deeper: the backward pass's reader of a forward
                     activation) keeps alive is held in half instead: each late reader reads a
                     Cast to float32 of the value's half copy, made once its deepest other
                     input is ready. The half copy is the value's own source where the value
                     is a Cast up from half (the same numbers, bit for bit); else the
                     candidate's Cast of it to half, or a new one, and then only readers on
                     the lists' allow, infer or clear lists (ops the lists would run in half)
                     are moved, and they read the value rounded to half.

    weights' lists   a half TensorList whose every entry is tf_mpt's Cast of a variable's
      in float32     read (a while_v2 gradient's accumulator of a weight the forward body
                     reads) goes float32: its entries are then the variable's own buffer,
                     not a copy per loop step; the gradient loop casts each read it pops.
    late casts in    the same in a functional While's bodies (while_v2: a Keras LSTM and its
      loops        gradient loop), where what lives across an iteration's work is a
                     variable's read or a value popped from a list (LOOP_HELD_SOURCES), not
                     the body's arguments: a weight's half Cast waits for the recurrent
                     state's, and iterations running side by side do not each hold a copy.
    accumulated      in the same bodies, a product summed into a loop variable (a gradient
      in order       loop's per-step weight gradient) waits for that variable, the previous
                     iteration's sum: per-step gradients are not computed ahead of the sum.
    reduced first    a reduction of a large value to a small one (a loss: the Mean of a
                     Square's Cast to float32) runs before the other readers of the value its
                     chain of element-wise ops starts from (the Square's gradient): the
                     chain's transients are not held beside the backward pass's first
                     gradients.
    anchored waits   a control input from an element-wise arithmetic op (a Cast up waiting
                     for its reader's other input; TensorFlow's own gradients of Erfc, Exp,
                     Sqrt, ... wait for their incoming gradient this way) gets a second one
                     from the op that starts the arithmetic chain (its deepest input, past
                     ops of ARITHMETIC). At run time Grappler's constant folding may rewrite
                     such an op in place (a product by a constant pushed down its chain), so
                     the name waited for becomes a constant, ready at the step's start: a
                     Keras Gelu's backward computed exp(-u^2) in the forward pass and held it
                     there (16 MiB per Gelu in a Transformer's fit step), and Casts up of
                     values saved in half ran as soon as they were made. The chain's start is
                     already waited for through the op (no new order, same values).

Their cost is speed (a Cast per use, less running side by side, float32 products), so a lean
graph is only a candidate: graph timing times it and measures its peak (decision.py). Its
cheapest version is ordered products alone (`lean(..., only_ordered=True)`), tried first
where the fastest candidate holds more than float32.
"""

import collections
import heapq

from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import types_pb2

from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.rewrite.boundaries import tensor_lists as _tensor_lists
from tf_mpt.rewrite import type_attrs as _ta
from tf_mpt.rewrite.graph_view import GraphView, parse_input
from tf_mpt.rewrite.paint import shapes as _shapes

# The ops whose output is a value that lives across the step whatever the step does with it.
HELD_SOURCES = frozenset((
    "ReadVariableOp", "VariableV2", "Variable", "Const", "HostConst", "Placeholder",
    "PlaceholderWithDefault", "StackPopV2", "StackPop"))
# late casts in a functional While's body: its arguments are per iteration, not held; a
# variable's read and a value read from a list (a while_v2 gradient's accumulator) are.
LOOP_HELD_SOURCES = frozenset((
    "ReadVariableOp", "Const", "HostConst", "TensorListPopBack", "TensorListGetItem"))
_WHILE_OPS = frozenset(("While", "StatelessWhile"))
# accumulated in order: the ops that sum a product into a loop variable
_ACCUMULATORS = frozenset(("AddN", "AddV2", "Add"))
# Ops whose output is their first input's buffer (or the same value, held as long): a value
# held through them is held.
_PASS_THROUGH = frozenset(("Identity", "Enter", "RefEnter", "RefIdentity", "Snapshot",
                           "Reshape", "Squeeze", "ExpandDims", "StopGradient",
                           "PreventGradient"))
# A control input from these would not mean "the other input is ready" (a Switch's control
# edge is live on either branch; a Merge's fires on the first input).
_NO_TRIGGER = frozenset(("Switch", "RefSwitch", "Merge", "RefMerge", "NextIteration",
                         "RefNextIteration", "LoopCond", "Exit", "RefExit"))
# Consumers that run on any one live input: a control input from another input's producer,
# dead where that input is, would make the Cast dead where the consumer needed it.
_ANY_INPUT = frozenset(("Merge", "RefMerge"))
# Graphs with these (TF1 control flow: tf.cond, while_loop) get no ordering edges: a product
# under another branch than the one it would wait for would be dead where it ran before, and a
# loop's frames cannot be crossed by a control edge.
_SWITCHES = frozenset(("Switch", "RefSwitch"))
PRODUCTS = frozenset(("MatMul", "BatchMatMul", "BatchMatMulV2"))
# reduced first: reductions (to a value of fewer than MIN_SAVED_ELEMENTS elements) and the
# one-input element-wise ops (and Casts) of the chain a reduction's transient is made by.
REDUCTIONS = frozenset(("Mean", "Sum", "Max", "Min", "Prod", "EuclideanNorm"))
REDUCED_CHAIN = frozenset((
    "Cast", "Square", "Abs", "Neg", "Exp", "Log", "Log1p", "Sqrt", "Rsqrt", "Reciprocal",
    "Sigmoid", "Tanh", "Softplus", "Relu", "Identity"))
# saved in half: a reader is late where one of its inputs is this many ops (longest path from
# the graph's sources) deeper than the value it reads; a forward reader is within a few.
LATE_LEVELS = 16
# saved in half: values of fewer elements than this (an unknown dimension counted as 1: a
# reduction's [batch, 1] result, a bias) or of unknown rank are not worth their two Casts.
MIN_SAVED_ELEMENTS = 1 << 14
# lean(..., new_copies=False)'s name of its "saved in half" (a verdict's lean_changes: how a
# cached verdict's lean pick is made again)
FROM_COPIES = "saved in half from half copies"
# anchored waits: element-wise arithmetic that Grappler's constant folding and arithmetic
# optimizer may rewrite in place (reassociating a chain of products or sums by a constant,
# keeping the nodes' names).
ARITHMETIC = frozenset(("Mul", "AddV2", "Add", "Sub", "RealDiv", "Div", "DivNoNan", "MulNoNan",
                        "Neg", "BiasAdd"))
# Readers that are not moved (a loop's or a cond's plumbing; a Merge runs on any one input).
_NOT_MOVED = _NO_TRIGGER | frozenset(("Enter", "RefEnter"))
_HALF_LISTS = ("allow", "infer", "clear")


def _held(view, i, seen=0, sources=HELD_SOURCES):
    node = view.nodes[i]
    if node.op in sources:
        return True
    if node.op in _PASS_THROUGH and view.fanin[i] and seen < 16:
        return _held(view, view.fanin[i][0][0], seen + 1, sources)
    return False


def _half_cast_targets(view, sources=HELD_SOURCES):
    """{cast index: [(consumer, port), ...]} for tf_mpt's float32 -> half Casts of held
    values, with data readers only, no control reader and no control input (a Cast that
    waits already: late_casts made it)."""
    found = {}
    for i, node in enumerate(view.nodes):
        if not _casts.is_ours(node) or node.attr["SrcT"].type != types_pb2.DT_FLOAT or \
                node.attr["DstT"].type not in _ta.HALF_TYPES:
            continue
        if view.has_control_fanout[i] or view.control_fanin[i] or not view.fanin[i] or \
                not _held(view, view.fanin[i][0][0], sources=sources):
            continue
        readers = [c for port, cs in view.fanout_of(i).items() if port == 0 for c in cs]
        if readers:
            found[i] = readers
    return found


def _trigger(view, consumer, targets, sources=HELD_SOURCES):
    """The name of the producer of `consumer`'s first data input that is neither a held
    value nor one of the Casts `targets` (of held values) nor a Placeholder (in a loop's
    body, an argument: there from the iteration's start), or None."""
    if view.nodes[consumer].op in _ANY_INPUT:
        return None
    for src, _ in view.fanin[consumer]:
        if src in targets or _held(view, src, sources=sources) or \
                view.nodes[src].op in _NO_TRIGGER or view.nodes[src].op == "Placeholder":
            continue
        return view.nodes[src].name
    return None


def late_casts(graph_def, sources=HELD_SOURCES):
    """graph_def with its half Casts of held values (made by `sources`, through
    pass-through ops) made per consumer, each after the consumer's other input (see the
    module's docstring). Returns (GraphDef, Casts moved)."""
    view = GraphView(graph_def)
    targets = _half_cast_targets(view, sources)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    taken = {node.name for node in nodes}
    moved, removed = 0, set()
    added = []
    for cast, readers in targets.items():
        triggers = [_trigger(view, consumer, targets, sources) for consumer, _ in readers]
        if not any(triggers):
            continue
        original = nodes[cast]
        if len(readers) == 1:
            original.input.append(f"^{triggers[0]}")
            moved += 1
            continue
        for (consumer, port), trigger in zip(readers, triggers):
            clone = _casts.new_cast(taken, original.input[0], types_pb2.DT_FLOAT,
                                    original.attr["DstT"].type, original.device)
            if trigger:
                clone.input.append(f"^{trigger}")
            nodes[consumer].input[port] = clone.name  # (GraphView: data inputs come first)
            added.append(clone)
        removed.add(original.name)
        moved += 1
    if not moved:
        return graph_def, 0
    _finish(out, removed, added)
    return out, moved


def ordered_products(graph_def):
    """graph_def with its half matrix products that are read only as float32 (weights'
    gradients, on their way to a float32 optimizer) ordered: each runs after the other
    products reading its inputs (the gradient with respect to the layer's input) and after
    the previous one's Casts to float32, so two weight gradients are not held in both dtypes
    at once; its Casts to float32 wait for the first readers of those other products (past
    Identity: a ReluGrad of the input's gradient), so what those readers free (an
    activation) is not held beside the weight gradient in both dtypes. Edges between
    products go along one topological order of the graph (no cycle can form); a Cast's are
    not added where they would make one. None are added in a graph with TF1 control flow
    (_SWITCHES). Returns (GraphDef, products ordered)."""
    if any(node.op in _SWITCHES for node in graph_def.node):
        return graph_def, 0
    view = GraphView(graph_def)
    position = _topological_positions(view)
    if position is None:
        return graph_def, 0
    gradients = []  # (position, product, its Casts to float32)
    for i, node in enumerate(view.nodes):
        if node.op in PRODUCTS and node.attr["T"].type in _ta.HALF_TYPES:
            found = _read_as_float32(view, i, node.attr["T"].type)
            if found is not None:
                gradients.append((position[i], i, found[1]))
    gradients.sort()
    _, forward = _forward_edges(view)
    backward = _input_edges(view)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    ordered, previous, cast_waits = set(), (), []
    for _, i, casts in gradients:
        before = {k for k in previous if position[k] < position[i]}
        siblings = set()
        for src, port in view.fanin[i]:
            siblings.update(reader for reader, _ in view.fanout_of(src).get(port, ())
                            if reader != i and view.nodes[reader].op in PRODUCTS)
        before.update(k for k in siblings if position[k] < position[i])
        before -= set(view.control_fanin[i])
        for k in sorted(before):
            nodes[i].input.append(f"^{view.nodes[k].name}")
        if before:
            ordered.add(i)
        previous = casts
        waits = set()
        for k in siblings:
            waits.update(_first_readers(view, k))
        waits -= set(casts) | {i}
        for cast in casts:  # (not its descendants: a cycle; nor its ancestors: no need)
            waits_for = waits - _reachable(forward, cast) - _reachable(backward, cast)
            cast_waits.extend((i, cast, k) for k in sorted(waits_for))
    if cast_waits:
        # Each weight gradient's Casts to float32 also wait for the readers of the products
        # beside it (a ReluGrad of the input's gradient): the activation those readers free
        # is not held while the weight gradient is held in both dtypes.
        plain = graph_pb2.GraphDef()
        plain.CopyFrom(out)
        for _, cast, k in cast_waits:
            nodes[cast].input.append(f"^{view.nodes[k].name}")
        if _topological_positions(GraphView(out)) is None:  # (a cycle: not added)
            out = plain
        else:
            ordered.update(i for i, _, _ in cast_waits)
    return (out, len(ordered)) if ordered else (graph_def, 0)


def _first_readers(view, i):
    """The data readers of node i's output 0 past pass-through nodes (Identity ...), leaving
    out products, loop and cond plumbing."""
    found, todo, seen = [], [i], {i}
    while todo:
        k = todo.pop()
        for reader, _ in view.fanout_of(k).get(0, ()):
            if reader in seen:
                continue
            seen.add(reader)
            op = view.nodes[reader].op
            if op in _PASS_THROUGH and len(seen) < 64:
                todo.append(reader)
            elif op not in PRODUCTS and op not in _NOT_MOVED:
                found.append(reader)
    return found


def _input_edges(view):
    """[the nodes whose outputs node i waits for (data and control inputs), per node]:
    _reachable's edges towards a node's ancestors."""
    return [[src for src, _ in view.fanin[i]] + list(view.control_fanin[i])
            for i in range(len(view))]


def _reachable(edges, i):
    """The nodes reachable from node i along `edges` ([next nodes, per node])."""
    seen, todo = {i}, [i]
    while todo:
        for k in edges[todo.pop()]:
            if k not in seen:
                seen.add(k)
                todo.append(k)
    return seen


def _topological_positions(view):
    """{node: position} in one topological order (ties by GraphDef order, a tf_mpt Cast
    placed as its input's producer; a loop's NextIteration edges left out), or None where the
    graph has a cycle besides those."""
    pending, readers = _forward_edges(view)
    key = list(range(len(view)))  # tf_mpt's Casts (added last) go as their input's producer
    for i, node in enumerate(view.nodes):
        if _casts.is_ours(node) and view.fanin[i]:
            key[i] = view.fanin[i][0][0]
    ready = [(key[i], i) for i in range(len(view)) if not pending[i]]
    heapq.heapify(ready)
    position = {}
    while ready:
        _, i = heapq.heappop(ready)
        position[i] = len(position)
        for reader in readers[i]:
            pending[reader] -= 1
            if not pending[reader]:
                heapq.heappush(ready, (key[reader], reader))
    return position if len(position) == len(view) else None


def _back_edge(view, i):
    return view.nodes[i].op in ("NextIteration", "RefNextIteration")


def _forward_edges(view):
    """([inputs to wait for, per node], [readers, per node]) over data and control edges, one
    entry per edge, a loop's NextIteration edges left out."""
    pending = [0] * len(view)
    readers = [[] for _ in range(len(view))]
    for i in range(len(view)):
        for src in [s for s, _ in view.fanin[i]] + list(view.control_fanin[i]):
            if not _back_edge(view, src):
                pending[i] += 1
                readers[src].append(i)
    return pending, readers


def _read_as_float32(view, i, half):
    """(pass-through nodes, Casts) where node i's only output is read, through Identity
    nodes of its own (`_PASS_THROUGH`, one output each), only by Casts from `half` to float32
    (at least one); else None."""
    through, readers, todo = [], [], [i]
    while todo:
        k = todo.pop()
        fanout = view.fanout_of(k)
        if set(fanout) != {0}:  # (control readers only wait for it)
            return None
        for reader, _ in fanout[0]:
            node = view.nodes[reader]
            if _casts.is_cast(node, half, types_pb2.DT_FLOAT):
                readers.append(reader)
            elif node.op in ("Identity", "Snapshot") and len(view.fanin[reader]) == 1 and \
                    node.attr["T"].type == half and len(through) < 16:
                through.append(reader)
                todo.append(reader)
            else:
                return None
    return (through, readers) if readers else None


def float32_products(graph_def):
    """graph_def with its half matrix products read only as float32 computed in float32: the
    product's inputs are the float32 tensors the candidate cast from (or new Casts to
    float32), the Casts of its result become Identities (their names kept). Returns
    (GraphDef, products changed)."""
    view = GraphView(graph_def)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    taken = {node.name for node in nodes}
    changed, added, maybe_unread = 0, [], set()
    for i, node in enumerate(view.nodes):
        if node.op not in PRODUCTS or node.attr["T"].type not in _ta.HALF_TYPES:
            continue
        half = node.attr["T"].type
        found = _read_as_float32(view, i, half)
        if found is None:
            continue
        through, readers = found
        product = nodes[i]
        product.attr["T"].type = types_pb2.DT_FLOAT
        for port, (src, _) in enumerate(view.fanin[i]):
            producer = view.nodes[src]
            if _casts.is_cast(producer, types_pb2.DT_FLOAT, half):
                product.input[port] = producer.input[0]
                maybe_unread.add(producer.name)
            else:
                cast = _casts.new_cast(taken, product.input[port], half, types_pb2.DT_FLOAT,
                                       product.device)
                product.input[port] = cast.name
                added.append(cast)
        for k in through:
            nodes[k].attr["T"].type = types_pb2.DT_FLOAT
        for reader in readers:
            _as_identity(nodes[reader])
        changed += 1
    if not changed:
        return graph_def, 0
    read = collections.Counter(parse_input(name)[0] for node in list(nodes) + added
                               for name in node.input)
    _finish(out, {name for name in maybe_unread if not read[name]}, added)
    return out, changed


def _levels(view):
    """[longest path from a source, per node] over data and control edges (a loop's
    NextIteration edges left out), or None where the graph has a cycle besides those."""
    pending, readers = _forward_edges(view)
    level = [0] * len(view)
    ready = [i for i in range(len(view)) if not pending[i]]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for reader in readers[i]:
            level[reader] = max(level[reader], level[i] + 1)
            pending[reader] -= 1
            if not pending[reader]:
                ready.append(reader)
    return level if done == len(view) else None


def _half_type(view):
    """The half type of the candidate's Casts (the most common), or None."""
    found = collections.Counter(
        node.attr["DstT"].type for node in view.nodes
        if _casts.is_ours(node) and node.attr["SrcT"].type == types_pb2.DT_FLOAT and
        node.attr["DstT"].type in _ta.HALF_TYPES)
    return found.most_common(1)[0][0] if found else None


def _output_type(node, port):
    try:
        types = _ta.node_types(node, {})
    except Exception:  # pylint: disable=broad-except
        return None  # (an op this TensorFlow does not know: its outputs are not guessed)
    if not types.known or port >= len(types.out_keys) or types.out_keys[port] is None:
        return None
    return types.dtypes.get(types.out_keys[port])


def _may_wait_on(view, src):
    """Whether a control input from node src means "its value is ready": not a held value (there
    from the step's start), not a loop's or a cond's plumbing."""
    return not _held(view, src) and view.nodes[src].op not in _NO_TRIGGER


def _deepest_other(view, reader, value, level):
    """The deepest input (data or control) of `reader` besides node `value`, as a node, that
    may be waited on (_may_wait_on), or None."""
    best = None
    for src in [s for s, _ in view.fanin[reader]] + list(view.control_fanin[reader]):
        if src == value or not _may_wait_on(view, src):
            continue
        if best is None or level[src] > level[best]:
            best = src
    return best


def saved_in_half(graph_def, lists=None, shapes=None, new_copies=True, half=None):
    """graph_def with the float32 values its late readers keep alive held in half (see the
    module's docstring); `lists` (lists.OpLists) names the readers that may read a value
    rounded to half (None: only values that are Casts up from half are changed); `shapes`
    ({node name: [shape per output]}, with .get) sizes the values (None: inferred from the
    GraphDef, paint/shapes.py). Without `new_copies`, only values with a half copy already
    (a Cast up from half, the candidate's Cast to half) are changed: each costs one Cast up
    at its late readers, not a Cast down as well, and frees its float32 bytes whole (a Keras
    Transformer's fit step on Sapphire Rapids: 0.85x the candidate's step peak at its speed,
    where the values with new copies too reached 0.72x at 1-4% slower). `half` (a DataType)
    is the type of the copies where the graph has no half Casts of its own (float32's own
    lean version: its compute float32, what its backward pass reads saved in half; None:
    such a graph is left alone). Returns (GraphDef, values changed)."""
    view = GraphView(graph_def)
    half = _half_type(view) or half
    level = _levels(view) if half is not None else None
    if level is None:
        return graph_def, 0
    if shapes is None:
        shapes = _shapes.graph_def_shapes(graph_def, view)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    taken = {node.name for node in nodes}
    added, changed = [], 0
    for i, node in enumerate(view.nodes):
        if _held(view, i):
            continue
        for port, readers in sorted(view.fanout_of(i).items()):
            if _elements(shapes, view, i, port) < MIN_SAVED_ELEMENTS:
                continue
            plan = _saving_plan(view, i, port, readers, half, level, lists)
            if plan is None or (plan[0] is None and not new_copies):
                continue
            source, late = plan
            tensor = node.name if port == 0 else f"{node.name}:{port}"
            if source is None:  # a new half copy, made where the value is
                copy = _casts.new_cast(taken, tensor, types_pb2.DT_FLOAT, half, node.device)
                added.append(copy)
                source = copy.name
            by_trigger = collections.defaultdict(list)
            for reader, reader_port, trigger in late:
                by_trigger[trigger].append((reader, reader_port))
            for trigger, moved in sorted(by_trigger.items()):
                back = _casts.new_cast(taken, source, half, types_pb2.DT_FLOAT,
                                       nodes[moved[0][0]].device)
                back.input.append(f"^{view.nodes[trigger].name}")
                added.append(back)
                for reader, reader_port in moved:
                    nodes[reader].input[reader_port] = back.name
            changed += 1
    if not changed:
        return graph_def, 0
    _finish(out, set(), added)
    return out, changed


def _elements(shapes, view, i, port):
    """The elements of output `port` of node i by its static shape (a tf_mpt Cast's: its
    input's), an unknown dimension counted as 1; 0 for an unknown rank (a value whose size is
    not known, such as one computed from a variable whose shape the GraphDef alone does not
    carry, is left alone)."""
    node = view.nodes[i]
    if _casts.is_ours(node) and view.fanin[i]:
        i, port = view.fanin[i][0]
        node = view.nodes[i]
    entry = shapes.get(node.name)
    if entry is None or port >= len(entry) or entry[port] is None:
        return 0
    count = 1
    for size in entry[port]:
        count *= size if size is not None and size > 0 else 1
    return count


def _saving_plan(view, i, port, readers, half, level, lists):
    """(the half copy's tensor name, or None for a new Cast; [(late reader, its input port,
    the node it waits for)]) for output `port` of node i, or None where it is not held in
    half: no late reader, or one that cannot be moved."""
    node = view.nodes[i]
    exact = _casts.is_our_cast(node, half, types_pb2.DT_FLOAT) and port == 0
    source = node.input[0] if exact else None
    if not exact:
        if _output_type(node, port) != types_pb2.DT_FLOAT:
            return None
        for reader, _ in readers:
            copy = view.nodes[reader]
            if _casts.is_our_cast(copy, types_pb2.DT_FLOAT, half) and \
                    not view.control_fanin[reader]:
                source = copy.name
                break
    late = []
    for reader, reader_port in readers:
        reader_node = view.nodes[reader]
        if reader_node.name == source or level[reader] <= level[i] + LATE_LEVELS:
            continue
        trigger = _deepest_other(view, reader, i, level)
        if reader_node.op in _NOT_MOVED or trigger is None or \
                level[trigger] < level[i] + LATE_LEVELS:
            return None  # (late, but not for an input it could wait on: the value stays)
        if not exact and (lists is None or lists.list_of(reader_node.op) not in _HALF_LISTS):
            return None
        late.append((reader, reader_port, trigger))
    return (source, late) if late else None


def lean(graph_def, products_in_float32=False, lists=None, shapes=None, ordered=True,
         only_ordered=False, new_copies=True, half=None):
    """The changes in order: ordered products (with `ordered`: for a candidate holding more
    than float32 because its weight gradients are held in both dtypes), float32 products
    (with `products_in_float32`: the leaner version, for where the first still holds too
    much), saved in half (`lists`, `shapes`: see saved_in_half), reduced first, late casts,
    weights' lists in float32, late casts in loops, accumulated in order. With
    `only_ordered`: ordered products alone (the cheapest version: late casts cost a Cast per
    use, 10% of the MLP's step, where its weights' half copies cost no bytes at its peak).
    Without `new_copies`: saved in half only from the half copies the graph has (counted as
    FROM_COPIES, not "saved in half"). `half`: the copies' type in a graph with no half Casts
    (float32's own; saved_in_half). Returns (GraphDef, {change: count}), a change not tried
    absent."""
    changes = {}
    if only_ordered:
        graph_def, changes["ordered products"] = ordered_products(graph_def)
        return graph_def, changes
    if shapes is None:  # (inferred once, from the candidate's graph)
        shapes = _shapes.graph_def_shapes(graph_def, GraphView(graph_def))
    if ordered:
        graph_def, changes["ordered products"] = ordered_products(graph_def)
    if products_in_float32:
        graph_def, changes["float32 products"] = float32_products(graph_def)
    graph_def, changes["saved in half" if new_copies else FROM_COPIES] = saved_in_half(
        graph_def, lists, shapes, new_copies, half)
    graph_def, changes["reduced first"] = reduced_first(graph_def, shapes)
    graph_def, changes["late casts"] = late_casts(graph_def)
    graph_def, changes["anchored waits"] = anchored_waits(graph_def)
    graph_def, changes["weights' lists in float32"] = \
        _tensor_lists.float32_lists_of_variable_reads(graph_def)
    graph_def, changes["late casts in loops"] = late_casts_in_loops(graph_def)
    graph_def, changes["accumulated in order"] = accumulated_in_order(graph_def)
    return graph_def, changes


def _chain_start(view, i, level):
    """The op that starts node i's chain of ARITHMETIC ops: from i, its deepest data input
    that may be waited on (_may_wait_on), while the node reached is ARITHMETIC; i itself where
    it has no such input. (Called on graphs without TF1 control flow only: no Enter.)"""
    while view.nodes[i].op in ARITHMETIC:
        inputs = [src for src, _ in view.fanin[i] if _may_wait_on(view, src)]
        if not inputs:
            break
        i = max(inputs, key=lambda src: level[src])
    return i


def anchored_waits(graph_def):
    """graph_def with each control input from an ARITHMETIC op doubled by one from the op
    that starts its chain (see the module's docstring): what waits for the op still waits
    where Grappler folds the op into a constant. Not in a graph with TF1 control flow
    (_SWITCHES). Returns (GraphDef, control inputs added)."""
    if any(node.op in _SWITCHES for node in graph_def.node):
        return graph_def, 0
    view = GraphView(graph_def)
    if not any(view.nodes[src].op in ARITHMETIC
               for controls in view.control_fanin for src in controls):
        return graph_def, 0
    level = _levels(view)
    if level is None:
        return graph_def, 0
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    added = 0
    for i, controls in enumerate(view.control_fanin):
        waited = set(controls) | {src for src, _ in view.fanin[i]}
        for src in controls:
            if view.nodes[src].op not in ARITHMETIC:
                continue
            start = _chain_start(view, src, level)
            if start not in waited:
                out.node[i].input.append(f"^{view.nodes[start].name}")
                waited.add(start)
                added += 1
    return (out, added) if added else (graph_def, 0)


def _loop_bodies(graph_def):
    """The names of the library functions that are a While's body (in the main graph or in
    a function)."""
    found = set()
    for node in _function_bodies.all_nodes(graph_def):
        if node.op in _WHILE_OPS and node.attr["body"].func.name:
            found.add(node.attr["body"].func.name)
    return found


def _in_loop_bodies(graph_def, change):
    """graph_def with `change` (GraphDef -> (GraphDef, count)) made in each functional While
    body of its library (function_bodies.function_to_graph_def: the arguments are
    Placeholders); a body that cannot be converted is left as it is. Returns (GraphDef,
    the counts' sum)."""
    bodies = _loop_bodies(graph_def)
    if not bodies:
        return graph_def, 0
    signatures = {f.signature.name: f.signature for f in graph_def.library.function}
    out, total = None, 0
    for k, fdef in enumerate(graph_def.library.function):
        if fdef.signature.name not in bodies:
            continue
        try:
            body, _ = _function_bodies.function_to_graph_def(fdef, signatures)
            changed, count = change(body)
            if not count:
                continue
            new = _function_bodies.graph_def_to_function(changed, fdef, signatures)
        except (_function_bodies.UnsupportedFunction, KeyError, ValueError):
            continue
        if out is None:
            out = graph_pb2.GraphDef()
            out.CopyFrom(graph_def)
        out.library.function[k].CopyFrom(new)
        total += count
    return (out, total) if total else (graph_def, 0)


def late_casts_in_loops(graph_def):
    """graph_def with late casts made in its functional While loops' bodies, where the values
    that live across an iteration's work are LOOP_HELD_SOURCES' (a variable's read, a value
    read from a list: a while_v2 gradient's pop of a weight's read); the body's arguments are
    per iteration (a recurrent state), so a weight's half Cast waits for the state's. The
    iterations running side by side (a forward loop racing ahead of its recurrence, a
    gradient loop popping ahead) then do not each hold a half copy of the weight before the
    product that reads it can run. Returns (GraphDef, Casts moved)."""
    return _in_loop_bodies(graph_def, lambda body: late_casts(body, LOOP_HELD_SOURCES))


def _accumulated_in_order(body):
    """(body, products changed): each matrix product whose result (through Casts and
    Identity) is added to an argument of the body (AddN, AddV2, Add, reading the argument
    or an Identity of it: a gradient loop's sum of a weight's per-step gradients, a loop
    variable) waits for what it is added to, the previous iteration's sum."""
    view = GraphView(body)
    out = graph_pb2.GraphDef()
    out.CopyFrom(body)
    changed = set()
    for node_index, node in enumerate(view.nodes):
        if node.op not in _ACCUMULATORS:
            continue
        sources = [src for src, _ in view.fanin[node_index]]
        arguments = [src for src in sources if _an_argument(view, src)]
        if len(arguments) != 1:
            continue
        for src in sources:
            product = src
            for _ in range(4):  # (through tf_mpt's Casts and Identity)
                if view.nodes[product].op in PRODUCTS or not view.fanin[product] or not (
                        _casts.is_ours(view.nodes[product]) or
                        view.nodes[product].op == "Identity"):
                    break
                product = view.fanin[product][0][0]
            if view.nodes[product].op not in PRODUCTS or \
                    arguments[0] in view.control_fanin[product]:
                continue
            out.node[product].input.append(f"^{view.nodes[arguments[0]].name}")
            changed.add(product)
    return (out, len(changed)) if changed else (body, 0)


def _an_argument(view, i):
    """Whether node i is a body's argument (a Placeholder), or Identity of one."""
    for _ in range(8):
        if view.nodes[i].op == "Placeholder":
            return True
        if view.nodes[i].op != "Identity" or not view.fanin[i]:
            return False
        i = view.fanin[i][0][0]
    return False


def accumulated_in_order(graph_def):
    """graph_def with the products of its functional While loops' bodies that are summed into
    a loop variable waiting for that variable (_accumulated_in_order): a gradient loop's
    per-step weight gradients are not computed ahead of the sum, up to one per iteration
    running side by side (the Keras LSTM's gradient loop held 29 of them). Returns
    (GraphDef, products changed)."""
    return _in_loop_bodies(graph_def, _accumulated_in_order)


def reduced_first(graph_def, shapes=None):
    """graph_def with each reduction of a large value to a small one (a loss: the Mean of a
    Square's Cast to float32) run before the other readers of the value its chain starts
    from: the chain (element-wise ops and Casts read only by the next, REDUCED_CHAIN) is a
    transient, and the backward pass's first ops (the Square's gradient reading the same
    difference) do not allocate beside it. `shapes` as saved_in_half's. None are added in a
    graph with TF1 control flow (_SWITCHES). Returns (GraphDef, reductions moved first)."""
    if any(node.op in _SWITCHES for node in graph_def.node):
        return graph_def, 0
    view = GraphView(graph_def)
    if shapes is None:
        shapes = _shapes.graph_def_shapes(graph_def, view)
    forward, backward = None, None
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = out.node
    moved = 0
    for r, node in enumerate(view.nodes):
        if node.op not in REDUCTIONS or not view.fanin[r] or \
                not 0 < _elements(shapes, view, r, 0) < MIN_SAVED_ELEMENTS:
            continue
        chain, (k, port) = [], view.fanin[r][0]
        while view.nodes[k].op in REDUCED_CHAIN and port == 0 and view.fanin[k] and \
                not view.has_control_fanout[k] and \
                [reader for reader, _ in view.fanout_of(k).get(0, ())] == \
                [chain[-1] if chain else r] and len(view.fanout_of(k)) == 1:
            chain.append(k)
            k, port = view.fanin[k][0]
        if not chain or _elements(shapes, view, k, port) < MIN_SAVED_ELEMENTS:
            continue
        others = {reader for reader, _ in view.fanout_of(k).get(port, ())
                  if reader not in chain and view.nodes[reader].op not in _NOT_MOVED}
        if not others:
            continue
        if forward is None:
            _, forward = _forward_edges(view)
            backward = _input_edges(view)
        # (not an ancestor of the reduction: a cycle; nor a descendant: it waits already)
        others -= _reachable(backward, r) | _reachable(forward, r)
        for reader in sorted(others):
            nodes[reader].input.append(f"^{node.name}")
        moved += bool(others)
    return (out, moved) if moved else (graph_def, 0)


def _as_identity(node):
    """A Cast to float32 of what is now a float32 value becomes an Identity (its name
    kept)."""
    node.op = "Identity"
    for attr in ("SrcT", "DstT", "Truncate"):
        if attr in node.attr:
            del node.attr[attr]
    node.attr["T"].type = types_pb2.DT_FLOAT


def _finish(out, removed, added):
    kept = [node for node in out.node if node.name not in removed]
    del out.node[:]
    out.node.extend(kept)
    out.node.extend(added)
