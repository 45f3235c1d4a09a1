"""Storing a SavedModel's float32 variables in half precision (`tf-mpt convert --variables half`).

After the rewrite, a variable whose every read is cast to half before any op uses it computes
the same numbers when it is stored in half: the Cast rounds the same float32 value at each read
as it would once at conversion. Such a variable is stored in half and its reads lose their Cast,
which halves its memory and checkpoint size and saves a Cast per read. A variable any float32 op
reads, or that something other than the restore function assigns, stays float32 (the report
says which op keeps it).

The variables of a TF2 SavedModel live in three places, all edited together:

* the object graph (SavedVariable.dtype: tf.saved_model.load creates the variable from it);
* the graphs that use their resource handles: the MetaGraph's GraphDef (VarHandleOp), and the
  functions the handles reach, from the captured inputs of the object graph's concrete functions
  (their last len(bound_inputs) arguments) and from the GraphDef's calls, through Identity and
  calls: ReadVariableOp and AssignVariableOp dtypes, the Identity nodes between them and the
  saver's SaveV2 / RestoreV2, whose dtypes attrs change at the variable's position;
* the checkpoint (variables/), written again with the converted values.

A handle that reaches any other op (a While, ResourceGather, an optimizer's update, a function's
result) keeps its variable float32.
"""

import collections
import dataclasses
import os

import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite.boundaries import bodies as _bodies
from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.rewrite.casts import CAST_SUFFIX
from tf_mpt.rewrite.graph_view import parse_input
from tf_mpt.models.model_io import ModelError

_FLOAT = types_pb2.DT_FLOAT
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")
# Ops that take a handle and no dtype of the value: they do not care how it is stored.
_DTYPE_FREE = ("DisableCopyOnRead", "VarIsInitializedOp", "DestroyResourceOp")
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_FIRST_SAVED_TENSOR = 3  # SaveV2(prefix, tensor_names, shape_and_slices, *tensors)
MAIN = None  # the MetaGraph's GraphDef, among function names


@dataclasses.dataclass
class VariableChoice:
    """What `--variables half` did: checkpoint key -> name, and the variables kept float32."""
    dtype: str
    converted: dict = dataclasses.field(default_factory=dict)  # checkpoint key -> variable name
    kept: dict = dataclasses.field(default_factory=dict)  # variable name -> why float32
    casts_removed: list = dataclasses.field(default_factory=list)  # 'function/cast' names

    def lines(self):
        total = len(self.converted) + len(self.kept)
        out = [f"variables: {len(self.converted)} of {total} float32 variable(s) stored in "
               f"{self.dtype}, {len(self.casts_removed)} Cast(s) of their reads removed"]
        out += [f"  kept float32: {name}: {why}" for name, why in sorted(self.kept.items())]
        return out


class _Graph:
    """The MetaGraph's GraphDef, or one function's body as a GraphDef (each argument a
    Placeholder named like it, each return value an Identity `__tf_mpt_ret__/<name>`), edited
    through the rewrite's editor (a bodies.MainGraph or bodies.Body scope): nodes by name, who
    reads each tensor, one codec of tensor names ((node, port) keys) for both."""

    def __init__(self, scope):
        self.scope = scope
        self.name = scope.name
        self.function = getattr(scope, "fdef", None)
        self.editor = scope.editor
        self.nodes = self.editor.by_name

    def mark_changed(self):
        self.scope.changed = True

    key = staticmethod(parse_input)

    def readers(self, key):
        """[(node, input position)] reading tensor `key`, return values left out."""
        return [(node, k) for node, k in self.editor.readers(*key)
                if not node.name.startswith(_function_bodies.RET_PREFIX)]

    def returns(self, key):
        """True if the function returns tensor `key`."""
        return any(node.name.startswith(_function_bodies.RET_PREFIX)
                   for node, _ in self.editor.readers(*key))

    def where(self):
        return "the graph" if self.name is MAIN else f"function {self.name}"

    def write_back(self):
        """Finishes the edits; a changed function's FunctionDef gets its edited body."""
        self.scope.write_back()


def _object_paths(nodes):
    """{node id: 'child/grandchild/...'} walking an object graph's children from the root."""
    paths, todo = {0: ""}, [0]
    while todo:
        node_id = todo.pop()
        for child in nodes[node_id].children:
            if child.node_id not in paths:
                prefix = paths[node_id]
                paths[child.node_id] = (f"{prefix}/{child.local_name}" if prefix
                                        else child.local_name)
                todo.append(child.node_id)
    return paths


