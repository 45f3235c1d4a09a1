"""One worker of a MultiWorkerMirroredStrategy run (started by test_distribution.py).

Usage: TF_CONFIG=... python mwms_worker.py NAN_STEP [ALLREDUCE_DTYPE]
Trains a linear model with tf_mpt.LossScaleOptimizer; on step NAN_STEP the loss of worker 1
only is multiplied by NaN. Prints one JSON line per step: weights, global_step, loss scale;
then {"reduce_ops": [[op type, dtype], ...]} of the training step's graph.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tf_mpt
from mirrored_worker import reduce_ops

tf1 = tf.compat.v1


def main():
    nan_step = int(sys.argv[1])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id
    with strategy.scope():
        w = tf.Variable(tf.ones([3, 1]))
        step_var = tf1.train.get_or_create_global_step()
        scale = tf_mpt.DynamicLossScale(initial_loss_scale=8, increment_period=1)
        opt = tf_mpt.LossScaleOptimizer(
            tf1.train.MomentumOptimizer(0.1, 0.9), scale,
            allreduce_dtype=sys.argv[2] if len(sys.argv) > 2 else "float32")

    @tf.function
    def train(factor):
        def replica_step():
            x = tf.ones([2, 3]) * float(task + 1)
            loss = tf.reduce_sum(tf.matmul(x, w)) * factor
            return opt.minimize(loss, var_list=[w], global_step=step_var)
        strategy.run(replica_step)

    for step in range(4):
        factor = np.nan if (step == nan_step and task == 1) else 1.0
        train(tf.constant(factor, tf.float32))
        print(json.dumps({"step": step, "w": w.numpy().ravel().tolist(),
                          "global_step": int(step_var.numpy()),
                          "scale": float(scale.current_loss_scale.numpy())}), flush=True)
    graph = train.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
    print(json.dumps({"reduce_ops": reduce_ops(graph.as_graph_def())}), flush=True)


if __name__ == "__main__":
    main()
