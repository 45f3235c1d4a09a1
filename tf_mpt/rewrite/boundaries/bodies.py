"""A library function's body, as the boundary passes edit it at its signature.

The body is a GraphDef (function_bodies.function_to_graph_def: each argument a Placeholder
named like it, each return value an Identity `__tf_mpt_ret__/<name>` reading it) edited
through the editor, so a body and the main graph are read and changed the same way.
`write_back()` turns it into the FunctionDef again, with the signature's new dtypes, when
anything changed.

    body = Body(fdef, signatures, half)
    casts = body.entry_casts(k)          tf_mpt's Casts to half that alone read argument k
    body.remove_entry_casts(k, casts)    their readers read the argument itself
    body.read_argument_half(k)           its Casts to half bypassed, other readers cast back
    cast = body.exit_cast(k)             tf_mpt's Cast to float32 that output k returns
    body.return_before_exit_cast(k, cast)
    body.set_half(inputs=[k], outputs=[k]); body.write_back()
"""

from tf_mpt import _dtypes
from tf_mpt.rewrite import editor as _editor
from tf_mpt.rewrite import function_bodies as _function_bodies
from tf_mpt.rewrite import type_attrs as ta
from tf_mpt.rewrite.casts import is_our_cast

DT_FLOAT = _dtypes.DT_FLOAT
UnsupportedFunction = _function_bodies.UnsupportedFunction


class Library:
    """The graph's functions by name, their signatures, how many nodes call each (kept
    current as calls are specialised) and those with a registered gradient. Built once per
    sweep and shared by every scope (the main graph and each function body) the boundary
    passes run on."""

    def __init__(self, graph_def):
        self.graph_def = graph_def
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.signatures = {name: f.signature for name, f in self.functions.items()}
        self.references = _function_bodies.function_references(graph_def)
        self.with_gradient = {g.function_name for g in graph_def.library.gradient}

    def specialise(self, func, new_name):
        """The caller naming the function through `func` (a NameAttrList of one node) calls
        a copy of it named `new_name` from now on; returns the copy."""
        copy = self.graph_def.library.function.add()
        copy.CopyFrom(self.functions[func.name])
        copy.signature.name = new_name
        self.references[func.name] -= 1
        func.name = new_name
        self.references[new_name] = 1
        for node in copy.node_def:  # the copy's own calls count too
            for called in _function_bodies.called_functions(node):
                self.references[called.name] = self.references.get(called.name, 0) + 1
        self.functions[new_name] = copy
        self.signatures[new_name] = copy.signature
        return copy


def switchable_nodes(graph_def, ops, fetched):
    """The main graph's nodes of these ops whose dtypes may change (not fetched, not opted
    out), in graph order."""
    return [node for node in graph_def.node if node.op in ops and node.name not in fetched
            and not (ta.KEEP_FP32_ATTR in node.attr and node.attr[ta.KEEP_FP32_ATTR].b)]


class MainGraph:
    """The main graph as a scope beside the Bodies: the same editor; write_back finishes it."""

    name = None

    def __init__(self, graph_def, half):
        self.graph_def = graph_def
        self.editor = _editor.Editor(graph_def, half)
        self.changed = False

    def write_back(self):
        self.editor.finish()


