"""MirroredStrategy over two logical CPUs with tf_mpt.LossScaleOptimizer (run by a test).

Logical devices must be configured before TensorFlow starts, hence a separate process.
Usage: python mirrored_worker.py graph|function NAN_STEP [ALLREDUCE_DTYPE]
On step NAN_STEP the loss of replica 1 only is multiplied by NaN. Prints one JSON line per
step with each device's copy of the weights and of the loss scale, and global_step, then one
line {"reduce_ops": [[op type, dtype], ...]}: the cross-replica reductions the graph runs.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tf_mpt
from tf_mpt.models import inspection

tf1 = tf.compat.v1
STEPS = 4


def _replica_loss(w, factor):
    replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
    x = tf.ones([2, 3]) * (replica + 1.0)
    return tf.reduce_sum(tf.matmul(x, w)) * tf.where(tf.equal(replica, 1.0), factor, 1.0)


ALLREDUCE_DTYPE = sys.argv[3] if len(sys.argv) > 3 else "float32"


def _make_optimizer():
    scale = tf_mpt.DynamicLossScale(initial_loss_scale=8, increment_period=1)
    return tf_mpt.LossScaleOptimizer(tf1.train.MomentumOptimizer(0.1, 0.9), scale,
                                     allreduce_dtype=ALLREDUCE_DTYPE), scale


def reduce_ops(graph_def):
    return [list(pair) for pair in inspection.reduction_ops(graph_def)]


def _record(step, strategy, w, scale_var, global_step, read):
    return {"step": step,
            "w": [read(t).ravel().tolist() for t in strategy.experimental_local_results(w)],
            "scale": [float(read(t)) for t in strategy.experimental_local_results(scale_var)],
            "global_step": int(read(global_step))}


def run_graph(nan_step):
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            w = tf1.get_variable("w", [3, 1], initializer=tf1.ones_initializer())
            global_step = tf1.train.get_or_create_global_step()
            factor = tf1.placeholder(tf.float32, [])
            opt, scale = _make_optimizer()
            train = strategy.group(strategy.extended.call_for_each_replica(
                lambda: opt.minimize(_replica_loss(w, factor), global_step=global_step)))
            scale_var = scale.variables_for_graph()[0]
            init = tf1.global_variables_initializer()
        with tf1.Session(graph=graph) as sess:
            sess.run(init)
            for step in range(STEPS):
                sess.run(train, {factor: np.nan if step == nan_step else 1.0})
                yield _record(step, strategy, w, scale_var, global_step, sess.run)
        yield {"reduce_ops": reduce_ops(graph.as_graph_def())}


def run_function(nan_step):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = tf.Variable(tf.ones([3, 1]))
        global_step = tf1.train.get_or_create_global_step()
        opt, scale = _make_optimizer()

    @tf.function
    def train(factor):
        strategy.run(lambda: opt.minimize(_replica_loss(w, factor), var_list=[w],
                                          global_step=global_step))

    for step in range(STEPS):
        train(tf.constant(np.nan if step == nan_step else 1.0, tf.float32))
        yield _record(step, strategy, w, scale.current_loss_scale, global_step,
                      lambda t: t.numpy())
    graph = train.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
    yield {"reduce_ops": reduce_ops(graph.as_graph_def())}


def main():
    mode, nan_step = sys.argv[1], int(sys.argv[2])
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    for record in (run_graph if mode == "graph" else run_function)(nan_step):
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
