"""A plain Keras script: model.compile + model.fit on the 8x8 digits.

Nothing here mentions tf_mpt. Under `TF_MPT_ENABLE=1` Keras's own mixed precision policy is
set before the model is built. Prints the final test accuracy and the median step time.
"""

import argparse
import time

import keras
import numpy as np

from digits_data import load_digits


class StepTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._began)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    x_all = (digits.images[order] / 16.0).astype(np.float32)[..., None]
    y_all = digits.target[order].astype(np.int32)
    x_train, y_train, x_test, y_test = x_all[:1408], y_all[:1408], x_all[1408:], y_all[1408:]

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, dtype="float32"),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    timer = StepTimer()
    history = model.fit(x_train, y_train, batch_size=64, epochs=args.epochs, verbose=0,
                        callbacks=[timer])
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    losses = history.history["loss"]
    print(f"policy={model.dtype_policy.name}")
    print(f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}")
    print(f"accuracy={accuracy:.4f} step_ms={np.median(timer.times[10:]) * 1e3:.3f}")


if __name__ == "__main__":
    main()
