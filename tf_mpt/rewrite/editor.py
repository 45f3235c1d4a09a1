"""The one graph editor: every edit of a GraphDef after painting goes through it.

    editor = Editor(graph_def, half)    index: nodes by name, the readers of every tensor,
                                        the Casts already in the graph
    editor.cast(tensor, to)             the tensor in dtype `to`: one Cast per (tensor, dtype)
    editor.set_input(node, k, tensor)   input k of node reads `tensor` (index kept current)
    editor.bypass(name, tensor)         every reader of name:0 reads `tensor` instead
    editor.drop_unread(names)           these nodes go at finish() if nobody reads them then
    editor.finish()                     adds the new Casts, removes the unread nodes

Cast rules (the only place they live):
* at most one Cast per (tensor, dtype), shared by every reader that needs it; a Cast already
  in the graph that does the conversion (no control inputs) is reused;
* no fp32 -> half -> fp32 round trip is added: half wanted from `Cast(h: half -> fp32)` is
  `h` itself (and tf_mpt's Cast, if that was one, goes when nobody reads it any more);
* a Fill of a constant that only the loop or call fed half reads is made half itself (a Cast
  of Fill(shape, v) is Fill(shape, cast(v))) where the half type holds v exactly and
  neither is fetched or opted out (feed_half's `kept`);
* new Casts are named `<producer>-<port>-CastToFp16-TfMpt` (`Bf16`, `Fp32`), with `-<k>`
  before `-TfMpt` only if the name is taken, so reruns give identical graphs, and placed on
  their producer's device.

Tensor names are GraphDef names: `node` (port 0), `node:port`, `^node` (control input);
`tensor_name` and `graph_view.parse_input` are the codec.
"""

import collections

import numpy as np
from tensorflow.python.framework import dtypes as tf_dtypes
from tensorflow.python.framework import tensor_util

from tf_mpt import _dtypes
from tf_mpt import _opt_out
from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite.graph_view import parse_input

DT_FLOAT = _dtypes.DT_FLOAT


def _changeable(node, kept):
    """The node's dtypes may change: not in `kept` (names), not opted out."""
    return node.name not in kept and not (
        _opt_out.KEEP_FP32_ATTR in node.attr and node.attr[_opt_out.KEEP_FP32_ATTR].b)


def tensor_name(node_name, port):
    """The GraphDef name of output `port` of a node (port -1: its control output)."""
    if port < 0:
        return "^" + node_name
    return node_name if port == 0 else f"{node_name}:{port}"


