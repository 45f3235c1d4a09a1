"""An unmodified TF2 custom loop (GradientTape + Keras SGD) under MirroredStrategy over two
logical CPUs, or as one of two MultiWorkerMirroredStrategy workers, on tf_mpt's automatic
path with float16 (run by test_distribution.py).

Usage: [TF_CONFIG=...] python tf2_mirrored_worker.py function|eager|mwms NAN_STEP ALLREDUCE
On step NAN_STEP the loss of replica (worker) 1 only is multiplied by NaN. Prints one JSON line per
step (each device's copy of the weights and of the loss scale, the optimizer's iterations),
then {"reduce_ops": [...]} of the training step's graph (function mode).
"""

import json
import sys

import numpy as np
import tensorflow as tf

import keras
import tf_mpt
from mirrored_worker import reduce_ops
from tf_mpt.automatic import optimizers as auto_scaling

STEPS = 4
# Inputs are scaled down so that the loss-scaled gradients (2^15 * 6 * X_SCALE) fit float16:
# the weights then move by X_SCALE times what mirrored_worker.py's do.
X_SCALE = 2.0 ** -6


def main():
    mode, nan_step, allreduce = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode != "mwms":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    # eager: under the mixed Keras policy (TF_MPT_KERAS=policy), the case where eager
    # gradients are scaled (by default eager code runs float32, unscaled)
    tf_mpt.enable(tf_mpt.Config.from_env({"TF_MPT_ENABLE": "1", "TF_MPT_DTYPE": "float16",
                                          "TF_MPT_ALLREDUCE_DTYPE": allreduce,
                                          "TF_MPT_KERAS": "policy" if mode == "eager"
                                          else "rewrite"}),
                  gpu_visible=False, native_bfloat16=False)
    if mode == "mwms":  # one replica per worker: replica_id_in_sync_group is the worker's
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = tf.Variable(tf.ones([3, 1]))
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)

    def replica_step(factor):
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                          tf.float32)
        x = tf.ones([2, 3]) * (replica + 1.0) * X_SCALE
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w)) * tf.where(tf.equal(replica, 1.0), factor, 1.0)
        grads = tape.gradient(loss, [w])
        optimizer.apply_gradients(zip(grads, [w]))

    def train(factor):
        strategy.run(replica_step, args=(factor,))

    if mode != "eager":
        train = tf.function(train)
    for step in range(STEPS):
        train(tf.constant(np.nan if step == nan_step else 1.0, tf.float32))
        scale = auto_scaling.loss_scale_of(optimizer)
        print(json.dumps({
            "step": step,
            "w": [t.numpy().ravel().tolist() for t in strategy.experimental_local_results(w)],
            "scale": [float(t.numpy()) for t in
                      strategy.experimental_local_results(scale.current_loss_scale)],
            "iterations": int(optimizer.iterations.numpy())}), flush=True)
    ops = []
    if mode != "eager":
        graph = train.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
        ops = reduce_ops(graph.as_graph_def())
    print(json.dumps({"reduce_ops": ops}), flush=True)


if __name__ == "__main__":
    main()
