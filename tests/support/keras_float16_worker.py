"""Keras 3 `fit` of small real models, one optimizer each, run unmodified: float32, the
script's own `mixed_float16` policy (--policy), or tf_mpt's automatic path (switched on by the
environment: TF_MPT_ENABLE=1 TF_MPT_DTYPE=float16 ...). Used by
tests/integration/test_keras_float16.py.

    python tests/support/keras_float16_worker.py [--policy DTYPE] CASE [...]

CASEs: transformer_adam (Embedding, MultiHeadAttention, LayerNormalization, a GELU MLP;
Adam), convnet_sgd (Conv2D, BatchNormalization, pooling; SGD with momentum), lstm_rmsprop
(Embedding, LSTM, Dense; RMSprop). The data are learnable (labels from a fixed rule).

Prints one JSON line: {case: {"losses": [loss after each epoch], "casts": Casts in the graphs
TensorFlow ran for one training step ("loop_casts" of them in while loop bodies: they run
once per iteration), "half_matrix" / "matrix": the MatMul / Conv /
BatchMatMul nodes run in half / at all in that step, "scale": the loss scale after training
(Keras's LossScaleOptimizer under the policy, tf_mpt's under the automatic path; null if
none), "scale_kind": "keras" / "tf_mpt" / null, "dtypes": {what: dtype} of every tensor the
script receives (predict's output, the losses, the weights), "scale_moves": the scale seen
to back off and to grow (`_scale_moves`; null without a loss scale)}}.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

import keras  # noqa: E402

EPOCHS = 4
BATCH = 32
MATRIX_OPS = ("MatMul", "BatchMatMul", "Conv2D", "Einsum")  # substrings: _MklFusedMatMul, ...
HALF = (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum)


def _transformer(rng):
    length, vocab = 16, 64
    tokens = keras.Input((length,), dtype="int32")
    h = keras.layers.Embedding(vocab, 32)(tokens)
    attended = keras.layers.MultiHeadAttention(2, 16)(h, h)
    h = keras.layers.LayerNormalization()(h + attended)
    mlp = keras.layers.Dense(32)(keras.layers.Dense(64, activation="gelu")(h))
    h = keras.layers.LayerNormalization()(h + mlp)
    model = keras.Model(tokens, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(h)))
    x = rng.randint(0, vocab, size=(BATCH * 8, length)).astype(np.int32)
    y = (x[:, :4].sum(axis=1) % 4).astype(np.int32)  # depends on the first four tokens
    return model, keras.optimizers.Adam(3e-3), x, y


def _convnet(rng):
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(16, 3, padding="same", use_bias=False),
        keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
    y = rng.randint(0, 4, size=BATCH * 8).astype(np.int32)
    patterns = rng.randn(4, 16, 16, 3).astype(np.float32)  # one faint pattern per class
    x = (rng.randn(BATCH * 8, 16, 16, 3) + 1.0 * patterns[y]).astype(np.float32)
    return model, keras.optimizers.SGD(0.05, momentum=0.9), x, y


def _lstm(rng):
    length, vocab = 12, 32
    tokens = keras.Input((length,), dtype="int32")
    h = keras.layers.LSTM(32)(keras.layers.Embedding(vocab, 16)(tokens))
    model = keras.Model(tokens, keras.layers.Dense(4)(h))
    x = rng.randint(0, vocab, size=(BATCH * 8, length)).astype(np.int32)
    y = (x[:, -1] % 4).astype(np.int32)  # the last token
    return model, keras.optimizers.RMSprop(3e-3), x, y


CASES = {"transformer_adam": _transformer, "convnet_sgd": _convnet, "lstm_rmsprop": _lstm}


def _loss_scale(optimizer):
    """(value, kind) of the loss scale the optimizer trains with, or (None, None)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return float(optimizer.dynamic_scale.numpy()), "keras"
    import tf_mpt  # pylint: disable=import-outside-toplevel
    scale = tf_mpt.loss_scale_of(optimizer)
    if scale is not None:
        return float(scale.scale().numpy()), "tf_mpt"
    return None, None


