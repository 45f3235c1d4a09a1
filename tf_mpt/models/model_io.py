"""Loading, checking and writing the models `tf-mpt convert` / `tf-mpt inspect` work on.

A source is a frozen GraphDef file (.pb) or a SavedModel directory. Every failure is a
ModelError saying what is wrong with which path and what to do; nothing is written to a
destination unless the whole conversion succeeded (a temporary path is renamed at the end).
"""

import os
import shutil
import tempfile

import tensorflow as tf
from google.protobuf import message
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import op_def_registry

from tf_mpt.rewrite import casts as _casts
from tf_mpt.rewrite import function_bodies as _function_bodies


class ModelError(Exception):
    """A model path (or another input: sample inputs, a target table, a setting) cannot be
    used: the message says why and what to do. `tf-mpt` exits with 4 (bad input)."""


class UsageError(ModelError):
    """The command line asks for what cannot be done as asked (options that do not go
    together, one that does not apply to this kind of model, a node the model does not
    have, a destination that exists): the message says what to pass. Exit code 2, as
    argparse's own usage errors."""


class ValidationFailed(ModelError):
    """The converted model's outputs differ from float32's beyond the check's tolerance
    (and --auto-deny, where asked, found no conversion that passes): nothing was written.
    Exit code 1."""


def kind_of(path):
    """'saved_model' or 'graph_def'; raises ModelError for anything else."""
    if not os.path.exists(path):
        raise ModelError(f"{path!r} does not exist. Pass a SavedModel directory or a frozen "
                         "GraphDef file (.pb).")
    if os.path.isdir(path):
        if not any(os.path.exists(os.path.join(path, f))
                   for f in ("saved_model.pb", "saved_model.pbtxt")):
            raise ModelError(f"{path!r} is a directory without saved_model.pb, so not a "
                             "SavedModel. Pass the SavedModel's own directory.")
        return "saved_model"
    return "graph_def"


def read_graph_def(path):
    """The GraphDef in a frozen-graph file, checked for unknown ops."""
    with open(path, "rb") as f:
        data = f.read()
    graph_def = graph_pb2.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except message.DecodeError as error:
        raise ModelError(f"{path!r} is not a GraphDef protocol buffer ({error}): the file is "
                         "truncated or of another type. Pass a frozen GraphDef (.pb) or a "
                         "SavedModel directory.") from None
    if not graph_def.node:
        raise ModelError(f"{path!r} holds no graph nodes, so it is not a frozen GraphDef "
                         "(an empty or foreign file).")
    check_known_ops(graph_def, path)
    return graph_def


def check_known_ops(graph_def, path):
    """ModelError naming the ops (in the graph or its functions) TensorFlow does not know."""
    library = {f.signature.name for f in graph_def.library.function}
    unknown = sorted({n.op for n in _function_bodies.all_nodes(graph_def)
                      if op_def_registry.get(n.op) is None and n.op not in library})
    if unknown:
        raise ModelError(f"{path!r} uses ops this TensorFlow does not know: "
                         f"{', '.join(unknown)}. Load the library that defines them "
                         "(tf.load_op_library) before converting.")


def load_signatures(path):
    """(loaded object, {signature name: ConcreteFunction}) of a SavedModel."""
    try:
        loaded = tf.saved_model.load(path)
    except Exception as error:  # pylint: disable=broad-except
        raise ModelError(f"{path!r} could not be loaded as a SavedModel "
                         f"({type(error).__name__}: {error}).") from None
    signatures = dict(getattr(loaded, "signatures", {}) or {})
    if not signatures:
        raise ModelError(f"SavedModel {path!r} has no signatures to convert. Save it with "
                         "tf.saved_model.save(obj, path, signatures=...).")
    return loaded, signatures


def is_converted(graph_def):
    """True if tf_mpt already rewrote this graph (its Casts are in it)."""
    return any(n.name.endswith(_casts.CAST_SUFFIX)
               for n in _function_bodies.all_nodes(graph_def))


def check_destination(path):
    if os.path.exists(path):
        raise UsageError(f"destination {path!r} already exists; remove it or pick another path "
                         "(tf-mpt convert never overwrites).")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"the directory of the destination, {parent!r}, does not exist.")


def write_atomically(path, write):
    """Calls write(temporary path) and renames the result to `path` only if it succeeds."""
    parent = os.path.dirname(os.path.abspath(path))
    temporary = tempfile.mkdtemp(prefix=".tf_mpt-", dir=parent)
    target = os.path.join(temporary, "out")
    try:
        write(target)
        os.replace(target, path)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
