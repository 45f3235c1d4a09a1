"""The models `tf-mpt convert` and `tf-mpt inspect` work on: convert, run, write.

Two kinds of source, one interface:

* FrozenGraph: a GraphDef file. Inputs are its Placeholders, outputs the nodes nothing reads.
* SavedModelDir: a SavedModel directory. The SavedModel protocol buffer is rewritten as it is:
  each MetaGraph's GraphDef and every function of its library that the graph or the object
  graph (tf.saved_model.load's functions, the signatures) calls. Function signatures do not
  change, so the object graph, the signatures and the checkpoint stay valid. Variables stay
  float32 (the checkpoint is copied unchanged) unless `store_variables_in_half` stores those
  only half ops read in half (tf_mpt/models/saved_model_variables.py: object graph, functions and checkpoint).

A node is named by (function or None, node name); `--keep-fp32` takes `node` (any graph or
function holding a node of that name) or `function/node`.
"""


import contextlib
import copy
import dataclasses
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from google.protobuf import message

from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import editor as _editor
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.models import model_io as _model_io
from tf_mpt.models import retarget as _retarget
from tf_mpt.models import saved_model_variables as _variables
from tf_mpt import rewrite as _rewrite
from tf_mpt.rewrite.type_attrs import KEEP_FP32_ATTR
from tf_mpt.models.model_io import ModelError

_INIT_SIGNATURE = "__saved_model_init_op"
_FLOAT_ENUM = tf.float32.as_datatype_enum


