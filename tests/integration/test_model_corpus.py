"""A corpus of real model graphs (model_corpus.py), frozen for inference, in both half types:

* the rewrite runs (strict), the input GraphDef is unchanged, a second rewrite changes nothing;
* every MatMul / convolution Grappler's pass converts, tf_mpt converts, with no more Casts;
* the outputs keep their dtypes and are within a tolerance of float32 (below).

Tolerance: a random-weight deep net amplifies any perturbation (MobileNetV2 here turns the
float16 rounding of its *input alone* into a 1.2e-2 relative error at its output), so a fixed
bound would measure the net, not the rewrite. The bound per model is the larger of the
validation default (`tf-mpt convert --validate`: relative L2 1e-2 float16, 8e-2 bfloat16) and
SENSITIVITY_FACTOR times the model's sensitivity (the output's relative L2 change when only
its input is rounded to the half type, computed in float32; a half graph rounds at every
layer, EfficientNetB0 turns that into 10 times its input-only error), capped at CAP. It is a
sanity bound on these nets (a deny op run in half gives inf, NaN or errors of order 1); the
sharp check is against Grappler where its float16 pass runs: tf_mpt's error is at most
GRAPPLER_FACTOR times Grappler's (plus a roundoff's worth). A model whose sensitivity exceeds
CAP (InceptionV3 at 75x75: rounding its input alone changes its output by more than its norm)
has its float32 comparison skipped with that reason.

The default run covers model_corpus.DEFAULT (about a minute); `python -m pytest -m slow
tests/integration/test_model_corpus.py` runs the whole corpus.
"""

import functools

import ml_dtypes
import numpy as np
import pytest

from support import grappler_oracle
from support import model_corpus
import tf_mpt
from support.helpers import added_casts, run

REL_L2 = {"float16": 1e-2, "bfloat16": 8e-2}
SENSITIVITY_FACTOR = 20.0
GRAPPLER_FACTOR = 2.0
# Largest bound; also the sensitivity above which a model's numbers say nothing (its output
# is noise at that scale).
CAP = 0.5
ROUNDOFF = {"float16": 4.9e-4, "bfloat16": 3.9e-3}
# Grappler allow-list ops whose conversion the corpus checks one by one.
MATRIX_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
                        "Conv2D", "DepthwiseConv2dNative", "Conv3D"})
_NUMPY_HALF = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# The op lists decide (Grappler's pass, the anchor, colours by its lists alone); the cost
# model's decisions on these graphs are tests/integration/test_graph_shapes.py's.
TARGET = "rules"


def _marked(name):
    marks = () if name in model_corpus.DEFAULT else (pytest.mark.slow,)
    return pytest.param(name, marks=marks, id=name)


MODELS = [_marked(name) for name in model_corpus.BUILDERS]


@functools.lru_cache(maxsize=None)
def _model(name):
    return model_corpus.build(name)


@functools.lru_cache(maxsize=None)
def _float32_outputs(name):
    model = _model(name)
    return run(model.graph_def, model.outputs, model.inputs)


@functools.lru_cache(maxsize=None)
def _rewritten(name, dtype):
    model = _model(name)
    return tf_mpt.rewrite_graph_def(model.graph_def, dtype=dtype, fetches=model.fetch_nodes,
                                    strict=True, target=TARGET)