def _scale_state(optimizer):
    """(scale variable, finite-steps counter variable, steps to grow) of a dynamic scale."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.dynamic_scale, optimizer.step_counter, optimizer.dynamic_growth_steps
    import tf_mpt  # pylint: disable=import-outside-toplevel
    scale = tf_mpt.loss_scale_of(optimizer)
    return scale.current_loss_scale, scale.good_steps, scale.increment_period


def _scale_moves(model, x, y):
    """The dynamic loss scale seen to move, in two more training steps on one batch:

    1. back off: sample weights of 1e6 make the scaled gradients overflow float16 (the loss
       itself stays finite in float32): the scale halves and the step is skipped (no weight
       changes);
    2. grow: the finite-steps counter is set one short of the growth period, so the next
       finite step doubles the scale (the period is 2000 steps: too many to run here).
    """
    scale, counter, period = _scale_state(model.optimizer)
    start = float(scale.numpy())
    weights = [w.numpy().copy() for w in model.trainable_weights]
    model.train_on_batch(x[:BATCH], y[:BATCH], sample_weight=np.full(BATCH, 1e6, np.float32))
    backed_off = float(scale.numpy())
    skipped = all(np.array_equal(w.numpy(), before)
                  for w, before in zip(model.trainable_weights, weights))
    counter.assign(period - 1)
    model.train_on_batch(x[:BATCH], y[:BATCH])
    changed = any(not np.array_equal(w.numpy(), before)
                  for w, before in zip(model.trainable_weights, weights))
    return {"start": start, "after_overflow": backed_off, "overflow_step_skipped": skipped,
            "after_growth": float(scale.numpy()), "growth_step_applied": changed}


def _in_loop(name):
    """Whether a node of a partition graph came from a while loop's body (it runs once per
    iteration: Keras's LSTM loops over the time steps, forward and backward)."""
    return "while/body/" in name or "while_grad/body/" in name


def run(case):
    keras.utils.set_random_seed(0)
    model, optimizer, x, y = CASES[case](np.random.RandomState(0))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False)
    context.enable_run_metadata()
    context.export_run_metadata()  # clears what earlier cases left in it
    model.train_on_batch(x[:BATCH], y[:BATCH])
    graphs = context.export_run_metadata().function_graphs
    context.disable_run_metadata()
    nodes = [n for f in graphs for g in f.partition_graphs for n in g.node]
    casts = [n for n in nodes if n.op == "Cast"]
    matrix = [n for n in nodes if any(op in n.op for op in MATRIX_OPS) and "T" in n.attr]
    scale, kind = _loss_scale(model.optimizer)
    predicted = model.predict(x[:BATCH], verbose=0)
    evaluated = model.evaluate(x[:BATCH], y[:BATCH], verbose=0, return_dict=True)
    moves = _scale_moves(model, x, y) if kind is not None else None
    dtypes = {"predict": str(predicted.dtype),
              "evaluate": type(evaluated["loss"]).__name__,
              "weights": sorted({str(w.dtype) for w in model.weights})}
    return {"losses": [float(v) for v in history.history["loss"]],
            "casts": len(casts), "loop_casts": sum(1 for n in casts if _in_loop(n.name)),
            "half_matrix": sum(1 for n in matrix if n.attr["T"].type in HALF),
            "matrix": len(matrix), "scale": scale, "scale_kind": kind, "dtypes": dtypes,
            "scale_moves": moves}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", choices=("mixed_float16", "mixed_bfloat16"))
    parser.add_argument("cases", nargs="+", choices=sorted(CASES))
    args = parser.parse_args()
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)
    print(json.dumps({case: run(case) for case in args.cases}))


if __name__ == "__main__":
    sys.exit(main())
