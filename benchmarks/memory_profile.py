"""Where a training step's bytes go: float32 against tf_mpt, from one traced step's allocation
records (issue "memory", item 1: the table that drives the design).

    python benchmarks/memory_profile.py [--models mlp lstm conv transformer] [--quick]
                                        [--dtype bfloat16]

The models are benchmarks/train_speed.py's TF1 training graphs (its full settings, or
--quick's). Per (model, variant), in a Session of its own: the initializer, WARMUP steps,
then one step with RunOptions FULL_TRACE. Its step stats carry every allocation and release
of TensorFlow's CPU allocator during the step (AllocatorMemoryUsed.allocation_records:
microseconds, +bytes / -bytes) and the node that made it. From them:

    step peak      the highest sum of bytes allocated and not yet released during the step
                   (what the step adds on top of what lives across steps: variables, slots)
    live at peak   the nodes holding those bytes at that moment, by the dtype of what they
                   produced (float32, the half type, other) and by op type (Casts apart)
    in use         the allocator's bytes in use at its highest during the step (the
                   variables and slots included; allocator_bytes_in_use)

tf_mpt is `tf_mpt.rewrite_graph_def` with the environment's target (auto: `here` on a CPU
with native bfloat16). The CPU and whether it computes bfloat16 natively are printed first;
bytes do not depend on the CPU's speed, only on what the rewrite decided.

    python benchmarks/memory_profile.py --keras mobilenetv2 [transformer lstm]

A Keras 3 model of benchmarks/keras_models.py under `fit`: one `fit` step builds the model,
its optimizer and metrics; then the step `fit` traces (`model.train_step` in a tf.function, on
one batch) is rewritten as the automatic path rewrites it (tf_mpt's tf.function rewrite with
step timing: its candidates timed and measured on copies of the variables), and the float32
step and the rewritten one run side by side in step timing's sandbox
(timers.steps.traced_runs: copies of the variables, made-up inputs of the batch's shape), each
traced once after WARMUP runs. The same columns, from those traced runs.

Where its lean version without ordered products (activations saved in half, late casts: what
graph timing times beside a pick holding more than policy.SMALLER_ABOVE of float32's peak,
kept on a tie in time) changes tf_mpt's graph, a third row ("tf_mpt, lean") gives its holders.
"""

import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_mpt  # noqa: E402
from tf_mpt import _cpu  # noqa: E402
import train_speed  # noqa: E402  (the models)

tf1 = tf.compat.v1
WARMUP = 3
MIB = 1 << 20
HALF = {tf.bfloat16.as_datatype_enum: "bfloat16", tf.float16.as_datatype_enum: "float16"}


def lean_version(graph_def, dtype, shapes=None):
    """The rewrite's graph made lean as graph timing tries it beside a pick holding over
    policy.SMALLER_ABOVE of float32's peak (lean.lean without ordered products: activations
    saved in half, late casts; `shapes`: a tf.function's shape table, as its rewrite passes
    it), or None where that changes nothing (a lean pick already)."""
    from tf_mpt.choose.transforms import lean as _lean  # pylint: disable=import-outside-toplevel
    out, _ = _lean.lean(graph_def, False, tf_mpt.lists.default_lists(dtype), shapes,
                       ordered=False)
    return out if out is not graph_def else None


def _graphs(model, dtype):
    """[(variant, tf.Graph, report)]: float32, tf_mpt, and where it changes anything tf_mpt's
    lean version (lean_version)."""
    fetches = [train_speed.LOSS, train_speed.TRAIN, train_speed.INIT]
    result = tf_mpt.rewrite_graph_def(model.graph.as_graph_def(), dtype=dtype, fetches=fetches)
    found = [("float32", model.graph, None)]
    saved = lean_version(result.graph_def, dtype)
    for variant, graph_def in (("tf_mpt", result.graph_def),
                               ("tf_mpt, lean", saved)):
        if graph_def is None:
            continue
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        found.append((variant, graph, result.report if variant == "tf_mpt" else None))
    return found


