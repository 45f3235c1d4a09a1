"""The models `tf-mpt convert` and `tf-mpt inspect` work on: convert, run, validate, write.

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
from tf_mpt.models import progress as _progress
from tf_mpt.models import saved_model_variables as _variables
from tf_mpt import rewrite as _rewrite
from tf_mpt.rewrite.type_attrs import KEEP_FP32_ATTR
from tf_mpt.models.model_io import ModelError

# --validate's default check, per output over all samples (see `Tolerance`). The bounds are
# about 20 units of roundoff (float16 4.9e-4, bfloat16 3.9e-3): a Keras MobileNetV2 in float16
# gives 5.5e-3, a deny op run in half (an overflow, a lost small value) gives 1e-1 and more.
DEFAULT_REL_L2 = {"float16": 1e-2, "bfloat16": 8e-2}
# Class-score outputs: the share of samples whose top-1 class must not change.
DEFAULT_TOP1 = 0.9
# The elementwise bound |converted - float32| <= atol + rtol * |float32| is printed with these
# values and enforced only when --rtol or --atol is given: near-zero logits of a real model
# fail any elementwise bound loose enough to be useful elsewhere.
DEFAULT_TOLERANCES = {"float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2)}
_CLASS_SCORE_WORDS = ("logit", "prob", "score", "class", "pred", "softmax")
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
        raise ModelError(f"--keep-fp32 names node(s) not in the model: {', '.join(missing)}. "
                         "Use the node names `tf-mpt inspect --json` lists.")


def _random_feed(spec, rng):
    if spec.shape is None:
        raise ModelError(f"input {spec.name!r} has an unknown rank, so no random sample can be "
                         "made for it. Pass --inputs file.npz with an array for it.")
    shape = [1 if d is None else d for d in spec.shape]
    if spec.dtype.is_floating:
        return rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype)
    if spec.dtype.is_integer:
        return rng.integers(0, 10, shape).astype(spec.dtype.as_numpy_dtype)
    if spec.dtype == tf.bool:
        return rng.integers(0, 2, shape).astype(bool)
    raise ModelError(f"input {spec.name!r} has dtype {spec.dtype.name}, for which no random "
                     "sample can be made. Pass --inputs file.npz with an array for it.")


def sample_feeds(specs, samples, seed=0, inputs_file=None):
    """[{label: {input name: array}}] with one entry per sample.

    From `inputs_file` (an .npz whose keys are input names, or `label/name` when several
    signatures share a name): one sample, each array fed as it is. Otherwise `samples` random
    samples; an unknown dimension is 1.
    """
    if inputs_file is not None:
        try:
            arrays = dict(np.load(inputs_file))
        except (OSError, ValueError) as error:
            raise ModelError(f"--inputs {inputs_file!r} could not be read as an .npz file "
                             f"({error}). Save one with numpy.savez(path, name=array, ...).")
        feeds = {}
        for label, label_specs in specs.items():
            feeds[label] = {}
            for spec in label_specs:
                array = arrays.get(f"{label}/{spec.name}", arrays.get(spec.name))
                if array is None:
                    raise ModelError(
                        f"--inputs {inputs_file!r} has no array for input {spec.name!r} of "
                        f"{label!r} (keys: {', '.join(sorted(arrays)) or 'none'}).")
                feeds[label][spec.name] = array.astype(spec.dtype.as_numpy_dtype)
        return [feeds]
    rng = np.random.default_rng(seed)
    return [{label: {spec.name: _random_feed(spec, rng) for spec in label_specs}
             for label, label_specs in specs.items()} for _ in range(samples)]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """What --validate checks, per output over all samples.

    rel_l2: bound on ||converted - float32||_2 / ||float32||_2 (the absolute L2 norm when
        float32's is 0).
    top1: for class-score outputs ([batch, classes], named like logits/probs/scores or rows of
        probabilities), the share of samples whose top-1 class must stay the same.
    rtol, atol: the elementwise bound atol + rtol * |float32|, always printed.
    elementwise: enforce the elementwise bound too (--rtol/--atol given).
    """
    rel_l2: float
    top1: float
    rtol: float
    atol: float
    elementwise: bool = False

    @classmethod
    def for_dtype(cls, dtype, rtol=None, atol=None):
        """The defaults for `dtype`; an explicit rtol/atol turns the elementwise check on."""
        default_rtol, default_atol = DEFAULT_TOLERANCES[dtype]
        return cls(DEFAULT_REL_L2[dtype], DEFAULT_TOP1,
                   default_rtol if rtol is None else rtol, default_atol if atol is None else atol,
                   elementwise=rtol is not None or atol is not None)

    def describe(self):
        text = (f"pass: relative L2 error <= {self.rel_l2:g} per output, top-1 agreement >= "
                f"{self.top1:.0%} for class scores")
        if self.elementwise:
            text += f", every element within atol {self.atol:g} + rtol {self.rtol:g} * |float32|"
        return text


@dataclasses.dataclass
class OutputError:
    """One output's errors over all samples."""
    label: str
    output: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    failing: int = 0   # elements outside atol + rtol * |reference|
    total: int = 0
    sum_sq_diff: float = 0.0
    sum_sq_ref: float = 0.0
    top1_same: int = 0
    top1_total: int = 0  # 0: not a class-score output

    @property
    def rel_l2(self):
        if self.sum_sq_diff == 0.0:
            return 0.0
        if self.sum_sq_ref == 0.0:
            return float(np.sqrt(self.sum_sq_diff))
        return float(np.sqrt(self.sum_sq_diff / self.sum_sq_ref))

    @property
    def top1(self):
        return self.top1_same / self.top1_total if self.top1_total else None

    def failures(self, tolerance):
        """What fails under `tolerance` (empty when the output passes)."""
        out = []
        if not self.rel_l2 <= tolerance.rel_l2:  # NaN fails
            out.append(f"relative L2 error {self.rel_l2:.3g} > {tolerance.rel_l2:g}")
        if self.top1_total and self.top1 < tolerance.top1:
            out.append(f"top-1 agreement {self.top1:.1%} < {tolerance.top1:.0%}")
        if tolerance.elementwise and self.failing:
            out.append(f"{self.failing} element(s) beyond atol {tolerance.atol:g} + rtol "
                       f"{tolerance.rtol:g} * |float32|")
        return out

    def ok(self, tolerance):
        return not self.failures(tolerance)


def _looks_like_class_scores(name, values):
    """A [batch, classes] float output named like class scores, or whose rows are
    probabilities (non-negative, summing to 1)."""
    if values.ndim != 2 or values.shape[1] < 2 or values.shape[0] < 1:
        return False
    if any(word in name.lower() for word in _CLASS_SCORE_WORDS):
        return True
    finite = values[np.isfinite(values).all(axis=1)]
    return bool(finite.size) and bool((finite >= 0).all()) and bool(
        np.allclose(finite.sum(axis=1), 1.0, atol=1e-3))


def compare(reference, actual, tolerance, errors, label):
    """Folds one sample's outputs into `errors` ({(label, output): OutputError})."""
    rtol, atol = tolerance.rtol, tolerance.atol
    for name, expected in reference.items():
        got = actual[name]
        expected64 = np.asarray(expected, np.float64)
        got64 = np.asarray(got, np.float64)
        if expected64.shape != got64.shape:
            raise ModelError(f"output {name!r} of {label!r} has shape {got64.shape} after "
                             f"conversion, {expected64.shape} before.")
        error = errors.setdefault((label, name), OutputError(label, name))
        diff = np.abs(got64 - expected64)
        diff = np.where(np.isnan(expected64) & np.isnan(got64), 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        magnitude = np.abs(expected64)
        error.total += diff.size
        error.failing += int(np.count_nonzero(diff > atol + rtol * magnitude))
        with np.errstate(over="ignore", invalid="ignore"):
            error.sum_sq_diff += float(np.sum(np.square(diff)))
            error.sum_sq_ref += float(np.sum(np.square(np.where(np.isfinite(magnitude),
                                                                 magnitude, 0.0))))
        if _looks_like_class_scores(name, expected64):
            error.top1_total += expected64.shape[0]
            error.top1_same += int(np.count_nonzero(
                np.argmax(expected64, axis=1) == np.argmax(got64, axis=1)))
        if diff.size:
            error.max_abs = max(error.max_abs, float(diff.max()))
            meaningful = magnitude > atol
            if meaningful.any():
                error.max_rel = max(error.max_rel, float((diff[meaningful]
                                                          / magnitude[meaningful]).max()))


def validate(model, conversion, feeds, tolerance, progress=True):
    """[OutputError] of `conversion` against the float32 model on `feeds`."""
    errors = {}
    with model.runner(None) as reference, model.runner(conversion) as converted:
        bar = _progress.Progress(len(feeds), "validating") if progress else None
        for sample in feeds:
            for graph_label, feed in sample.items():
                compare(reference(graph_label, feed), converted(graph_label, feed),
                        tolerance, errors, graph_label)
            if bar is not None:
                bar.advance()
        if bar is not None:
            bar.close()
    return list(errors.values())


def error_table(errors, tolerance):
    lines = [f"{'output':40} {'max abs err':>12} {'max rel err':>12} {'rel L2 err':>11} "
             f"{'top-1 same':>10} {'outside tol':>12}",
             f"({tolerance.describe()}; 'outside tol': elements beyond atol {tolerance.atol:g} "
             f"+ rtol {tolerance.rtol:g} * |float32|"
             + (")" if tolerance.elementwise else ", shown only: pass --rtol/--atol to "
                "enforce it)")]
    for e in errors:
        name = e.output if e.label == "graph" else f"{e.label}/{e.output}"
        top1 = "-" if e.top1 is None else f"{e.top1:.1%}"
        verdict = "; ".join(e.failures(tolerance))
        lines.append(f"{name:40} {e.max_abs:12.4g} {e.max_rel:12.4g} {e.rel_l2:11.3g} "
                     f"{top1:>10} {e.failing:>6}/{e.total:<5}"
                     + (f"  FAIL: {verdict}" if verdict else ""))
    return "\n".join(lines)


def auto_deny(model, dtype, lists, keep, feeds, tolerance, max_trials=400):
    """Finds converted nodes to keep float32 so the model passes validation.

    Bisection over the converted nodes in graph order: keeping every converted node float32
    passes (that is the float32 model); the smallest prefix that still passes ends with a node
    that is needed, which joins the kept set, and the search repeats on the nodes before it
    until the kept set alone passes. Each needed node costs about log2(candidates) trials.

    Returns (conversion, [(function or None, node name)] kept float32 by the search).
    """
    base = model.convert(dtype, lists, keep)
    candidates = [(function, name) for _, function, name in base.converted_nodes]
    trials = {}

    bar = _progress.Progress(2 * max(len(candidates).bit_length(), 1), "auto-deny (trials)")
    try:
        def passes(extra):
            key = frozenset(extra)
            if key not in trials:
                if len(trials) >= max_trials:
                    raise ModelError(f"--auto-deny gave up after {max_trials} trials; keep "
                                     "op types float32 with --deny, or check the sample inputs.")
                conversion = model.convert(dtype, lists, set(keep) | set(_names(extra)))
                errors = validate(model, conversion, feeds, tolerance, progress=False)
                trials[key] = all(e.ok(tolerance) for e in errors)
                bar.advance(total=max(bar.total, len(trials) + 1))
            return trials[key]

        if not passes(candidates):
            raise ModelError("--auto-deny: the model fails validation even with every converted "
                             "node in float32 (the float32 model does not reproduce itself "
                             "within the check: loosen --rtol/--atol if you gave them, or check "
                             "the sample inputs).")
        kept, remaining = [], list(candidates)
        while not passes(kept):
            low, high = 1, len(remaining)
            while low < high:
                middle = (low + high) // 2
                if passes(kept + remaining[:middle]):
                    high = middle
                else:
                    low = middle + 1
            kept.append(remaining[low - 1])
            remaining = remaining[:low - 1]
    finally:
        bar.close()
    return model.convert(dtype, lists, set(keep) | set(_names(kept))), kept


def _names(pairs):
    return [name if function is None else f"{function}/{name}" for function, name in pairs]


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

    def convert(self, dtype, lists, keep=(), keep_io_types=True):
        """keep_io_types=False: outputs may come out in half precision, and a float32
        Placeholder that only feeds tf_mpt's Casts to half becomes a half Placeholder."""
        graph_def = tf.compat.v1.GraphDef()
        graph_def.CopyFrom(self.graph_def)
        found = set()
        _mark_keep_fp32(graph_def, set(keep), found)
        _check_all_found(keep, found)
        result = _rewrite.rewrite_graph_def(graph_def, dtype=dtype, lists=lists, strict=True,
                                            fetches=None if keep_io_types else [])
        if not keep_io_types:
            _half_placeholders(result.graph_def, tf.as_dtype(dtype).as_datatype_enum)
        return Conversion(result.graph_def, {"graph": result.report})

    def graph_defs(self, conversion=None):
        """{label: GraphDef} to show or inspect."""
        return {"graph": self.graph_def if conversion is None else conversion.payload}

    def runner(self, conversion):
        return _GraphRunner(self.graph_def if conversion is None else conversion.payload,
                            self.outputs())

    def frozen(self):
        """{label: (GraphDef with every call inlined, {input name: placeholder name})}."""
        return {"graph": (self.graph_def, {s.name: s.name for s in self.input_specs()["graph"]})}

    def write(self, conversion, dst):
        def write(path):
            with open(path, "wb") as f:
                f.write(conversion.payload.SerializeToString())
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

    def convert(self, dtype, lists, keep=()):
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
            result = _rewrite.rewrite_with_library(
                graph_def, dtype=dtype, fetches=sorted(fetches), lists=lists, strict=True,
                function_roots=roots)
            meta_graph.graph_def.CopyFrom(result.graph_def)
            reports[self._label(index)] = result.report
        _check_all_found(names, found)
        return Conversion(proto, reports)

    def graph_defs(self, conversion=None):
        proto = self.proto if conversion is None else conversion.payload
        return {self._label(i): m.graph_def for i, m in enumerate(proto.meta_graphs)}

    def _checkpoint_prefix(self):
        return os.path.join(self.path, "variables", "variables")

    def store_variables_in_half(self, conversion, dtype):
        """The conversion with the float32 variables only half ops read stored in `dtype`."""
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
            f.write(proto.SerializeToString())
        from tensorflow.python.saved_model import fingerprinting_utils  # pylint: disable=g-import-not-at-top
        fingerprinting_utils.write_fingerprint(directory)

    def write(self, conversion, dst):
        _model_io.write_atomically(
            dst, lambda path: self._write_directory(conversion, path, link=False))

    def runner(self, conversion):
        return _SavedModelRunner(self, conversion)

    def frozen(self):
        """{signature: (GraphDef with variables as constants and calls inlined,
        {input name: placeholder name})} for shapes, FLOPs and per-tensor numerics."""
        from tensorflow.python.framework import convert_to_constants  # pylint: disable=g-import-not-at-top
        _, signatures = _model_io.load_signatures(self.path)
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
        self._model = model
        self._conversion = conversion
        self._temporary = None
        self._signatures = None

    def __enter__(self):
        path = self._model.path
        if self._conversion is not None:
            self._temporary = tempfile.mkdtemp(prefix="tf_mpt-trial-")
            path = os.path.join(self._temporary, "model")
            self._model._write_directory(self._conversion, path, link=True)  # pylint: disable=protected-access
        _, self._signatures = _model_io.load_signatures(path)
        return self

    def __exit__(self, *exc_info):
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)

    def __call__(self, label, feed):
        outputs = self._signatures[label](**{k: tf.constant(v) for k, v in feed.items()})
        return {k: v.numpy() for k, v in outputs.items()}
