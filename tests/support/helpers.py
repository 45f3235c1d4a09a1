"""Helpers for tests: build graphs, read dtypes and Casts out of rewritten GraphDefs."""

import numpy as np
import tensorflow as tf

import tf_mpt

tf1 = tf.compat.v1


def node_map(graph_def):
    return {node.name: node for node in graph_def.node}


def type_attr(graph_def, name, attr="T"):
    """The dtype name ('float32', 'float16', ...) of a node's type attr."""
    node = node_map(graph_def)[name]
    return tf.as_dtype(node.attr[attr].type).name


def added_casts(graph_def):
    """Names of the Casts added by tf_mpt, sorted."""
    return sorted(n.name for n in graph_def.node if n.op == "Cast" and n.name.endswith("-TfMpt"))


def inputs_of(graph_def, name):
    return list(node_map(graph_def)[name].input)


def half_tag(dtype):
    return {"float16": "Fp16", "bfloat16": "Bf16"}[dtype]


def rewrite(graph, dtype, **kwargs):
    return tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype=dtype, **kwargs)


def run(graph_def, fetches, feeds=None, init=None):
    """Imports a GraphDef into a new graph and runs `fetches` in a Session."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as sess:
        if init is not None:
            sess.run(init)
        return sess.run(fetches, feeds or {})


def random_feed(shape, seed=0, low=-1.0, high=1.0):
    return np.random.RandomState(seed).uniform(low, high, shape).astype(np.float32)


def cli_main(capsys, *args):
    """(exit code, stdout, stderr) of `tf-mpt args...` run in this process (cli.main)."""
    from tf_mpt import cli  # pylint: disable=g-import-not-at-top
    try:
        cli.main([str(a) for a in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def write_frozen(function, path):
    """Freezes a ConcreteFunction (its variables as constants) into the GraphDef file `path`
    (a pathlib.Path); returns the bytes written."""
    from tensorflow.python.framework import convert_to_constants  # pylint: disable=import-outside-toplevel
    frozen = convert_to_constants.convert_variables_to_constants_v2(function)
    data = frozen.graph.as_graph_def().SerializeToString()
    path.write_bytes(data)
    return data


def executed_function_graphs(call):
    """(what `call()` returned, [the partition graphs of every function it ran]) from the
    eager context's run metadata: the graphs as TensorFlow executed them, Casts and half
    kernels included."""
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
    context.enable_run_metadata()
    try:
        out = call()
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    return out, [g for f in metadata.function_graphs for g in f.partition_graphs]


def executed_ops(call):
    """[(node name, op type, picoseconds)] of every op TensorFlow's executor threads ran
    during `call()`, from its profiler: unlike run metadata, it sees the functions a call
    runs on its own (tf_keras's LSTM, which the implementation selector picks). Also used
    by benchmarks/keras_profile.py."""
    import glob  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            call()
        finally:
            tf.profiler.experimental.stop()
        (path,) = glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    ran = []
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and not name.startswith("ExecutorState"):  # (its Process)
                    node, op_type = name.rsplit(":", 1)
                    ran.append((node, op_type, event.duration_ps))
    return ran


# The run's own cache directory for child scripts (made by conftest.pytest_configure, removed at
# the run's end); not TF_MPT_*: no variable of tf_mpt's own
RUN_CACHE = "TFMPT_TESTS_RUN_CACHE"


def child_env(keep=()):
    """os.environ for a child script: no TF_MPT_* variable (but those named in `keep`), and
    the dispatch check off (TF_MPT_DISPATCH_CHECK=0): a child's half ops never depend on
    how this machine's kernels run (the check itself: tests/unit/test_dispatch_check.py).
    Without a TF_MPT_CACHE_DIR kept, the cache is the run's own (RUN_CACHE), never
    the user's: no verdict an earlier run timed decides what a child does."""
    import os  # pylint: disable=import-outside-toplevel
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_MPT_") or k in keep}
    env["TF_MPT_DISPATCH_CHECK"] = "0"
    if "TF_MPT_CACHE_DIR" not in env and os.environ.get(RUN_CACHE):
        env["TF_MPT_CACHE_DIR"] = os.environ[RUN_CACHE]
    return env


def alternating(firsts, seconds, names=None):
    """pytest params (first, second) for every pair, ids 'first-second' (`names`: the firsts'
    names, where not str(first); a first that is a tuple gives its values one by one): the
    i-th first runs with seconds[i % len(seconds)] in the default run and with the others only
    under `-m heavy` (.ci/run runs those after it). With at least as many firsts as seconds,
    each first and each second is still in the default run, in fewer pairs: the default run
    stays within its minutes on the slowest CPU, and the heavy run covers every pair."""
    import pytest  # pylint: disable=import-outside-toplevel
    names = names or [str(first) for first in firsts]
    params = []
    for i, (first, name) in enumerate(zip(firsts, names)):
        values = first if isinstance(first, tuple) else (first,)
        for j, second in enumerate(seconds):
            marks = () if j == i % len(seconds) else (pytest.mark.heavy,)
            params.append(pytest.param(*values, second, id=f"{name}-{second}", marks=marks))
    return params


def heavy_except(params, ids):
    """`params` (pytest.param values, e.g. alternating's) with every one whose id is not in
    `ids` moved under `-m heavy`: a family of subprocess runs keeps the named ones in the
    default run (each kind once) and runs the rest with the heavy tests."""
    import pytest  # pylint: disable=import-outside-toplevel
    unknown = set(ids) - {param.id for param in params}
    if unknown:
        raise ValueError(f"no such parameters: {sorted(unknown)}")
    return [param if param.id in ids else
            pytest.param(*param.values, id=param.id, marks=pytest.mark.heavy)
            for param in params]