def _rel_l2(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


@functools.lru_cache(maxsize=None)
def _sensitivity(name, dtype):
    model = _model(name)
    rounded = {k: v.astype(_NUMPY_HALF[dtype]).astype(np.float32)
               for k, v in model.inputs.items()}
    outputs = run(model.graph_def, model.outputs, rounded)
    return max(_rel_l2(o, e) for o, e in zip(outputs, _float32_outputs(name)))


@functools.lru_cache(maxsize=None)
def _errors(name, dtype, graph_def_bytes=None):
    model = _model(name)
    graph_def = _rewritten(name, dtype).graph_def
    if graph_def_bytes is not None:
        graph_def = type(graph_def).FromString(graph_def_bytes)
    outputs = run(graph_def, model.outputs, model.inputs)
    for got, want in zip(outputs, _float32_outputs(name)):
        assert got.dtype == want.dtype and got.shape == want.shape
    return max(_rel_l2(o, e) for o, e in zip(outputs, _float32_outputs(name)))


def _tolerance(name, dtype):
    return min(max(REL_L2[dtype], SENSITIVITY_FACTOR * _sensitivity(name, dtype)), CAP)


@pytest.mark.parametrize("name", MODELS)
def test_rewrite_is_pure_and_idempotent(name, half_dtype):
    model = _model(name)
    before = model.graph_def.SerializeToString(deterministic=True)
    result = _rewritten(name, half_dtype)
    assert model.graph_def.SerializeToString(deterministic=True) == before
    assert result.modified and result.report.converted_nodes > 0
    again = tf_mpt.rewrite_graph_def(result.graph_def, dtype=half_dtype,
                                     fetches=model.fetch_nodes, strict=True, target=TARGET)
    assert not again.modified
    assert added_casts(again.graph_def) == added_casts(result.graph_def)


@pytest.mark.parametrize("name", MODELS)
def test_outputs_close_to_float32(name, half_dtype):
    sensitivity = _sensitivity(name, half_dtype)
    if sensitivity > CAP:
        pytest.skip(f"{name} with random weights is chaotic in {half_dtype}: rounding only its "
                    f"input changes its output by {sensitivity:.2f} of its norm")
    error, tolerance = _errors(name, half_dtype), _tolerance(name, half_dtype)
    assert error <= tolerance, (error, tolerance, sensitivity)


@functools.lru_cache(maxsize=None)
def _grappler(dtype, names):
    items = [(_model(n).graph_def, _model(n).fetch_nodes) for n in names]
    results = grappler_oracle.run_grappler_amp_batch(items, dtype, timeout=600.0)
    return dict(zip(names, results))


def _grappler_result(name, dtype):
    names = model_corpus.DEFAULT if name in model_corpus.DEFAULT else (name,)
    return _grappler(dtype, tuple(names))[name]


# float16 under -m heavy (Grappler's float16 pass, in the grappler_compare tests' default run)
@pytest.mark.parametrize("half_dtype", [
    "bfloat16", pytest.param("float16", marks=pytest.mark.heavy)])
@pytest.mark.parametrize("name", MODELS)
def test_converts_what_grappler_converts_with_no_more_casts(name, half_dtype):
    graph_def, info = _grappler_result(name, half_dtype)
    if info["skip_reason"] is not None:
        pytest.skip(f"{name}/{half_dtype}: no Grappler result to compare with: "
                    f"{info['skip_reason']}")
    model = _model(name)
    ours = _rewritten(name, half_dtype).graph_def
    ops = dict(grappler_oracle.all_nodes(model.graph_def))
    theirs = grappler_oracle.converted_nodes(model.graph_def, graph_def, half_dtype)
    converted = grappler_oracle.converted_nodes(model.graph_def, ours, half_dtype)
    missed = sorted(n for n in theirs - converted if ops[n].op in MATRIX_OPS)
    assert not missed, missed
    assert any(ops[n].op in MATRIX_OPS for n in converted)
    assert len(added_casts_everywhere(ours)) <= info["casts_added"]
    grappler_error = _errors(name, half_dtype, graph_def.SerializeToString())
    error = _errors(name, half_dtype)
    assert error <= GRAPPLER_FACTOR * grappler_error + ROUNDOFF[half_dtype], (
        error, grappler_error)


def added_casts_everywhere(graph_def):
    """tf_mpt's Casts in the graph and in its library functions."""
    return grappler_oracle.added_casts(type(graph_def)(), graph_def,
                                       grappler_oracle.TF_MPT_CAST_SUFFIX)