def traced_step(graph, feeds):
    """RunMetadata of one step after WARMUP steps."""
    with tf1.Session(graph=graph, config=train_speed.session_config(0, False)) as session:
        session.run(train_speed.INIT)
        fetches = [f"{train_speed.LOSS}:0", train_speed.TRAIN]
        for _ in range(WARMUP):
            session.run(fetches, feeds)
        metadata = tf1.RunMetadata()
        session.run(fetches, feeds, options=tf1.RunOptions(
            trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
    return metadata


def _kind(node_stats):
    kinds = {HALF.get(o.tensor_description.dtype, "float32"
                      if o.tensor_description.dtype == tf.float32.as_datatype_enum else "other")
             for o in node_stats.output}
    return kinds.pop() if len(kinds) == 1 else "other"


def analyse(metadata):
    """{'peak': bytes, 'live': {(kind, op): bytes at the peak}, 'in_use': bytes}."""
    events, in_use = [], 0
    for device in metadata.step_stats.dev_stats:
        for ns in device.node_stats:
            op = ns.timeline_label.split(" = ")[1].split("(")[0] if " = " in \
                ns.timeline_label else "?"
            for memory in ns.memory:
                in_use = max(in_use, memory.allocator_bytes_in_use)
                for record in memory.allocation_records:
                    events.append((record.alloc_micros, record.alloc_bytes, ns.node_name,
                                   (_kind(ns), op)))
    events.sort(key=lambda e: (e[0], -e[1]))  # at one instant, allocations first
    total = peak = 0
    held, at_peak = collections.Counter(), {}
    for _, size, node, key in events:
        total += size
        held[node, key] += size
        if total > peak:
            peak = total
            at_peak = {k: v for k, v in held.items() if v > 0}
    live = collections.Counter()
    for (_, key), size in at_peak.items():
        live[key] += size
    return {"peak": peak, "live": live, "in_use": in_use}


def keras_rows(name, dtype):
    """{variant: analyse(...)} and the tf_mpt rewrite's report of Keras model `name`'s
    train step (see the module's docstring)."""
    import keras_models  # pylint: disable=import-outside-toplevel
    from tf_mpt.choose.timers import steps as _step_sandbox  # pylint: disable=import-outside-toplevel
    from tf_mpt.rewrite import tf_functions  # pylint: disable=import-outside-toplevel
    _, model, x, y, batch = keras_models.compiled_model(name, "float32", dtype, "keras")
    model.fit(x[:batch], y[:batch], batch_size=batch, epochs=1, verbose=0)
    step = tf.function(model.train_step)
    cf = step.get_concrete_function((tf.TensorSpec((batch,) + x.shape[1:], x.dtype),
                                     tf.TensorSpec((batch,), y.dtype)))
    rewritten = tf_functions._rewrite_concrete(  # pylint: disable=protected-access
        cf, dtype, None, None, None, timed=True, name=f"{name} train_step")
    graphs = {"float32": cf.graph.as_graph_def()}
    whole = rewritten.whole_graph_def()
    if whole is not None:
        graphs["tf_mpt"] = whole
        from tf_mpt.rewrite.paint import shapes  # pylint: disable=import-outside-toplevel
        saved = lean_version(whole, dtype, shapes.shapes_of_graph(cf.graph))
        if saved is not None:  # (its loop bodies may differ under the same names)
            graphs["tf_mpt, lean"] = tf_functions._rename_library(  # pylint: disable=protected-access
                saved, "_lean")
    metadatas, _ = _step_sandbox.traced_runs(cf, graphs, batch, WARMUP)
    return {variant: analyse(m) for variant, m in metadatas.items()}, rewritten.report


def _mib(n):
    return f"{n / MIB:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "lstm"],
                        choices=sorted(train_speed.BUILDERS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--keras", nargs="*", default=[], metavar="MODEL",
                        help="Keras models of benchmarks/keras_models.py, under fit")
    args = parser.parse_args(argv)
    native = _cpu.has_native_bfloat16(_cpu.cpu_flags())
    print(f"CPU: {_cpu.cpu_model()}; native bfloat16: {'yes' if native else 'no'}; "
          f"{args.dtype}; {'quick' if args.quick else 'full'} settings of train_speed.py")
    settings = train_speed.QUICK if args.quick else train_speed.FULL
    print("| model | variant | step peak MiB | live at peak: float32 / half / other MiB | "
          "of which Cast outputs MiB | largest holders at peak (op, dtype: MiB) | "
          "allocator in use MiB | tf_mpt summary |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.models if not args.keras else []:
        model = train_speed.BUILDERS[name](settings, np.random.RandomState(0))
        for variant, graph, report in _graphs(model, args.dtype):
            rows.append((name, variant, analyse(traced_step(graph, model.feeds)), report))
    for name in args.keras:
        found, report = keras_rows(name, args.dtype)
        for variant, analysed in found.items():
            rows.append((f"{name} (Keras fit step)", variant, analysed,
                         report if variant == "tf_mpt" else None))
    for name, variant, found, report in rows:
        by_kind = collections.Counter()
        for (kind, _), size in found["live"].items():
            by_kind["half" if kind in HALF.values() else kind] += size
        casts = sum(v for (_, op), v in found["live"].items() if op == "Cast")
        top = ", ".join(f"{op}, {kind}: {_mib(v)}" for (kind, op), v in
                        found["live"].most_common(4))
        summary = report.summary() if report is not None else ""
        print(f"| {name} | {variant} | {_mib(found['peak'])} | "
              f"{_mib(by_kind['float32'])} / {_mib(by_kind['half'])} / "
              f"{_mib(by_kind['other'])} | {_mib(casts)} | {top} | "
              f"{_mib(found['in_use'])} | {summary} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
