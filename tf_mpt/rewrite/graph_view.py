"""A read-only index over a GraphDef: nodes by name, data fan-in/fan-out by port, control edges.

Built once per rewrite; nothing here edits the GraphDef. Malformed graphs (duplicate names,
inputs naming missing nodes or ports) raise GraphDefError, a ValueError.
"""

import collections


# Ops that make a variable, and the ops that give a TF1 one its initial value
VARIABLE_OPS = frozenset(("VariableV2", "Variable", "VarHandleOp"))
INITIALIZING_OPS = frozenset(("Assign", "AssignVariableOp"))


def initialized_variable(node, op_of):
    """The name of the variable `node` initializes, when it is a TF1 variable's initializer
    (`<variable>/Assign` assigning to `<variable>`, a variable op), else None. op_of: a node
    name -> its op, or None when the graph has no such node."""
    if node.op not in INITIALIZING_OPS or not node.name.endswith("/Assign") or not node.input:
        return None
    variable = node.name[:-len("/Assign")]
    if node.input[0].partition(":")[0] != variable or op_of(variable) not in VARIABLE_OPS:
        return None
    return variable


class GraphDefError(ValueError):
    """The GraphDef is malformed: what is wrong, where, and how to fix it."""


def parse_input(name):
    """'^a' -> ('a', -1); 'a:2' -> ('a', 2); 'a' -> ('a', 0)."""
    if name.startswith("^"):
        return name[1:], -1
    head, sep, tail = name.rpartition(":")
    if sep and tail.isdigit():
        return head, int(tail)
    return name, 0


class GraphView:
    """Index over `graph_def.node`.

    Attributes:
        nodes: the NodeDefs, in GraphDef order (not copies: never edit them).
        index: node name -> position in `nodes`.
        fanin: per node, list of (producer index, producer output port) per data input port.
        control_fanin: per node, list of producer indices of control inputs.
        fanout: per node, dict output port -> list of (consumer index, consumer input port).
        has_control_fanout: per node, True if some node has a control input from it.
    """

    def __init__(self, graph_def):
        self.nodes = list(graph_def.node)
        self.index = {}
        for i, node in enumerate(self.nodes):
            if node.name in self.index:
                raise GraphDefError(
                    f"GraphDef has two nodes named {node.name!r} (positions "
                    f"{self.index[node.name]} and {i}); node names must be unique. Rename one.")
            self.index[node.name] = i
        n = len(self.nodes)
        self.fanin = [None] * n
        self.control_fanin = [None] * n
        self.fanout = [None] * n
        self.has_control_fanout = [False] * n
        index = self.index
        for i, node in enumerate(self.nodes):
            data, control = [], []
            for inp in node.input:
                src_name, port = parse_input(inp)
                src = index.get(src_name)
                if src is None:
                    raise GraphDefError(
                        f"Node {node.name!r} (op {node.op}) has input {inp!r}, but the graph "
                        f"has no node named {src_name!r}. Add that node or fix the input name.")
                if port < 0:
                    control.append(src)
                    self.has_control_fanout[src] = True
                else:
                    if control:
                        raise GraphDefError(
                            f"Node {node.name!r} lists data input {inp!r} after a control "
                            "input; data inputs must come first.")
                    data.append((src, port))
                    fo = self.fanout[src]
                    if fo is None:
                        fo = self.fanout[src] = collections.defaultdict(list)
                    fo[port].append((i, len(data) - 1))
            self.fanin[i] = data
            self.control_fanin[i] = control
        self._empty = {}

    def op_of(self, name):
        """The op of the node named `name`, or None when there is none."""
        i = self.index.get(name)
        return None if i is None else self.nodes[i].op

    def fanout_of(self, i):
        """Returns dict output port -> [(consumer, input port)] for node i (may be empty)."""
        return self.fanout[i] or self._empty

    def readers(self, i):
        """The set of nodes reading any output of node i (data inputs)."""
        return {dst for consumers in self.fanout_of(i).values() for dst, _ in consumers}

    def has_data_fanout(self, i):
        return bool(self.fanout[i])

    def __len__(self):
        return len(self.nodes)