def _checkpoint_keys(meta_graph, reader):
    """{variable's object id: its checkpoint key}, matching the SavedModel's object graph and the
    checkpoint's by the path of child names from the root."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
    by_path = {}
    for node_id, path in _object_paths(graph.nodes).items():
        for attribute in graph.nodes[node_id].attributes:
            if attribute.name == "VARIABLE_VALUE":
                by_path[path] = attribute.checkpoint_key
    saved = meta_graph.object_graph_def.nodes
    return {node_id: by_path[path] for node_id, path in _object_paths(saved).items()
            if saved[node_id].WhichOneof("kind") == "variable" and path in by_path}


class _Plan:
    """Follows every float32 variable's handle and decides which can be stored in half.

    Function bodies decide: a variable is stored in half only if every read in a function is
    cast to half (or saved by SaveV2) and every assign in a function is the restore's. The
    MetaGraph's GraphDef only serves TF1 loaders (tf.compat.v1.saved_model.load): its
    initializers and reads follow the decision with Casts where they need float32.
    """

    def __init__(self, meta_graph, keys, half):
        self.half = half
        self.graphs = {MAIN: _Graph(_bodies.MainGraph(meta_graph.graph_def, half))}
        signatures = {f.signature.name: f.signature for f in meta_graph.graph_def.library.function}
        for function in meta_graph.graph_def.library.function:
            try:
                self.graphs[function.signature.name] = _Graph(
                    _bodies.Body(function, signatures, half))
            except _bodies.UnsupportedFunction:
                continue  # a handle reaching it keeps its variable float32 ("unknown function")
        self.keys = keys
        saved = meta_graph.object_graph_def.nodes
        self.names = {i: key[:-len(_VALUE_SUFFIX)] if key.endswith(_VALUE_SUFFIX) else key
                      for i, key in keys.items()}
        self.candidates = {i for i in keys if saved[i].variable.dtype == _FLOAT}
        self.blocked = {}  # object id -> why it stays float32
        self.handles = collections.defaultdict(set)  # (graph, tensor key) -> object ids
        self.reads = collections.defaultdict(list)  # object id -> [(graph, ReadVariableOp)]
        # object id -> [(graph, AssignVariableOp, its _restored_from or None)]
        self.assigns = collections.defaultdict(list)
        self.has_restore = bool(meta_graph.saver_def.restore_op_name)
        self._seed(meta_graph)

    def _main_seeds(self, meta_graph):
        """(tensor key of a VarHandleOp in the GraphDef, object id): from the calls that pass
        handles to the object graph's concrete functions and to the saver's restore function
        (whose RestoreV2 names each variable's checkpoint key)."""
        main = self.graphs[MAIN]
        by_key = {key: i for i, key in self.keys.items()}
        for node in main.nodes.values():
            if node.op not in _CALLS:
                continue
            callee = self.graphs.get(node.attr["f"].func.name)
            if callee is None:
                continue
            refs = [r for r in node.input if not r.startswith("^")]
            ids = {}  # argument position -> object id
            saved = meta_graph.object_graph_def.concrete_functions.get(callee.name)
            if saved is not None and saved.bound_inputs:
                first = len(refs) - len(saved.bound_inputs)
                ids.update({first + k: i for k, i in enumerate(saved.bound_inputs)})
            positions = {arg.name: k for k, arg in enumerate(callee.function.signature.input_arg)}
            for assign in callee.nodes.values():
                if assign.op != "AssignVariableOp" or assign.input[0] not in positions:
                    continue  # (an assign through an argument, not a node's output)
                source = _restored_from(callee, assign.input[1])
                if source is not None:
                    restore, index, _ = source
                    key = _restore_names(callee, restore)[index]
                    if key in by_key:
                        ids[positions[assign.input[0]]] = by_key[key]
            for position, object_id in ids.items():
                handle = main.nodes.get(main.key(refs[position])[0])
                if handle is not None and handle.op == "VarHandleOp":
                    yield main.key(refs[position]), object_id

    def _seed(self, meta_graph):
        todo = []
        for name, saved in meta_graph.object_graph_def.concrete_functions.items():
            graph = self.graphs.get(name)
            if graph is None or not saved.bound_inputs:
                continue
            args = graph.function.signature.input_arg[-len(saved.bound_inputs):]
            for arg, object_id in zip(args, saved.bound_inputs):
                todo.append((name, (arg.name, 0), object_id))
        todo += [(MAIN, key, object_id) for key, object_id in self._main_seeds(meta_graph)]
        seen = set()
        while todo:
            graph_name, key, object_id = todo.pop()
            if (graph_name, key, object_id) in seen:
                continue
            seen.add((graph_name, key, object_id))
            self.handles[(graph_name, key)].add(object_id)
            todo += self._follow(self.graphs[graph_name], key, object_id)
        # Variables that share a handle somewhere (a function called with different ones; two
        # trackables of one resource, as Keras exports have) get one dtype: they are decided
        # together.
        self.group = {i: {i} for i in self.candidates}
        for ids in self.handles.values():
            merged = set().union(*(self.group.get(i, {i}) for i in ids))
            for i in merged:
                self.group[i] = merged

    def _block(self, object_id, why):
        self.blocked.setdefault(object_id, why)

    def _follow(self, graph, key, object_id):
        """Handles `key` of `graph` reaches; records reads and assigns; blocks other uses."""
        found = []
        if graph.returns(key):
            self._block(object_id, f"{graph.where()} returns its handle")
        for node, position in graph.readers(key):
            if node.op == "ReadVariableOp":
                self.reads[object_id].append((graph, node))
            elif node.op == "AssignVariableOp" and position == 0:
                self.assigns[object_id].append((graph, node, _restored_from(graph, node.input[1])))
            elif node.op == "Identity":
                found.append((graph.name, (node.name, 0), object_id))
            elif node.op in _CALLS:
                callee = self.graphs.get(node.attr["f"].func.name)
                if callee is None:
                    self._block(object_id, f"{node.op} {node.name!r} calls an unknown function")
                    continue
                arg = callee.function.signature.input_arg[position].name
                found.append((callee.name, (arg, 0), object_id))
            elif node.op not in _DTYPE_FREE:
                self._block(object_id, f"{node.op} {node.name!r} in {graph.where()} uses it")
        return found

    def _value_readers(self, graph, key, chain):
        """(reader, input position) of a value past any Identity nodes (collected into
        `chain`); (None, None) when the graph returns it."""
        if graph.returns(key):
            yield None, None
        for node, position in graph.readers(key):
            if node.op == "Identity":
                chain.append(node)
                yield from self._value_readers(graph, (node.name, 0), chain)
            else:
                yield node, position

    def _check(self, object_id):
        """Why the variable must stay float32, or None."""
        for graph, read in self.reads[object_id]:
            if graph.name is MAIN:
                continue
            for node, position in self._value_readers(graph, (read.name, 0), []):
                if node is None:
                    return f"{graph.where()} returns its value as float32"
                if _casts.is_cast(node, _FLOAT, self.half):
                    continue
                if node.op == "SaveV2" and position >= _FIRST_SAVED_TENSOR:
                    continue
                return f"{node.op} {node.name!r} in {graph.where()} reads it as float32"
        for graph, assign, source in self.assigns[object_id]:
            if graph.name is not MAIN and source is None:
                return f"AssignVariableOp {assign.name!r} in {graph.where()} writes it"
        if self.has_restore and all(source is None for _, _, source in self.assigns[object_id]):
            return "the saver's restore function does not restore it"
        return None

    def decide(self):
        """{object id: checkpoint key} of the variables stored in half."""
        for object_id in sorted(self.candidates - set(self.blocked)):
            why = self._check(object_id)
            if why:
                self._block(object_id, why)
        # A group is stored in half only if all of it can be (groups are closed: one pass).
        for object_id in sorted(set(self.blocked)):
            for other in sorted(self.group.get(object_id, ()) - set(self.blocked)):
                self._block(other, f"it shares a handle with {self.names[object_id]}, "
                            "which stays float32")
        return {i: self.keys[i] for i in sorted(self.candidates - set(self.blocked))}

    def apply(self, meta_graph, converted):
        """Edits the MetaGraph for the converted variables; returns the Casts removed."""
        converted = set(converted)
        removed, later = [], []  # later: main-graph (reader, input position, from, to) Casts
        for object_id in converted:
            meta_graph.object_graph_def.nodes[object_id].variable.dtype = self.half
        for (graph_name, key), ids in self.handles.items():
            node = self.graphs[graph_name].nodes.get(key[0])
            if ids & converted and node is not None and node.op == "VarHandleOp":
                node.attr["dtype"].type = self.half
        half_values = set()  # main-graph values already half: reads of converted variables
        half_assigns = {(graph.name, assign.name) for i in converted
                        for graph, assign, _ in self.assigns[i]}
        done = set()  # (graph, node): variables sharing a handle share its reads and assigns
        for object_id in sorted(converted):
            for graph, read in self.reads[object_id]:
                if not self._set_half_once(done, graph, read):
                    continue
                chain = []
                readers = list(self._value_readers(graph, (read.name, 0), chain))
                for node in chain:
                    node.attr["T"].type = self.half
                if graph.name is MAIN:
                    half_values |= {read.name} | {node.name for node in chain}
                for node, position in readers:
                    if node is None:
                        continue
                    if node.op == "SaveV2" and position >= _FIRST_SAVED_TENSOR:
                        node.attr["dtypes"].list.type[position - _FIRST_SAVED_TENSOR] = self.half
                    elif _casts.is_cast(node, _FLOAT, self.half):
                        node.attr["SrcT"].type = self.half
                        if node.name.endswith(CAST_SUFFIX) and not chain:
                            removed.append((graph, node, read))
                    elif node.op == "AssignVariableOp" and position == 1 and \
                            (graph.name, node.name) in half_assigns:
                        continue  # an initializer copying into another converted variable
                    elif graph.name is MAIN:
                        later.append((node, position, self.half, _FLOAT))
            for graph, assign, source in self.assigns[object_id]:
                if not self._set_half_once(done, graph, assign):
                    continue
                if source is not None:
                    restore, index, chain = source
                    restore.attr["dtypes"].list.type[index] = self.half
                    for node in chain:
                        node.attr["T"].type = self.half
                elif graph.name is MAIN:  # an initializer: its value is cast to half
                    later.append((assign, 1, _FLOAT, self.half))
        # Values read from converted variables are half already: their readers among the
        # initializers of converted variables need no Cast.
        main = self.graphs[MAIN]
        for reader, position, source, target in later:
            ref = reader.input[position]
            if target == self.half and main.key(ref)[0] in half_values:
                continue  # an initializer copying another converted variable
            main.editor.set_input(reader, position, main.editor.cast(ref, target, source))
        names = [self._bypass(graph, cast, read) for graph, cast, read in removed]
        for graph in self.graphs.values():
            graph.write_back()
        return names

    def _set_half_once(self, done, graph, node):
        """Sets a variable op's dtype half the first time (graph, node) is met (variables
        sharing a handle share its reads and assigns): True then, False after."""
        if (graph.name, node.name) in done:
            return False
        done.add((graph.name, node.name))
        graph.mark_changed()
        node.attr["dtype"].type = self.half
        return True

    @staticmethod
    def _bypass(graph, cast, read):
        """Readers of tf_mpt's Cast (now half to half) read the half variable instead."""
        graph.editor.bypass(cast.name, read.name)
        graph.mark_changed()
        return cast.name if graph.function is None else f"{graph.name}/{cast.name}"


def _restored_from(graph, ref):
    """(RestoreV2 node, output index, [Identity nodes between]) a value comes from, or None."""
    chain = []
    key = graph.key(ref)
    while True:
        node = graph.nodes.get(key[0])
        if node is None:
            return None
        if node.op == "RestoreV2":
            return node, key[1], chain
        if node.op != "Identity":
            return None
        chain.append(node)
        key = graph.key(node.input[0])


def _restore_names(graph, restore):
    """The checkpoint keys a RestoreV2 node restores, from its tensor_names Const."""
    const = graph.nodes.get(graph.key(restore.input[1])[0])
    if const is None or const.op != "Const":
        return []
    return [name.decode() for name in const.attr["value"].tensor.string_val]


def store_in_half(proto, checkpoint_prefix, dtype):
    """Stores the float32 variables of a converted SavedModel proto in `dtype` where only half
    ops read them (edits `proto` in place).

    Returns a VariableChoice.
    """
    if len(proto.meta_graphs) != 1:
        raise ModelError(f"--variables {dtype}: the SavedModel has {len(proto.meta_graphs)} "
                         "MetaGraphs sharing one checkpoint; storing variables in half works "
                         "on SavedModels with one (tf.saved_model.save makes those). Keep the "
                         "variables float32 (the default).")
    half = tf.as_dtype(dtype).as_datatype_enum
    choice = VariableChoice(dtype)
    if not os.path.exists(checkpoint_prefix + ".index"):
        return choice  # a SavedModel without variables
    reader = tf.train.load_checkpoint(checkpoint_prefix)
    meta_graph = proto.meta_graphs[0]
    plan = _Plan(meta_graph, _checkpoint_keys(meta_graph, reader), half)
    converted = plan.decide()
    choice.casts_removed = plan.apply(meta_graph, converted)
    choice.converted = {key: plan.names[i] for i, key in converted.items()}
    choice.kept = {plan.names[i]: why for i, why in plan.blocked.items()
                   if i in plan.candidates}
    return choice


def write_checkpoint(source_prefix, target_prefix, choice):
    """Writes the checkpoint at `source_prefix` to `target_prefix` with the converted variables
    cast to the half type (every other tensor as it is)."""
    reader = tf.train.load_checkpoint(source_prefix)
    half = tf.as_dtype(choice.dtype)
    names = sorted(reader.get_variable_to_dtype_map())
    tensors = []
    for name in names:
        value = reader.get_tensor(name)
        tensors.append(tf.cast(value, half) if name in choice.converted else tf.constant(value))
    with tf.device("CPU:0"):
        tf.raw_ops.SaveV2(prefix=target_prefix, tensor_names=names,
                          shape_and_slices=[""] * len(names), tensors=tensors)