@dataclasses.dataclass(frozen=True)
class InputSpec:
    name: str          # the feed key (signature argument or placeholder name)
    dtype: tf.DType
    shape: tuple       # None for an unknown dimension; None for an unknown rank


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A converted model, not yet written."""
    payload: object    # GraphDef or SavedModel proto
    reports: dict      # graph label -> RewriteReport
    variables: object = None  # _variables.VariableChoice when variables are stored in half

    @property
    def converted_nodes(self):
        """[(label, function or None, node name)] of nodes the rewrite put in half precision."""
        return [(label, d.function, d.name) for label, report in self.reports.items()
                for d in report.decisions.values() if d.converted]


def open_model(path):
    """A FrozenGraph or SavedModelDir for `path` (ModelError if it is neither)."""
    if _model_io.kind_of(path) == "graph_def":
        return FrozenGraph(path)
    return SavedModelDir(path)


def _source_kind(graph_def):
    """What a conversion marks its Casts with: 'float32' when the model computed in float32
    only before it (every half op after it is tf_mpt's), else 'mixed'."""
    return _retarget.FROM_MIXED if _retarget.half_types_in(graph_def) else _retarget.FROM_FLOAT32


def _sink_names(graph_def):
    consumed = {_graph_view.parse_input(i)[0] for n in graph_def.node for i in n.input
                if not i.startswith("^")}
    return {n.name for n in graph_def.node if n.name not in consumed}


def _mark_keep_fp32(graph_def, names, found):
    """Marks the nodes `names` (node or function/node) kept float32; adds them to `found`."""
    def mark(nodes, prefix):
        for node in nodes:
            for key in (node.name, f"{prefix}/{node.name}" if prefix else None):
                if key in names:
                    node.attr[KEEP_FP32_ATTR].b = True
                    found.add(key)

    mark(graph_def.node, None)
    for fdef in graph_def.library.function:
        mark(fdef.node_def, fdef.signature.name)


def _check_all_found(names, found):
    missing = sorted(set(names) - found)
    if missing:
        raise _model_io.UsageError(f"--keep-fp32 names node(s) not in the model: {', '.join(missing)}. "
                         "Use the node names `tf-mpt inspect --json` lists.")


class FrozenGraph:
    """A frozen GraphDef file."""

    kind = "frozen graph"

    def __init__(self, path):
        self.path = path
        self.graph_def = _model_io.read_graph_def(path)

    def is_converted(self):
        return _model_io.is_converted(self.graph_def)

    def input_specs(self):
        """{'graph': [InputSpec]} of the Placeholders."""
        specs = []
        for node in self.graph_def.node:
            if node.op != "Placeholder":
                continue
            shape = node.attr["shape"].shape if "shape" in node.attr else None
            dims = (None if shape is None or shape.unknown_rank
                    else tuple(None if d.size < 0 else d.size for d in shape.dim))
            specs.append(InputSpec(node.name, tf.as_dtype(node.attr["dtype"].type), dims))
        return {"graph": specs}

    def outputs(self):
        sinks = _sink_names(self.graph_def)
        return [f"{n.name}:0" for n in self.graph_def.node
                if n.name in sinks and n.op not in ("NoOp", "Placeholder", "Const")]

    def convert(self, dtype, lists, keep=(), keep_io_types=True, config=None):
        """keep_io_types=False: outputs may come out in half precision, and a float32
        Placeholder that only feeds tf_mpt's Casts to half becomes a half Placeholder.
        config: the tf_mpt.Config the rewrite decides by (its target); None: the
        environment's."""
        graph_def = tf.compat.v1.GraphDef()
        graph_def.CopyFrom(self.graph_def)
        found = set()
        _mark_keep_fp32(graph_def, set(keep), found)
        _check_all_found(keep, found)
        result = _rewrite.rewrite_graph_def(graph_def, dtype=dtype, lists=lists, strict=True,
                                            fetches=None if keep_io_types else [],
                                            config=config)
        if not keep_io_types:
            _half_placeholders(result.graph_def, tf.as_dtype(dtype).as_datatype_enum)
        _retarget.mark_source(result.graph_def, _source_kind(self.graph_def))
        return Conversion(result.graph_def, {"graph": result.report})

    def in_float32(self):
        """(this model as it was before tf_mpt converted it: a FrozenGraph in memory, Casts
        removed), ModelError if that cannot be known (see retarget.py)."""
        _retarget.check_undoable([self.graph_def], self.path)
        back = copy.copy(self)
        back.graph_def = _retarget.to_float32(self.graph_def)
        return back

    def as_conversion(self):
        """This model as a Conversion `write` writes."""
        return Conversion(self.graph_def, {})

    def graph_defs(self, conversion=None):
        """{label: GraphDef} to show or inspect."""
        return {"graph": self.graph_def if conversion is None else conversion.payload}

    def runner(self, conversion):
        return _GraphRunner(self.graph_def if conversion is None else conversion.payload,
                            self.outputs())

    def frozen(self, conversion=None):
        """{label: (GraphDef with every call inlined, {input name: placeholder name})} of the
        model, or of `conversion` (the converted graph itself)."""
        graph_def = self.graph_def if conversion is None else conversion.payload
        return {"graph": (graph_def, {s.name: s.name for s in self.input_specs()["graph"]})}

    def write(self, conversion, dst):
        def write(path):
            with open(path, "wb") as f:
                f.write(conversion.payload.SerializeToString(deterministic=True))
        _model_io.write_atomically(dst, write)


def _half_placeholders(graph_def, half_enum):
    """Makes float32 Placeholders read only by tf_mpt's Casts to half half, in place."""
    editor = _editor.Editor(graph_def, half_enum)
    for node in list(graph_def.node):
        if node.op != "Placeholder" or node.attr["dtype"].type != _FLOAT_ENUM:
            continue
        casts = [reader for reader, _ in editor.readers(node.name)]
        if not casts or not all(_casts.is_our_cast(c, _FLOAT_ENUM, half_enum) for c in casts):
            continue
        node.attr["dtype"].type = half_enum
        for cast in casts:
            editor.bypass(cast.name, node.name)
    editor.finish()


class _GraphRunner:
    """Runs a GraphDef in a Session: runner(label, {placeholder: array}) -> {output: array}."""

    def __init__(self, graph_def, outputs):
        self._graph = tf.Graph()
        with self._graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        self._outputs = outputs
        self._session = None

    def __enter__(self):
        self._session = tf.compat.v1.Session(graph=self._graph)
        return self

    def __exit__(self, *exc_info):
        self._session.close()

    def __call__(self, label, feed):
        feed = {self._graph.get_tensor_by_name(f"{k}:0"): v for k, v in feed.items()}
        feed = {t: np.asarray(v).astype(t.dtype.as_numpy_dtype) for t, v in feed.items()}
        values = self._session.run(self._outputs, feed)
        return dict(zip(self._outputs, values))


class SavedModelDir:
    """A SavedModel directory."""

    kind = "SavedModel"

    # in_float32's VariableChoice: the checkpoint's half tensors, written back in float32
    float32_variables = None

    def __init__(self, path):
        self.path = path
        self.proto = saved_model_pb2.SavedModel()
        pb = os.path.join(path, "saved_model.pb")
        if not os.path.exists(pb):
            raise ModelError(f"{path!r} has no saved_model.pb (a text saved_model.pbtxt is not "
                             "supported): save the model with tf.saved_model.save.")
        with open(pb, "rb") as f:
            data = f.read()
        try:
            self.proto.ParseFromString(data)
        except message.DecodeError as error:
            raise ModelError(f"{pb!r} is not a SavedModel protocol buffer ({error}): the file "
                             "is truncated or of another type.") from None
        if not self.proto.meta_graphs:
            raise ModelError(f"SavedModel {path!r} holds no MetaGraph.")
        self._signatures = {name: sig for name, sig
                            in self.proto.meta_graphs[0].signature_def.items()
                            if name != _INIT_SIGNATURE and sig.outputs}
        if not self._signatures:
            raise ModelError(f"SavedModel {path!r} has no signatures to convert or run. Save "
                             "it with tf.saved_model.save(obj, path, signatures=...).")
        for meta_graph in self.proto.meta_graphs:
            _model_io.check_known_ops(meta_graph.graph_def, path)

    def is_converted(self):
        return any(_model_io.is_converted(m.graph_def) for m in self.proto.meta_graphs)

    def input_specs(self):
        """{signature name: [InputSpec]}."""
        specs = {}
        for name, sig in sorted(self._signatures.items()):
            specs[name] = []
            for key, info in sorted(sig.inputs.items()):
                shape = (None if info.tensor_shape.unknown_rank
                         else tuple(None if d.size < 0 else d.size for d in info.tensor_shape.dim))
                specs[name].append(InputSpec(key, tf.as_dtype(info.dtype), shape))
        return specs

    def _label(self, index):
        tags = ",".join(self.proto.meta_graphs[index].meta_info_def.tags) or "untagged"
        return tags if len(self.proto.meta_graphs) > 1 else "saved_model"

    def convert(self, dtype, lists, keep=(), config=None):
        """config: the tf_mpt.Config the rewrite decides by (its target); None: the
        environment's."""
        proto = saved_model_pb2.SavedModel()
        proto.CopyFrom(self.proto)
        reports = {}
        names, found = set(keep), set()
        for index, meta_graph in enumerate(proto.meta_graphs):
            graph_def = meta_graph.graph_def
            _mark_keep_fp32(graph_def, names, found)
            fetches = _sink_names(graph_def)
            for sig in meta_graph.signature_def.values():
                for info in list(sig.inputs.values()) + list(sig.outputs.values()):
                    fetches.add(_graph_view.parse_input(info.name)[0])
            saver = meta_graph.saver_def
            for tensor in (saver.filename_tensor_name, saver.save_tensor_name,
                           saver.restore_op_name):
                if tensor:
                    fetches.add(_graph_view.parse_input(tensor)[0])
            roots = list(meta_graph.object_graph_def.concrete_functions)
            source = _source_kind(graph_def)
            result = _rewrite.rewrite_with_library(
                graph_def, dtype=dtype, fetches=sorted(fetches), lists=lists, strict=True,
                function_roots=roots, config=config, timing=True)
            meta_graph.graph_def.CopyFrom(result.graph_def)
            _retarget.mark_source(meta_graph.graph_def, source)
            reports[self._label(index)] = result.report
        _check_all_found(names, found)
        return Conversion(proto, reports, self.float32_variables)

    def in_float32(self):
        """(this model as it was before tf_mpt converted it: a SavedModelDir whose proto is
        in memory, its checkpoint this one's), ModelError if that cannot be known."""
        _retarget.check_undoable([m.graph_def for m in self.proto.meta_graphs], self.path)
        back = copy.copy(self)
        back.proto = saved_model_pb2.SavedModel()
        back.proto.CopyFrom(self.proto)
        for meta_graph in back.proto.meta_graphs:
            meta_graph.graph_def.CopyFrom(_retarget.to_float32(meta_graph.graph_def))
            for node in meta_graph.object_graph_def.nodes:  # `--variables half` undone
                if node.HasField("variable") and node.variable.dtype in _retarget.HALF_TYPES:
                    node.variable.dtype = tf.float32.as_datatype_enum
        half = tf.train.load_checkpoint(self._checkpoint_prefix()).get_variable_to_dtype_map()
        half = {key: key for key, dtype in half.items() if dtype in (tf.float16, tf.bfloat16)}
        if half:  # their values, rounded to half once, are written back in float32
            back.float32_variables = _variables.VariableChoice("float32", converted=half)
        return back

    def as_conversion(self):
        """This model as a Conversion `write` writes (with in_float32's variables)."""
        return Conversion(self.proto, {}, self.float32_variables)

    def graph_defs(self, conversion=None):
        proto = self.proto if conversion is None else conversion.payload
        return {self._label(i): m.graph_def for i, m in enumerate(proto.meta_graphs)}

    def _checkpoint_prefix(self):
        return os.path.join(self.path, "variables", "variables")

    def store_variables_in_half(self, conversion, dtype):
        """The conversion with the float32 variables only half ops read stored in `dtype`."""
        if self.float32_variables is not None:
            raise ModelError(
                "--variables half on a model whose variables were stored in half: write it in "
                "float32 first (--dtype float32), then convert that with --variables half.")
        proto = saved_model_pb2.SavedModel()
        proto.CopyFrom(conversion.payload)
        choice = _variables.store_in_half(proto, self._checkpoint_prefix(), dtype)
        removed = set(choice.casts_removed)
        reports = {label: dataclasses.replace(
            report, casts_added=report.casts_added - len(removed & set(report.cast_names)),
            cast_names=tuple(n for n in report.cast_names if n not in removed))
            for label, report in conversion.reports.items()}
        return Conversion(proto, reports, choice)

    def _write_directory(self, conversion, directory, link):
        """A SavedModel in `directory`: the conversion's proto, its checkpoint when variables
        are stored in half, and this model's other files (links or copies)."""
        proto, choice = conversion.payload, conversion.variables
        os.makedirs(directory, exist_ok=True)
        for entry in os.listdir(self.path):
            if entry in ("saved_model.pb", "saved_model.pbtxt", "fingerprint.pb"):
                continue
            if entry == "variables" and choice is not None and choice.converted:
                os.makedirs(os.path.join(directory, entry))
                _variables.write_checkpoint(self._checkpoint_prefix(),
                                            os.path.join(directory, entry, "variables"), choice)
                continue
            source, target = os.path.join(self.path, entry), os.path.join(directory, entry)
            if link:
                os.symlink(os.path.abspath(source), target)
            elif os.path.isdir(source):
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
        with open(os.path.join(directory, "saved_model.pb"), "wb") as f:
            f.write(proto.SerializeToString(deterministic=True))
        from tensorflow.python.saved_model import fingerprinting_utils  # pylint: disable=g-import-not-at-top
        fingerprinting_utils.write_fingerprint(directory)

    def write(self, conversion, dst):
        _model_io.write_atomically(
            dst, lambda path: self._write_directory(conversion, path, link=False))

    def runner(self, conversion):
        return _SavedModelRunner(self, conversion)

    @contextlib.contextmanager
    def on_disk(self, conversion=None):
        """The path of this model, or of `conversion` written to a temporary directory (its
        other files linked to this model's) while the context is open."""
        if conversion is None:
            yield self.path
            return
        temporary = tempfile.mkdtemp(prefix="tf_mpt-trial-")
        try:
            path = os.path.join(temporary, "model")
            self._write_directory(conversion, path, link=True)
            yield path
        finally:
            shutil.rmtree(temporary, ignore_errors=True)

    def frozen(self, conversion=None):
        """{signature: (GraphDef with variables as constants and calls inlined,
        {input name: placeholder name})} for shapes, FLOPs and per-tensor numerics: of the
        model, or of `conversion` as `write` would write it (loaded from a temporary copy)."""
        from tensorflow.python.framework import convert_to_constants  # pylint: disable=g-import-not-at-top
        with self.on_disk(conversion) as path:
            _, signatures = _model_io.load_signatures(path)
        out = {}
        for name in sorted(self._signatures):
            function = signatures[name]
            frozen = convert_to_constants.convert_variables_to_constants_v2(function)
            keys = sorted(function.structured_input_signature[1])
            placeholders = [t.op.name for t in frozen.inputs]
            out[name] = (frozen.graph.as_graph_def(), dict(zip(keys, placeholders)))
        return out


class _SavedModelRunner:
    """Loads the model (or a conversion, from a temporary directory) and calls its signatures."""

    def __init__(self, model, conversion):
        self._on_disk = model.on_disk(conversion)
        self._signatures = None

    def __enter__(self):
        _, self._signatures = _model_io.load_signatures(self._on_disk.__enter__())
        return self

    def __exit__(self, *exc_info):
        self._on_disk.__exit__(*exc_info)

    def __call__(self, label, feed):
        outputs = self._signatures[label](**{k: tf.constant(v) for k, v in feed.items()})
        return {k: v.numpy() for k, v in outputs.items()}
