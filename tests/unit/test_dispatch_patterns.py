"""The dispatch check's patterns run what they stand for (tf_mpt/costs/dispatch.py): each
timed run executes its pattern's op in the half type (the check's verdicts:
tests/unit/test_dispatch_check.py). No clock is read: what ran is counted in the partition
graphs TensorFlow ran."""

import pytest
import tensorflow as tf

from tf_mpt.costs import dispatch


@pytest.mark.parametrize("pattern", ["MatMul+BiasAdd", "Conv2DBackpropFilter"])
def test_a_patterns_run_executes_its_op_in_half(pattern):
    """A pattern's timed run executes the pattern: its op, as TensorFlow runs it here (fused
    as the remapper fuses it, oneDNN's or Eigen's), in the half type, among the partition
    graphs TensorFlow ran. A run that fetched something the pattern does not feed would time
    nothing, and find every half kernel as fast as float32."""
    tf1 = tf.compat.v1
    patterns, f32 = dispatch._patterns(tf, "bfloat16")  # pylint: disable=protected-access
    graph, init, target = dispatch.pattern_graph(tf, patterns[pattern], f32, tf.bfloat16)[:3]
    metadata = tf1.RunMetadata()
    with tf1.Session(graph=graph) as session:
        session.run(init)
        session.run(target, options=tf1.RunOptions(output_partition_graphs=True),
                    run_metadata=metadata)
    half = [node.op for g in metadata.partition_graphs for node in g.node
            if "T" in node.attr and node.attr["T"].type == tf.bfloat16.as_datatype_enum]
    assert any(dispatch.op_of(pattern) in op for op in half), half
