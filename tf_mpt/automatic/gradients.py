"""Where a script takes gradients: tf.gradients / tf.compat.v1.gradients and
GradientTape.gradient start the backward pass from the loss scale and return float32-unscaled
gradients (see tf_mpt.training.gradient_records for which scale, and the patterns left
unscaled), each computation recorded with the script's file:line. Keras's own training step
counts as the script's when tf_mpt rewrites Keras's step functions (TF_MPT_KERAS=rewrite).

Eager code (a GradientTape outside tf.function) runs in float32 under tf_mpt: its gradients
get no loss scale, and one INFO line says so, unless a half op ran (a half loss, or a mixed
Keras dtype policy the script set itself).
"""

import logging
import sys

import tensorflow as tf

from tf_mpt._opt_out import keep_fp32
from tf_mpt._process.state import STATE, bypassing, warn_once
from tf_mpt.automatic import keras as _keras
from tf_mpt.training import gradient_records as _records
from tf_mpt.training import scaling as _scaling

# Frames of these modules are not "the script": a call from them is TensorFlow's or Keras's.
_LIBRARIES = ("keras", "tf_keras", "tensorflow", "absl")
_SKIPPED_FRAMES = ("tf_mpt", "tensorflow.python.autograph")


# --- where the call comes from ----------------------------------------------------------------

def _caller():
    """(module name, 'file:line') of the first frame outside tf_mpt and autograph; a line of
    code autograph generated (in a tf.function) is named by the script's own file:line."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
        module = frame.f_globals.get("__name__", "") or ""
        if not any(module == m or module.startswith(m + ".") for m in _SKIPPED_FRAMES):
            return module, _script_line(frame.f_code, frame.f_lineno)
        frame = frame.f_back
    return "", "<unknown>"


_AUTOGRAPH_FILE = "__autograph_generated_file"


def _script_line(code, line):
    filename = code.co_filename
    if _AUTOGRAPH_FILE not in filename:
        return f"{filename}:{line}"
    lines = STATE.source_maps.get(filename)
    if lines is None:
        lines = STATE.source_maps[filename] = _autograph_lines(code)
    return lines.get(line, f"{filename}:{line}")


def _autograph_lines(code):
    """{generated line: 'file:line'} from the source map autograph keeps on the converted
    function (its `ag_source_map`); found once per generated file, when a gradient is
    taken in it, i.e. while a tf.function is traced."""
    import gc  # pylint: disable=g-import-not-at-top
    for holder in gc.get_referrers(code):
        source_map = getattr(holder, "ag_source_map", None)
        if isinstance(source_map, dict):
            return {key.lineno: f"{info.loc.filename}:{info.loc.lineno}"
                    for key, info in source_map.items()
                    if getattr(key, "filename", None) == code.co_filename}
    return {}


def _from_library(module):
    if module.split(".")[0] not in _LIBRARIES:
        return False
    return not (module in _keras.KERAS_GRADIENT_MODULES and _keras.rewrites_keras())


# --- eager code ---------------------------------------------------------------------------------

def _half_ran_eagerly(targets):
    """Whether an eager gradient's forward pass ran half ops: a half target, or Keras layers
    computing in half under a mixed dtype policy."""
    return (any(t.dtype in (tf.float16, tf.bfloat16) for t in targets)
            or _keras.mixed_policy_in_effect())


def _eager_float32(what):
    warn_once("eager float32", "%s runs eagerly (outside tf.function): eager TensorFlow ops "
              "run in float32 under tf_mpt, so its gradients get no loss scale. tf_mpt runs "
              "tf.function graphs, Keras fit / evaluate / predict and TF1 Sessions in mixed "
              "precision: wrap the training step in tf.function for it.", what,
              level=logging.INFO)


# --- what may be scaled -----------------------------------------------------------------------

def _is_variable(value):
    if isinstance(value, tf.Variable):
        return True
    keras = sys.modules.get("keras")
    variable_class = getattr(keras, "Variable", None) if keras is not None else None
    return variable_class is not None and isinstance(value, variable_class)


def _float_tensors(values):
    return bool(values) and all(
        isinstance(v, tf.Tensor) and v.dtype.is_floating for v in values)


# --- the scaled backward pass -----------------------------------------------------------------

def _pending_scale():
    """An Identity of 1.0 that `claim` rewires to an optimizer's scale (graph mode)."""
    with tf.control_dependencies(None), keep_fp32("tf_mpt_loss_scale"):
        return tf.identity(tf.constant(1.0, tf.float32, name="unclaimed"), name="pending")


# A float16 loss's seed is the scale cast to float16: at 2**16 it is inf and every step would
# be skipped, so the seed stops at the largest power of two float16 holds (the scale itself
# may grow further for float32 losses of the same optimizer).
_FLOAT16_SEED_CAP = 2.0 ** 15


def _scaled(differentiate, targets, scale_tensor, record, graph):
    """differentiate(seeds) with seeds = S (per target, in its dtype; S capped at 2**15 when a
    target is float16); the gradients it returns (a structure, None allowed), each divided
    by the same S in float32."""
    with keep_fp32("tf_mpt_scale"):
        if any(t.dtype == tf.float16 for t in targets):
            scale_tensor = tf.minimum(scale_tensor, _FLOAT16_SEED_CAP)
        seeds = [tf.fill(tf.shape(t), tf.cast(scale_tensor, t.dtype)) for t in targets]
    grads = differentiate(seeds)
    with keep_fp32("tf_mpt_unscale"):
        inverse = tf.math.reciprocal(scale_tensor)
        unscaled = tf.nest.map_structure(lambda g: _scaling.unscale(g, inverse), grads)
    if graph is not None:
        names = _records.graph_records(graph)
        for g in tf.nest.flatten(unscaled):
            if g is None:
                continue
            values = g.values if isinstance(g, tf.IndexedSlices) else g
            names[values.op.name] = record
    return unscaled


