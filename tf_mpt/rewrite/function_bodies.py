"""Function bodies as GraphDefs, so the same passes rewrite the graph's function library.

A FunctionDef names tensors `node:output_arg:index` and arguments by name; a GraphDef names
them `node:port`. The conversion:

    each input arg    -> a Placeholder named like the arg
    each node         -> the same node, inputs renamed to `node:port`
    each return value -> an Identity '__tf_mpt_ret__/<name>' reading it (a fetch)

and back again after the rewrite, with the Casts the rewrite added. Arguments and return
values keep their dtypes, so every caller of a function stays valid.
"""

from tensorflow.core.framework import function_pb2
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import op_def_registry

from tf_mpt.rewrite import type_attrs as ta

RET_PREFIX = "__tf_mpt_ret__/"


class UnsupportedFunction(Exception):
    """The function uses a form the conversion does not handle; it is left as it is."""


def all_nodes(graph_def):
    """Every NodeDef of `graph_def`: its own, then each library function's body's."""
    yield from graph_def.node
    for fdef in graph_def.library.function:
        yield from fdef.node_def


def called_functions(node):
    """The NameAttrLists of a node's function-valued attrs (While body/cond, call targets).

    They are the protos themselves, so a caller may rename them in place; in the order of
    their attrs' names (a map's own order is not the same in every process: a While's
    `body` and `cond`).
    """
    for _, value in sorted(node.attr.items()):
        if value.HasField("func"):
            yield value.func
        yield from value.list.func


def function_references(graph_def):
    """{function name: how many nodes (in the graph and in every function) call it}."""
    counts = {}
    for nodes in [graph_def.node] + [f.node_def for f in graph_def.library.function]:
        for node in nodes:
            for func in called_functions(node):
                counts[func.name] = counts.get(func.name, 0) + 1
    return counts


def _op_def(op, signatures):
    op_def = op_def_registry.get(op)
    if op_def is None:
        op_def = signatures.get(op)
    if op_def is None:
        raise UnsupportedFunction(f"unknown op {op}")
    return op_def


def _output_layout(node, signatures):
    """[(output arg name, index within the arg)] per flat output port of `node`."""
    op_def = _op_def(node.op, signatures)
    attrs = {a.name: a for a in op_def.attr}
    return [(arg.name, k) for arg in op_def.output_arg
            for k in range(len(ta.arg_ports(arg, node, attrs)))]


def function_to_graph_def(fdef, signatures):
    """Returns (graph_def, fetches) for one FunctionDef."""
    args = [a.name for a in fdef.signature.input_arg]
    node_names = {n.name for n in fdef.node_def}
    if set(args) & node_names:
        raise UnsupportedFunction("an argument and a node share a name")
    graph_def = graph_pb2.GraphDef()
    for arg in fdef.signature.input_arg:
        if not arg.type:
            raise UnsupportedFunction(f"argument {arg.name} has a polymorphic type")
        placeholder = graph_def.node.add(name=arg.name, op="Placeholder")
        placeholder.attr["dtype"].type = arg.type
    offsets = {}
    nodes_by_name = {n.name: n for n in fdef.node_def}

    def port_of(node_name, out_arg, index):
        table = offsets.get(node_name)
        if table is None:
            table = {}
            for port, key in enumerate(_output_layout(nodes_by_name[node_name], signatures)):
                table[key] = port
            offsets[node_name] = table
        try:
            return table[(out_arg, index)]
        except KeyError:
            raise UnsupportedFunction(f"{node_name} has no output {out_arg}:{index}") from None

    def convert(tensor):
        if tensor.startswith("^"):
            return tensor
        parts = tensor.split(":")
        if len(parts) == 1 or (len(parts) == 2 and parts[0] in args):
            if parts[0] not in args:
                raise UnsupportedFunction(f"input {tensor!r} names no argument")
            return parts[0]
        if len(parts) != 3 or parts[0] not in nodes_by_name:
            raise UnsupportedFunction(f"cannot read input {tensor!r}")
        port = port_of(parts[0], parts[1], int(parts[2]))
        return parts[0] if port == 0 else f"{parts[0]}:{port}"

    for node in fdef.node_def:
        _copy_node(graph_def.node.add(), node, convert)
    fetches = list(args)
    for out in fdef.signature.output_arg:
        if out.name not in fdef.ret or not out.type:
            raise UnsupportedFunction(f"return value {out.name} is polymorphic or missing")
        ret = graph_def.node.add(name=RET_PREFIX + out.name, op="Identity",
                                 input=[convert(fdef.ret[out.name])])
        ret.attr["T"].type = out.type
        fetches.append(ret.name)
    fetches.extend(fdef.control_ret.values())
    return graph_def, fetches


def graph_def_to_function(graph_def, fdef, signatures):
    """The FunctionDef `fdef` with its body replaced by the rewritten `graph_def`."""
    args = {a.name for a in fdef.signature.input_arg}
    body = [n for n in graph_def.node if n.name not in args and not n.name.startswith(RET_PREFIX)]
    by_name = {n.name: n for n in body}
    layouts = {}

    def convert(tensor):
        if tensor.startswith("^"):
            return tensor
        name, sep, port = tensor.rpartition(":")
        if not sep or not port.isdigit():
            name, port = tensor, "0"
        if name in args:
            return name
        layout = layouts.get(name)
        if layout is None:
            layout = layouts[name] = _output_layout(by_name[name], signatures)
        out_arg, index = layout[int(port)]
        return f"{name}:{out_arg}:{index}"

    new = function_pb2.FunctionDef()
    new.CopyFrom(fdef)
    del new.node_def[:]
    for node in body:
        _copy_node(new.node_def.add(), node, convert)
    rets = {n.name[len(RET_PREFIX):]: n for n in graph_def.node if n.name.startswith(RET_PREFIX)}
    for name, ret_node in rets.items():
        new.ret[name] = convert(ret_node.input[0])
    return new


def _copy_node(new, node, convert):
    """`new` (a fresh NodeDef) becomes `node` with each input name mapped by `convert`
    (between a FunctionDef's 'node:output:index' form and a GraphDef's 'node:port')."""
    new.CopyFrom(node)
    del new.input[:]
    new.input.extend(convert(t) for t in node.input)
