"""Where a Keras step's time goes: float32 vs Keras's mixed policy vs tf_mpt's rewrite, by kind
of op, from TensorFlow's profiler (the models of benchmarks/keras_models.py).

    python benchmarks/keras_profile.py [--models transformer lstm] [--phases fit evaluate]
                                       [--steps 5] [--dtype bfloat16] [--top 8]

Each (model, way) runs in its own process: the model is built and compiled, one warm-up
epoch of 3 steps of each phase runs, then --steps steps of each phase run under
`tf.profiler.experimental`; the op events of TensorFlow's executor threads are summed by kind
and divided by the steps. The figures are op time (the two executor threads' ops added up,
oneDNN's own threads not), so a row is what that kind of op costs a step, not wall time:

    matrix products   MatMul, BatchMatMul, Einsum, Conv2D and their backprops (any fusion)
    Casts             every Cast (the policy's, tf_mpt's and the model's own)
    variable reads    ReadVariableOp
    optimizer         ops under the optimizer's name scope (the update, Adam's moments)
    loss              ops under the compiled loss's name scope (and their gradients)
    bias gradients    BiasAddGrad, and Sum in the gradient tape
    normalization     ops of LayerNormalization / BatchNormalization (and their gradients)
    other             the rest (activations, softmax, reshapes, control flow)

Then the --top op types and Cast nodes by time, each way. The CPU is printed first.
"""

import argparse
import collections
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # support.helpers.executed_ops, in the child
import keras_models  # noqa: E402  (no TensorFlow import)
from tf_mpt import _cpu  # noqa: E402

WAYS = ("float32", "policy", "tf_mpt")
KINDS = ("matrix products", "Casts", "variable reads", "optimizer", "loss", "bias gradients",
         "normalization", "other")
_MATRIX = ("MatMul", "Einsum", "Conv2D", "Conv3D", "DepthwiseConv")
_OPTIMIZER_SCOPES = ("adam/", "sgd/", "rmsprop/", "loss_scale_optimizer/")
_NORMALIZATION = ("layer_normalization", "batch_normalization", "FusedBatchNorm")


def kind_of(name, op_type):
    """The KINDS row of one executed op (`name` as the executor reports it)."""
    lower = name.lower()
    if op_type == "Cast" or "Cast" in op_type and "Broadcast" not in op_type:
        return "Casts"
    if any(m in op_type for m in _MATRIX):
        return "matrix products"
    if op_type == "ReadVariableOp":
        return "variable reads"
    if any(scope in lower for scope in _OPTIMIZER_SCOPES) or lower.startswith("cond"):
        return "optimizer"  # (Keras 3 wraps the update in a cond: cond_1/adam/...)
    if "compile_loss" in lower:
        return "loss"
    if op_type == "BiasAddGrad" or (op_type == "Sum" and "gradient_tape" in lower):
        return "bias gradients"
    if any(n.lower() in lower for n in _NORMALIZATION):
        return "normalization"
    return "other"


# --- the child process ------------------------------------------------------------------------

def _child(name, way, phases, steps, dtype, keras_module):
    import numpy as np  # pylint: disable=import-outside-toplevel
    from support.helpers import executed_ops  # pylint: disable=import-outside-toplevel
    _, model, x, y, batch = keras_models.compiled_model(name, way, dtype, keras_module)
    x = np.concatenate([x] * max(1, -(-steps * batch // len(x))))
    y = np.concatenate([y] * max(1, -(-steps * batch // len(y))))
    run = {"fit": lambda n: model.fit(x[:n * batch], y[:n * batch], batch_size=batch,
                                      epochs=1, verbose=0),
           "evaluate": lambda n: model.evaluate(x[:n * batch], y[:n * batch],
                                                batch_size=batch, verbose=0),
           "predict": lambda n: model.predict(x[:n * batch], batch_size=batch, verbose=0)}
    out = {}
    for phase in phases:
        run[phase](3)
        events = collections.Counter()
        for node, op_type, ps in executed_ops(lambda: run[phase](steps)):  # pylint: disable=cell-var-from-loop
            events[node, op_type] += ps
        kinds, types = collections.Counter(), collections.Counter()
        for (node, op_type), ps in events.items():
            kinds[kind_of(node, op_type)] += ps / 1e9 / steps  # ms per step
            types[op_type] += ps / 1e9 / steps
        casts = {node: ps / 1e9 / steps for (node, op_type), ps in events.items()
                 if op_type == "Cast"}
        out[phase] = {"kinds": dict(kinds), "types": dict(types), "cast_nodes": len(casts),
                      "casts": sorted(casts.items(), key=lambda kv: -kv[1])[:20]}
    print(json.dumps(out))


# --- the parent -------------------------------------------------------------------------------

def _measure(name, way, args):
    command = [sys.executable, os.path.abspath(__file__), "--child", name, way,
               "--phases", *args.phases, "--steps", str(args.steps), "--dtype", args.dtype,
               "--keras", args.keras]
    env = keras_models._env(way, args.dtype, args.keras)  # pylint: disable=protected-access
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} / {way} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "lstm"],
                        choices=keras_models.MODELS)
    parser.add_argument("--phases", nargs="+", default=["fit", "evaluate"],
                        choices=keras_models.PHASES)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--keras", default="keras", choices=("keras", "tf_keras"))
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], args.phases, args.steps, args.dtype, args.keras)
        return
    print("; ".join(_cpu.facts()[:2]) + f"; {args.keras}, {args.dtype}, {args.steps} "
          "profiled steps per phase; op time in ms per step (executor threads summed)")
    for name in args.models:
        got = {way: _measure(name, way, args) for way in WAYS}
        for phase in args.phases:
            print(f"\n{name} {phase}\n")
            print("| kind | " + " | ".join(WAYS) + " |")
            print("|---|" + "---|" * len(WAYS))
            for kind in KINDS + ("total",):
                cells = []
                for way in WAYS:
                    kinds = got[way][phase]["kinds"]
                    value = sum(kinds.values()) if kind == "total" else kinds.get(kind, 0.0)
                    cells.append(f"{value:.2f}")
                print(f"| {kind} | " + " | ".join(cells) + " |")
            print("| Cast nodes run | " + " | ".join(
                str(got[way][phase]["cast_nodes"]) for way in WAYS) + " |")
            for way in WAYS:
                types = sorted(got[way][phase]["types"].items(), key=lambda kv: -kv[1])
                print(f"\n{way}, top op types: " + ", ".join(
                    f"{t} {ms:.2f}" for t, ms in types[:args.top]))
                print(f"{way}, top Casts: " + ", ".join(
                    f"{node} {ms:.2f}" for node, ms in got[way][phase]["casts"][:args.top]))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
