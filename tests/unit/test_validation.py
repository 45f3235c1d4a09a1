"""`tf-mpt convert --validate`'s check: per-output relative L2 error and top-1 agreement by
default, the elementwise atol + rtol * |y| bound only when asked for."""

import dataclasses

import numpy as np
import pytest

from tf_mpt.models import validation as _convert

REL_ERROR_MOBILENET_FLOAT16 = 5.5e-3  # what a Keras MobileNetV2 converted to float16 gives


def _logits(rows=16, classes=1000, seed=0):
    """Class scores as a classifier gives them: many near zero, a few large."""
    return np.random.RandomState(seed).standard_normal((rows, classes)) * 3.0


def _with_relative_l2_error(reference, relative, seed=1):
    noise = np.random.RandomState(seed).standard_normal(reference.shape)
    noise *= relative * np.linalg.norm(reference) / np.linalg.norm(noise)
    return reference + noise


def _errors(reference, actual, tolerance, name="logits"):
    errors = {}
    _convert.compare({name: reference}, {name: actual}, tolerance, errors, "serving_default")
    (error,) = errors.values()
    return error


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_real_model_error_passes_the_default_and_fails_the_elementwise_bound(dtype):
    reference = _logits()
    actual = _with_relative_l2_error(reference, REL_ERROR_MOBILENET_FLOAT16)
    default = _convert.Tolerance.for_dtype(dtype)
    error = _errors(reference, actual, default)
    assert error.rel_l2 == pytest.approx(REL_ERROR_MOBILENET_FLOAT16, rel=1e-6)
    assert error.top1 > 0.9
    assert error.failing > 0  # near-zero logits fail atol + rtol * |y| ...
    assert error.ok(default)  # ... which the default does not enforce
    strict = _convert.Tolerance.for_dtype(dtype, rtol=1e-2)
    assert strict.elementwise and not error.ok(strict)
    assert "element(s) beyond atol" in error.failures(strict)[0]


def test_a_wrong_conversion_fails_the_default():
    reference = _logits()
    error = _errors(reference, _with_relative_l2_error(reference, 0.2),
                    _convert.Tolerance.for_dtype("float16"))
    assert not error.ok(_convert.Tolerance.for_dtype("float16"))
    assert error.failures(_convert.Tolerance.for_dtype("float16"))[0].startswith(
        "relative L2 error 0.2 > 0.01")


def test_top1_flips_fail_class_scores_only():
    reference = np.tile(np.arange(10.0), (20, 1))  # class 9 wins every row
    flipped = reference.copy()
    flipped[:3, 8] = 9.5  # 3 of 20 rows now pick class 8: 85% agreement
    tolerance = dataclasses.replace(_convert.Tolerance.for_dtype("bfloat16"), rel_l2=1.0)
    scores = _errors(reference, flipped, tolerance, name="logits")
    assert scores.top1 == pytest.approx(0.85)
    assert scores.failures(tolerance) == ["top-1 agreement 85.0% < 90%"]
    regression = _errors(reference, flipped, tolerance, name="boxes")
    assert regression.top1 is None and regression.ok(tolerance)


def test_rows_of_probabilities_count_as_class_scores():
    probs = np.full((4, 5), 0.2)
    probs[:, 0] = 0.6
    probs[:, 1:] = 0.1
    error = _errors(probs, probs, _convert.Tolerance.for_dtype("float16"), name="output_0")
    assert error.top1_total == 4 and error.top1 == 1.0


def test_overflow_to_inf_fails():
    reference = np.full((2, 4), 1e5)
    error = _errors(reference, np.full((2, 4), np.inf), _convert.Tolerance.for_dtype("float16"),
                    name="y")
    assert not error.ok(_convert.Tolerance.for_dtype("float16"))


def test_table_shows_both_checks():
    reference = _logits(rows=4, classes=10)
    tolerance = _convert.Tolerance.for_dtype("float16")
    errors = {}
    _convert.compare({"logits": reference}, {"logits": reference}, tolerance, errors, "graph")
    table = _convert.error_table(list(errors.values()), tolerance)
    assert "rel L2 err" in table and "top-1 same" in table and "outside tol" in table
    assert "shown only: pass --rtol/--atol to enforce it" in table
    assert "100.0%" in table.splitlines()[-1]
