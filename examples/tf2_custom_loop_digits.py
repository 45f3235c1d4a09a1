"""A plain TF2 script: a Keras model trained by a custom loop (tf.function + GradientTape).

Nothing here mentions tf_mpt. Run it in mixed precision with
`TF_MPT_ENABLE=1 python examples/tf2_custom_loop_digits.py`.
Prints the final test accuracy and the median step time.
"""

import argparse
import time

import keras
import numpy as np
import tensorflow as tf

from digits_data import load_digits


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
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
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    times, losses = [], []
    for _ in range(args.epochs):
        for start in range(0, len(y_train), args.batch):
            x = tf.constant(x_train[start:start + args.batch])
            y = tf.constant(y_train[start:start + args.batch])
            began = time.perf_counter()
            losses.append(float(train_step(x, y)))
            times.append(time.perf_counter() - began)
    predictions = np.argmax(model(x_test).numpy(), axis=1)
    print(f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f}")
    print(f"accuracy={np.mean(predictions == y_test):.4f} step_ms={np.median(times[10:]) * 1e3:.3f}")


if __name__ == "__main__":
    main()