class Body:
    """One FunctionDef's body, editable (raises UnsupportedFunction for a form the
    conversion does not handle: such a body was never rewritten, so it has nothing to undo)."""

    def __init__(self, fdef, signatures, half):
        self.fdef = fdef
        self.signatures = signatures
        self.half = half
        self.graph_def, _ = _function_bodies.function_to_graph_def(fdef, signatures)
        self.editor = _editor.Editor(self.graph_def, half)
        self._half_inputs, self._half_outputs = set(), set()
        self.changed = False

    @property
    def name(self):
        return self.fdef.signature.name

    def arg(self, k):
        return self.fdef.signature.input_arg[k].name

    def ret_node(self, k):
        out = self.fdef.signature.output_arg[k].name
        return self.editor.by_name[_function_bodies.RET_PREFIX + out]

    def entry_casts(self, k):
        """tf_mpt's Casts to half reading argument k ([] if nothing reads it), or None when
        anything else reads it (another op, or a return value)."""
        found = self.readers_of_argument(k)
        return found[0] if found is not None and not found[1] else None

    def readers_of_argument(self, k):
        """(tf_mpt's Casts to half reading argument k, its other data readers), or None when
        a return value reads it."""
        readers = [node for node, _ in self.editor.readers(self.arg(k))]
        if any(node.name.startswith(_function_bodies.RET_PREFIX) for node in readers):
            return None
        casts = [node for node in readers if is_our_cast(node, DT_FLOAT, self.half)]
        return casts, [node for node in readers if node not in casts]

    def read_argument_half(self, k):
        """Argument k is half from now on: its Casts to half are bypassed, its other readers
        read one Cast of it to float32."""
        self.editor.read_half(self.arg(k), 0)
        self.changed = True

    def remove_entry_casts(self, k, casts):
        """The readers of these Casts of argument k read the argument itself."""
        for cast in casts:
            self.editor.bypass(cast.name, self.arg(k))
        self.changed = True

    def _returned_through_identities(self, k):
        """([the Identity nodes (one data input each) return value k reads through, the
        returned one first], the tensor the last of them reads, or the return value's own
        input when there are none)."""
        chain, ref = [], self.ret_node(k).input[0]
        while True:
            node, port = self.editor.producer(ref)
            data = [t for t in node.input if not t.startswith("^")] if node is not None else []
            if node is None or port != 0 or node.op != "Identity" or len(data) != 1:
                return chain, ref
            chain.append(node)
            ref = data[0]

    def _exit_chain(self, k):
        """(tf_mpt's Cast to float32 whose output return value k is, maybe through Identity
        nodes nothing else reads, [those Identity nodes, the returned one first]), or
        (None, [])."""
        chain, ref = self._returned_through_identities(k)
        for node, read_by in zip(chain, [self.ret_node(k)] + chain):
            if [r.name for r, _ in self.editor.readers(node.name, 0)] != [read_by.name]:
                return None, []
        producer, _ = self.editor.producer(ref)
        if producer is not None and is_our_cast(producer, self.half, DT_FLOAT):
            return producer, chain
        return None, []

    def exit_cast(self, k):
        """tf_mpt's Cast to float32 whose output return value k is (directly, or through
        Identity nodes only it reads: while_v2 returns a body's values so), or None."""
        return self._exit_chain(k)[0]

    def return_before_exit_cast(self, k, cast):
        """Return value k is the exit Cast's input (its Identity nodes made half); the Cast
        goes when nothing else reads it."""
        _, chain = self._exit_chain(k)
        for node in chain:
            node.attr["T"].type = self.half
        # (an Identity's data input, like a return value's, is its first)
        self.editor.set_input(chain[-1] if chain else self.ret_node(k), 0, cast.input[0])
        self.editor.drop_unread([cast.name])
        self.changed = True

    def identity_chain(self, k):
        """The Identity nodes through which return value k is argument k unchanged (returned
        one first; [] when it returns the argument itself), or None when it is not the
        argument or something else reads a chain node."""
        chain, ref = self._returned_through_identities(k)
        if ref != self.arg(k):
            return None
        ret = self.ret_node(k)
        allowed = {n.name for n in chain} | {ret.name}
        for node in chain:
            if any(reader.name not in allowed for reader in self.editor.all_readers(node.name)):
                return None  # another node or return value reads the chain
        return chain

    def set_half(self, inputs=(), outputs=()):
        """Arguments `inputs` and return values `outputs` are half in the signature."""
        self._half_inputs.update(inputs)
        self._half_outputs.update(outputs)
        self.changed = True

    def write_back(self):
        """Replaces the FunctionDef's body and signature dtypes if anything changed."""
        if not self.changed:
            return
        self.editor.finish()
        new = _function_bodies.graph_def_to_function(self.graph_def, self.fdef, self.signatures)
        for k in self._half_inputs:
            new.signature.input_arg[k].type = self.half
        for k in self._half_outputs:
            new.signature.output_arg[k].type = self.half
        self.fdef.CopyFrom(new)
        self.changed = False
