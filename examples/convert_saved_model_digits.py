"""Serving in half precision: train a Keras model on the 8x8 digits in float32, export
it as a SavedModel, convert it with `tf-mpt convert`, and compare the two.

    python examples/convert_saved_model_digits.py [--dtype bfloat16] [--epochs 6]

The conversion validates 16 random samples against the float32 model and stores the
variables that only half ops read in half (`--variables half`). Prints the command's output,
the test accuracy of both models on the same images, the largest difference of their
logits, and the size of both checkpoints.
"""

import argparse
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

from digits_data import load_digits

from tf_mpt import cli


def _directory_bytes(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def _logits(path, images):
    signature = tf.saved_model.load(path).signatures["serving_default"]
    (name, _), = signature.structured_input_signature[1].items()
    (output,) = signature(**{name: tf.constant(images)}).values()
    return output.numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="bfloat16")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    images = (digits.images[order] / 16.0).astype(np.float32)[..., None]
    labels = digits.target[order].astype(np.int32)
    train, test = slice(0, 1408), slice(1408, None)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images[train], labels[train], batch_size=64, epochs=args.epochs, verbose=0)

    # The serving signature takes any batch; this server sends 1024 images at a time, which is
    # what the cost model should weigh (its default guess is 32, at which this small model
    # runs faster in float32 on a CPU and would be kept so).
    os.environ.setdefault("TF_MPT_COST_BATCH", "1024")
    with tempfile.TemporaryDirectory() as work:
        source, converted = os.path.join(work, "fp32"), os.path.join(work, args.dtype)
        model.export(source, verbose=False)
        cli.main(["convert", source, converted, "--dtype", args.dtype, "--validate", "16",
                  "--variables", "half"])
        before, after = _logits(source, images[test]), _logits(converted, images[test])
        for name, logits in (("float32", before), (args.dtype, after)):
            accuracy = np.mean(np.argmax(logits, axis=1) == labels[test])
            print(f"{name} SavedModel: test accuracy {accuracy:.2%}")
        print(f"largest logit difference: {np.max(np.abs(after - before)):.4f}")
        sizes = [_directory_bytes(os.path.join(path, "variables"))
                 for path in (source, converted)]
        print(f"checkpoint: float32 {sizes[0] / 1024:.0f} KiB, converted {sizes[1] / 1024:.0f} "
              f"KiB ({sizes[1] / sizes[0]:.0%})")


if __name__ == "__main__":
    main()
