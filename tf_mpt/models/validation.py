"""Validation of a converted model against its float32 self: sample inputs, the per-output
errors (relative L2, top-1 agreement of class scores, the elementwise bound when asked for),
and the table `tf-mpt convert --validate` prints."""

import dataclasses

import numpy as np
import tensorflow as tf

from tf_mpt.models import progress as _progress
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