# --- TF1: tf.gradients / tf.compat.v1.gradients -----------------------------------------------

def tf_gradients(original, ys, xs, grad_ys=None, *args, **kwargs):
    """`original(ys, xs, ...)`, from the scaled loss when the call is the script's, of float
    ys with respect to variables, in a graph."""
    if not _records.installed() or bypassing() or grad_ys is not None or tf.executing_eagerly():
        return original(ys, xs, grad_ys, *args, **kwargs)
    module, site = _caller()
    targets, sources = tf.nest.flatten(ys), tf.nest.flatten(xs)
    if (_from_library(module) or not _float_tensors(targets) or not sources
            or not all(_is_variable(x) for x in sources)):
        return original(ys, xs, grad_ys, *args, **kwargs)
    what = f"tf.gradients at {site}"
    graph = targets[0].graph
    if _records.ancestor_records(targets, graph):
        warn_once(("second order", site), "%s differentiates gradients tf_mpt scaled "
                  "(a gradient of a gradient); it runs without loss scaling.", what)
        return original(ys, xs, grad_ys, *args, **kwargs)
    if graph._get_control_flow_context() is not None:  # pylint: disable=protected-access
        warn_once(("control flow", site), "%s is inside a tf.compat.v1 while_loop or cond; "
                  "its gradients run without loss scaling.", what)
        return original(ys, xs, grad_ys, *args, **kwargs)
    return _scaled_gradients(
        what, sources, targets, graph,
        lambda seeds: original(ys, xs, seeds, *args, **kwargs))


def _scaled_gradients(what, sources, targets, graph, differentiate):
    """Shared by tf.gradients and a tape: picks the scale (see the module docstring)."""
    scale = _records.scale_of(sources)
    if scale is _records.OPTED_OUT:
        return differentiate(None)
    if isinstance(scale, tuple):
        warn_once(("two optimizers", what), "%s takes the gradient of one loss with respect "
                  "to variables of different optimizers; it runs without loss scaling "
                  "(take one gradient per optimizer).", what)
        return differentiate(None)
    if scale is not None:
        record = _records.Record(what, scale=scale)
        with keep_fp32():
            scale_tensor = scale.scale()
    elif graph is not None:
        scale_tensor = _pending_scale()
        record = _records.Record(what, pending=scale_tensor.op)
    else:
        _check_previous_eager(sources, what)
        record = _records.Record(what)
        grads = differentiate(None)
        for v in sources:
            setattr(v, _records.AWAITING, record)
        return grads
    grads = _scaled(differentiate, targets, scale_tensor, record, graph)
    if graph is None:
        for v in sources:
            setattr(v, _records.AWAITING, record)
    return grads


def _check_previous_eager(sources, what):
    for v in sources:
        previous = getattr(v, _records.AWAITING, None)
        if previous is not None and not previous.claimed and not previous.reported:
            previous.reported = True
            warn_once(("no optimizer", previous.site), "the gradients taken by %s reached no "
                      "optimizer's apply_gradients; they run without loss scaling until an "
                      "optimizer applies gradients of these variables.", previous.site)
            return


# --- TF2: GradientTape.gradient -----------------------------------------------------------------

def tape_gradient(original, tape, target, sources, output_gradients=None, *args, **kwargs):
    """GradientTape.gradient, from the scaled loss when the call is the script's, of float
    targets with respect to variables."""
    if not _records.installed() or bypassing() or output_gradients is not None:
        return original(tape, target, sources, output_gradients, *args, **kwargs)
    module, site = _caller()
    targets, flat_sources = tf.nest.flatten(target), tf.nest.flatten(sources)
    if (_from_library(module) or not _float_tensors(targets) or not flat_sources
            or not all(_is_variable(s) for s in flat_sources)):
        return original(tape, target, sources, output_gradients, *args, **kwargs)
    what = f"GradientTape.gradient at {site}"

    def unscaled():
        return original(tape, target, sources, None, *args, **kwargs)

    if tf.executing_eagerly() and not _half_ran_eagerly(targets):
        _eager_float32(what)
        return unscaled()

    if tape._persistent:  # pylint: disable=protected-access
        taken = getattr(tape, "_tf_mpt_losses", 0)
        tape._tf_mpt_losses = taken + 1  # pylint: disable=protected-access
        if taken:
            warn_once(("persistent", site), "%s takes a second gradient from a persistent "
                      "GradientTape; gradients after the tape's first run without loss "
                      "scaling (use one tape per loss to scale each).", what)
            return unscaled()
    if tape._recording and not tape._persistent:  # pylint: disable=protected-access
        tape._pop_tape()  # pylint: disable=protected-access  (what gradient() does first)
    from tensorflow.python.eager import record as _record  # pylint: disable=g-import-not-at-top
    if _record.could_possibly_record():
        warn_once(("second order", site), "%s is taken while another GradientTape records "
                  "(second-order gradients); it runs without loss scaling.", what)
        return unscaled()
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    return _scaled_gradients(
        what, flat_sources, targets, graph,
        lambda seeds: original(tape, target, sources, seeds, *args, **kwargs))

