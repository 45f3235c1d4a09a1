"""TF_MPT_STEP_TIMING under the automatic path: Keras 3's training step has its candidate
colourings (float32, the cost model's, the rules', contractions only) timed on copies of the
model's and optimizer's variables, then runs the fastest; the script's model trains exactly
the steps it asked for, to float32's loss.

This machine's clock decides which candidate is faster, so the test asserts what holds
whichever way: the candidates were timed, the pick the INFO line names is the version that ran
(its bfloat16 matrix products counted in the training step's executed graphs), and the
script's own variables were never touched by the timing."""

import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.automatic import switch as _autoenable
from tf_mpt.choose import policy as _policy
from tf_mpt.rewrite import function_bodies as _function_library
from tf_mpt.rewrite import tf_functions as _tf_functions
from support.helpers import executed_function_graphs
from support.tolerances import FINAL_LOSS_RTOL

keras = pytest.importorskip("keras")

STEPS, EPOCHS, BATCH, WIDTH = 4, 3, 64, 512


def _fit(jit_compile=False):
    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * BATCH, WIDTH).astype(np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int32)
    model = keras.Sequential([keras.Input((WIDTH,)),
                              keras.layers.Dense(WIDTH, activation="relu"),
                              keras.layers.Dense(WIDTH, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    predicted = model.predict(x[:8], verbose=0)
    return history.history["loss"], int(model.optimizer.iterations.numpy()), predicted


def _half_matrix_products_of_the_training_step(executed):
    """bfloat16 matrix products in the executed graphs that update a variable by adding to
    it (the training step: its optimizer's iteration count; predict's graphs update none)."""
    graphs = [g for g in executed if any(n.op == "AssignAddVariableOp" for n in g.node)]
    assert graphs, "no training step graph was executed"
    return sum(1 for g in graphs for n in g.node
               if "MatMul" in n.op and n.attr["T"].type == tf.bfloat16.as_datatype_enum)


# jit_compile: Keras 3's default on a machine with a GPU (issue "XLA"): the step's candidates
# are timed compiled, as XLA runs them
@pytest.mark.measures_this_cpu
@pytest.mark.parametrize("jit_compile", [False, True], ids=["executor", "xla"])
def test_keras_fit_step_is_timed_and_the_model_trains_only_its_own_steps(monkeypatch, caplog,
                                                                         jit_compile):
    float32_losses, float32_iterations, _ = _fit(jit_compile)
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "always")
    monkeypatch.setenv("TF_MPT_TIMING_BUDGET", "20")
    config = tf_mpt.Config.from_env({"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "bfloat16",
                                     "TF_MPT_OP_COSTS": os.environ["TF_MPT_OP_COSTS"]})
    rebuilt = []  # the compiled steps tf_mpt rebuilt from a rewritten graph (XLA's input)
    rebuild = _tf_functions._function_from_graph_def  # pylint: disable=protected-access

    def recorded(cf, graph_def, library=None, jit_compile=None):
        if jit_compile:
            rebuilt.append(graph_def)
        return rebuild(cf, graph_def, library, jit_compile)
    monkeypatch.setattr(_tf_functions, "_function_from_graph_def", recorded)
    _autoenable.enable(config, gpu_visible=False, native_bfloat16=True)
    try:
        with caplog.at_level(logging.INFO, logger="tf_mpt"):
            (losses, iterations, predicted), executed = executed_function_graphs(
                lambda: _fit(jit_compile))
    finally:
        _autoenable.disable()
    timed = [r.getMessage() for r in caplog.records
             if "timed tf.function one_step_on_data on copies of its variables" in r.getMessage()]
    # timed once; a trace of the same step again (Keras may trace it twice) reads that verdict
    # from the cache (this test's own) and runs the same pick
    again = [m for m in timed if "graph timing (cached here, " in m]
    timed = [m for m in timed if m not in again]
    assert len(timed) == 1, [r.getMessage() for r in caplog.records]
    assert all(m.rpartition("; picked ")[2] == timed[0].rpartition("; picked ")[2]
               for m in again), (timed, again)
    compiled = ", compiled by XLA as the step runs" if jit_compile else ""
    found = re.search(rf"graph timing \(median of (\d+) rounds{compiled}\): (.*); picked "
                      r"([a-z0-9 ]+?)(, [\d.]+x float32)?( over the prediction \(([a-z ]+)\))?"
                      r"( \(faster but over float32's peak: ([a-z ,]+)\))?$", timed[0])
    assert found, timed[0]
    rounds, parts, pick, _, _, overturned, _, over = found.groups()
    over = set(over.split(", ")) if over else set()  # (the memory criterion left them out)
    parts, _, lean = parts.partition(", lean ")  # (timed beside the first rounds' pick)
    parts, _, refinement = parts.partition(", refined (")  # (timed beside the first pick)
    times = {n: float(ms) for n, ms in re.findall(
        r"(float32|rules|cost model|contractions only) ([\d.]+) ms", parts)}
    first = pick  # the first rounds' pick
    if pick == "lean":
        lean_ms, first, beside = re.search(
            r"\) ([\d.]+) ms(?: \(peak [^)]*\))? beside ([a-z0-9 ]+) ([\d.]+) ms", lean).groups()
        held_over = set(re.findall(r"(float32|rules|cost model|contractions only) [\d.]+ ms "
                                   r"\(peak [\d.]+ MiB: over float32's\)", parts))
        if lean.partition(" (")[0] not in held_over:  # the lean version of the pick or of a
            # colouring near it, holding less: kept unless over policy.margin slower (a tie in time
            # goes to memory)
            assert float(lean_ms) <= float(beside) * (1 + _policy.DEFAULT.margin) * 1.005, \
                timed[0]
        else:  # the fastest held more than float32: its lean version, faster than the pick
            assert float(lean_ms) < float(beside) * (1 - _policy.DEFAULT.margin) * 1.005, \
                timed[0]
    if pick == "refined":  # the refinement won: timed over policy.margin faster than the first pick
        refined, first, beside = re.search(
            r"float32\) ([\d.]+) ms(?: \(peak [^)]*\))? beside ([a-z0-9 ]+) ([\d.]+) ms",
            refinement).groups()
        assert float(refined) < float(beside) * (1 - _policy.DEFAULT.margin) * 1.005, timed[0]
    # every candidate whose graph differs ran, float32 and the prediction (the cost model's)
    # among them
    assert {"float32", "cost model"} <= set(times) and int(rounds) >= 3, timed[0]
    assert all(t > 0 for t in times.values()), timed[0]
    if jit_compile:  # (XLA's programs are not in the run metadata: the graphs it compiled
        # are the ones tf_mpt rebuilt the step from; their HLO keeps the half dots:
        # test_xla.py)
        half = sum(1 for g in rebuilt if any(n.op == "AssignAddVariableOp" for n in g.node)
                   for n in _function_library.all_nodes(g)
                   if "MatMul" in n.op and n.attr["T"].type == tf.bfloat16.as_datatype_enum)
    else:
        half = _half_matrix_products_of_the_training_step(executed)
    # the pick named is the version that ran: float32's graph, or one with half products
    assert (pick == "float32") == (half == 0), (timed[0], half)
    # the first pick is the fastest of those within float32's peak, or one within the
    # margin of it (the prediction, or one holding less; times printed to 3 significant
    # digits)
    fastest = min(t for n, t in times.items() if n not in over)
    assert first in times and first not in over, timed[0]
    assert times[first] <= fastest * (1 + _policy.DEFAULT.margin) * 1.005, timed[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert iterations == float32_iterations == STEPS * EPOCHS  # no step ran twice
    assert predicted.dtype == np.float32
    np.testing.assert_allclose(losses[-1], float32_losses[-1],
                               rtol=FINAL_LOSS_RTOL["bfloat16"])
    assert losses[-1] < losses[0]
