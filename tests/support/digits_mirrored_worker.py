"""The digits task trained by an unmodified TF2 custom loop (Keras MLP, GradientTape, Adam)
under MirroredStrategy over two logical CPUs (run by test_distribution.py).

Usage: python digits_mirrored_worker.py ALLREDUCE_DTYPE...
Trains once in float32 (tf_mpt off), then once per all-reduce dtype on tf_mpt's automatic
path with float16. Prints one JSON line per run: {"run": "off" (float32) or the all-reduce
dtype, "accuracy", "reduce_ops"}.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import keras
import tf_mpt
from digits import load
from mirrored_worker import reduce_ops

EPOCHS = 8
AVERAGE_LAST = 3  # the test accuracy is the mean over the last epochs (see digits.py)
GLOBAL_BATCH = 64


def train(strategy, data):
    x_train, y_train, x_test, y_test = data
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)),
                                  keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10, dtype="float32")])
        optimizer = keras.optimizers.Adam(3e-3)
        optimizer.build(model.trainable_variables)  # Keras needs its slots made here
    dataset = tf.data.Dataset.from_tensor_slices(
        (x_train.reshape(-1, 64), y_train)).batch(GLOBAL_BATCH, drop_remainder=True)
    batches = strategy.experimental_distribute_dataset(dataset)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True)) / GLOBAL_BATCH
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function
    def step(x, y):
        strategy.run(replica_step, args=(x, y))

    accuracies = []
    for epoch in range(EPOCHS):
        for x, y in batches:
            step(x, y)
        if epoch >= EPOCHS - AVERAGE_LAST:
            predicted = np.argmax(model(x_test.reshape(-1, 64)).numpy(), axis=1)
            accuracies.append(float(np.mean(predicted == y_test)))
    x, y = next(iter(batches))
    ops = reduce_ops(step.get_concrete_function(x, y).graph.as_graph_def())
    return float(np.mean(accuracies)), ops


def main():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    data = load()
    accuracy, ops = train(strategy, data)
    print(json.dumps({"run": "off", "accuracy": accuracy, "reduce_ops": ops}), flush=True)
    for allreduce in sys.argv[1:]:
        tf_mpt.enable(tf_mpt.Config.from_env({"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "float16",
                                              "TF_MPT_ALLREDUCE_DTYPE": allreduce}),
                      gpu_visible=False, native_bfloat16=False)
        accuracy, ops = train(strategy, data)
        tf_mpt.disable()
        print(json.dumps({"run": allreduce, "accuracy": accuracy, "reduce_ops": ops}),
              flush=True)


if __name__ == "__main__":
    main()