class Editor:
    """A GraphDef (the main graph, or a function body as a GraphDef) being edited in place.

    Args:
        graph_def: edited in place; new nodes are appended at finish().
        half: the half DataType enum of this rewrite.
        reusable: which Casts already in the graph may be shared (default: every Cast with
            one data input and no control inputs); apply_paint excludes the Casts whose own
            input is about to change dtype.
    """

    def __init__(self, graph_def, half, reusable=None):
        self.graph_def = graph_def
        self.half = half
        self.by_name = {n.name: n for n in graph_def.node}
        self.taken = set(self.by_name)
        # producer name -> port (-1: control) -> [(reader node, input index)]
        self._readers = collections.defaultdict(lambda: collections.defaultdict(list))
        self._casts = {}  # ((name, port), DstT) -> name of a Cast doing that conversion
        self.added = []  # Casts made, in order
        self._drop = set()  # names to remove at finish() if unread then
        self._replaced = {}  # name of a bypassed node -> the tensor its readers read now
        for node in graph_def.node:
            self._index(node)
            if node.op == "Cast" and len(node.input) == 1 and (
                    reusable is None or reusable(node)):
                self._casts.setdefault((parse_input(node.input[0]), node.attr["DstT"].type),
                                       node.name)

    def _index(self, node):
        for k, tensor in enumerate(node.input):
            name, port = parse_input(tensor)
            self._readers[name][port].append((node, k))

    # --- reading -----------------------------------------------------------------------

    def readers(self, name, port=0):
        """[(node, input index)] reading output `port` of `name` (-1: control readers)."""
        ports = self._readers.get(name)
        return list(ports.get(port, ())) if ports else []

    def all_readers(self, name):
        """Every node reading any output of `name`, or depending on it by control."""
        ports = self._readers.get(name)
        return [reader for entries in ports.values() for reader, _ in entries] if ports else []

    def producer(self, tensor):
        """(node or None, port) of a tensor name."""
        name, port = parse_input(tensor)
        return self.by_name.get(name), port

    # --- editing -----------------------------------------------------------------------

    def set_input(self, node, k, tensor):
        """Input k of `node` reads `tensor` from now on."""
        name, port = parse_input(node.input[k])
        entries = self._readers.get(name, {}).get(port, [])
        for index, (reader, position) in enumerate(entries):
            if reader is node and position == k:
                del entries[index]
                break
        node.input[k] = tensor
        name, port = parse_input(tensor)
        self._readers[name][port].append((node, k))

    def bypass(self, name, tensor):
        """Every data reader of `name`:0 reads `tensor` instead, and every control reader
        waits for `tensor`'s producer; `name` goes if nothing else reads it then."""
        for reader, k in self.readers(name, 0):
            self.set_input(reader, k, tensor)
        for reader, k in self.readers(name, -1):
            self.set_input(reader, k, "^" + parse_input(tensor)[0])
        self._replaced[name] = tensor
        self._drop.add(name)

    def drop_unread(self, names):
        """The named nodes are removed at finish() if nothing reads them then."""
        self._drop.update(names)

    def cast(self, tensor, to, from_dtype=None):
        """The name of `tensor` in dtype `to` (a DataType enum): `tensor` before a Cast from
        `to` to float32, the graph's or an earlier call's Cast, or a new Cast.

        `from_dtype`: the tensor's dtype (default: half when `to` is float32, else float32).
        """
        producer, _ = self.producer(tensor)
        if (to != DT_FLOAT and producer is not None and len(producer.input) == 1
                and _casts.is_cast(producer, to, DT_FLOAT)):
            # (a Cast with control inputs is not undone: they order it)
            if _casts.is_our_cast(producer, to, DT_FLOAT):
                self._drop.add(producer.name)
            return producer.input[0]
        key = (parse_input(tensor), to)
        name = self._casts.get(key)
        while name in self._replaced:  # a Cast made redundant: what replaced it
            name = self._replaced[name]
        if name is None:
            if from_dtype is None:
                from_dtype = self.half if to == DT_FLOAT else DT_FLOAT
            cast = _casts.new_cast(self.taken, tensor, from_dtype, to,
                                   producer.device if producer is not None else "")
            self.added.append(cast)
            self.by_name[cast.name] = cast
            self._index(cast)
            name = self._casts[key] = cast.name
        return name

    def feed_half(self, node, k, kept=None):
        """Input k of `node` (a While or call switched to half there) reads its tensor in half.

        kept: names of the nodes whose dtypes must not change (the fetched ones); when
        given, a Fill of a constant that only `node` reads may be made half instead of cast
        (_fill_made_half)."""
        if kept is None or not self._fill_made_half(node.input[k], node, kept):
            self.set_input(node, k, self.cast(node.input[k], self.half))

    def _fill_made_half(self, tensor, reader, kept):
        """If `tensor` is a float32 Fill of a scalar Const, the Fill read only by `reader`
        and the Const only by the Fill, neither in `kept` nor opted out, and the half type
        holds the value exactly (the zeros a gradient loop starts its sums from): both
        become half in place. True if so."""
        fill, port = self.producer(tensor)
        if fill is None or port != 0 or fill.op != "Fill" or \
                fill.attr["T"].type != DT_FLOAT or not _changeable(fill, kept) or \
                [r.name for r in self.all_readers(fill.name)] != [reader.name]:
            return False
        value, _ = self.producer(fill.input[1])
        if value is None or value.op != "Const" or value.attr["dtype"].type != DT_FLOAT or \
                not _changeable(value, kept) or \
                [r.name for r in self.all_readers(value.name)] != [fill.name]:
            return False
        try:
            number = tensor_util.MakeNdarray(value.attr["value"].tensor)
        except (TypeError, ValueError):
            return False
        half = number.astype(tf_dtypes.as_dtype(self.half).as_numpy_dtype)
        if number.shape != () or not np.array_equal(half.astype(np.float32), number):
            return False
        value.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(half, dtype=self.half))
        value.attr["dtype"].type = self.half
        fill.attr["T"].type = self.half
        return True

    def read_half(self, name, port, original=None):
        """Output `port` of `name` is half from now on. tf_mpt's Casts of it to half are
        bypassed (their readers read it as it is); every other data reader reads a Cast of it
        to float32 or, when given, `original`: a float32 tensor of the same value (a loop
        invariant's input, never rounded)."""
        out = tensor_name(name, port)
        fp32 = original
        for reader, k in self.readers(name, port):
            if reader.name in self._replaced:
                continue
            if _casts.is_our_cast(reader, DT_FLOAT, self.half):
                self.bypass(reader.name, out)
                continue
            if fp32 is None:
                fp32 = self.cast(out, DT_FLOAT)
            self.set_input(reader, k, fp32)

    def finish(self):
        """Appends the new Casts and removes the nodes to drop that nobody reads (a dropped
        node's own inputs stop counting, so a chain of them goes together).

        Returns the names of the Casts added that are still in the graph.
        """
        self._drop.update(c.name for c in self.added)  # a Cast whose readers moved on
        drop = set()
        changed = True
        while changed:
            changed = False
            for name in sorted(self._drop - drop):
                if all(reader.name in drop for reader in self.all_readers(name)):
                    drop.add(name)
                    changed = True
        added = [c for c in self.added if c.name not in drop]
        self.graph_def.node.extend(added)
        if len(added) + len(drop) > len(self.added):  # a node of the graph itself goes
            keep = [n for n in self.graph_def.node if n.name not in drop]
            del self.graph_def.node[:]
            self.graph_def.node.extend(keep)
        self._drop.clear()
        return [c.name for c in added]
