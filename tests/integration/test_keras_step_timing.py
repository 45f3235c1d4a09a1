"""TF_MPT_STEP_TIMING under the automatic path: Keras 3's training step is timed against
its float32 original on copies of the model's and optimizer's variables, then runs the
faster; the script's model trains exactly the steps it asked for, to float32's loss."""

import logging

import numpy as np
import pytest
import tensorflow as tf

import tf_mpt
from tf_mpt.automatic import switch as _autoenable
from support.tolerances import FINAL_LOSS_RTOL

keras = pytest.importorskip("keras")

STEPS, EPOCHS, BATCH, WIDTH = 4, 3, 64, 512


def _fit():
    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    x = rng.randn(STEPS * BATCH, WIDTH).astype(np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int32)
    model = keras.Sequential([keras.Input((WIDTH,)),
                              keras.layers.Dense(WIDTH, activation="relu"),
                              keras.layers.Dense(WIDTH, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    predicted = model.predict(x[:8], verbose=0)
    return history.history["loss"], int(model.optimizer.iterations.numpy()), predicted


def test_keras_fit_step_is_timed_and_the_model_trains_only_its_own_steps(monkeypatch, caplog):
    float32_losses, float32_iterations, _ = _fit()
    monkeypatch.setenv("TF_MPT_STEP_TIMING", "always")
    config = tf_mpt.Config.from_env({"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "bfloat16"})
    _autoenable.enable(config, gpu_visible=False, native_bfloat16=True)
    try:
        with caplog.at_level(logging.INFO, logger="tf_mpt"):
            losses, iterations, predicted = _fit()
    finally:
        _autoenable.disable()
    timed = [r.getMessage() for r in caplog.records
             if "timed tf.function one_step_on_data on copies of its variables" in r.getMessage()]
    assert len(timed) == 1, [r.getMessage() for r in caplog.records]
    assert "paired runs" in timed[0] and ("it runs in mixed precision" in timed[0]
                                          or "it runs in float32, as traced" in timed[0])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert iterations == float32_iterations == STEPS * EPOCHS  # no step ran twice
    assert predicted.dtype == np.float32
    np.testing.assert_allclose(losses[-1], float32_losses[-1],
                               rtol=FINAL_LOSS_RTOL["bfloat16"])
    assert losses[-1] < losses[0]
