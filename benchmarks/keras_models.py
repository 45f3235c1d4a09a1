"""Real Keras models under `fit`, `evaluate` and `predict`: float32 vs Keras's own
`mixed_bfloat16` policy vs tf_mpt's automatic path (TF_MPT_ENABLE=1, its default rewrite) vs
tf_mpt setting the policy (TF_MPT_KERAS=policy).

    python benchmarks/keras_models.py [--models resnet50 ...] [--rounds 3] [--steps 8]
                                      [--min-seconds 2] [--dtype bfloat16]
                                      [--keras keras|tf_keras]
                                      [--step-timing auto|always|off]
                                      [--memory float32|least|any] [--memory-price 0.1]
                                      [--batch-scale 1] [--jit]
                                      [--ways float32 policy tf_mpt ...]

Models (random data, weights=None): ResNet50, MobileNetV2, EfficientNetB0, DenseNet121
(keras.applications, 128x128x3, batch 16, 10 classes), a Transformer encoder
(Embedding, MultiHeadAttention, LayerNormalization, a GELU MLP; sequences of 128, batch 32)
and an LSTM text classifier (Embedding, LSTM 256, Dense; sequences of 64, batch 32). Adam,
sparse categorical cross-entropy.

Each (model, way) runs in its own process: the model is built and compiled, one warm-up
epoch of 3 steps of each phase runs (tracing, tf_mpt's rewrite, first-use measuring), then
the timed steps of each phase: --steps, or more where they would take less than
--min-seconds by the warm-up's later steps (a 30 ms predict step gets ~70: a few steps of a
short phase read a shared machine's passing slowdowns as the phase's speed); a phase's time
is the median of its steps (Keras batch callbacks). The ways run in an interleaved order,
--rounds times, and each way's speed-up is the median over rounds of float32's time / its
time in the same round (paired ratios), with half the spread of those ratios over the
rounds, relative (±); the noise column is half the spread of the float32 times over the
rounds, relative. A tf_mpt cell marked "(float32's graph)" is a phase whose steps tf_mpt's
cost model left entirely float32 (its rewrites converted 0 nodes, from its log): Keras's own
graph ran, and the ratio measures only tf_mpt's per-call overhead and the noise. The CPU and whether it computes bfloat16 natively are
printed first; without native bfloat16 the speed figures mean nothing for the machines the
tool targets (the table says so).

Memory (issue "memory"): over the timed fit phase, each child reads the peak bytes in use of
TensorFlow's CPU allocator (reset at the phase's start: weights, optimizer slots,
activations, gradients) and its peak resident set size over the phase minus its resident size
at the phase's start (VmHWM, as benchmarks/train_speed.py reads it); a table gives their
medians over the rounds per way, with the ratio to float32's. A second table sets those
tensors beside the bytes every way holds across steps in float32 (the model's and its
optimizer's variables: weights, Adam's two slots): its floor is what a step reaches with
every other byte of float32's peak in half, and "the rest" is each way's peak less those
bytes against float32's. --batch-scale K runs each model at K times its batch, where
activations dominate more.

--step-timing sets TF_MPT_STEP_TIMING for the tf_mpt ways (default: tf_mpt's default, auto):
`always` times every traced step's candidates (and measures their peaks), where auto times
only steps whose predicted saving is thin. --memory sets TF_MPT_MEMORY for the tf_mpt ways
(`least`: memory first, never slower than float32; it times every traced step).
--memory-price sets TF_MPT_MEMORY_PRICE (the share of float32's speed a step may give up to
hold within 0.65x float32's peak).

--jit (issue "XLA"): every way runs twice in each round, its model compiled with XLA off and
with `jit_compile=True` (Keras 3's default on a machine with a GPU; the policy way's mixed
policy under XLA too), and two speed tables follow: XLA off, and XLA on, each way against
float32 with the same setting; the XLA table's last column is tf_mpt with XLA over float32
without it, so whether XLA and mixed precision add up on this CPU reads off one run. The
memory tables are of the XLA-off runs (XLA's CPU runtime allocates outside TensorFlow's
allocator). --ways runs a subset of the ways (float32 always).
"""

import argparse
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, ROOT)
from tf_mpt import _cpu  # noqa: E402  (no TensorFlow import)

MODELS = ("resnet50", "mobilenetv2", "efficientnetb0", "densenet121", "transformer", "lstm")
WAYS = ("float32", "policy", "tf_mpt", "tf_mpt_policy")
PHASES = ("fit", "evaluate", "predict")
WARM_UP_STEPS = 3
APPLICATIONS = {"resnet50": "ResNet50", "mobilenetv2": "MobileNetV2",
                "efficientnetb0": "EfficientNetB0", "densenet121": "DenseNet121"}


def _env(way, dtype, keras_module, step_timing=None, memory=None, memory_price=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_MPT_")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    if keras_module == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    if way.startswith("tf_mpt"):
        env.update(TF_MPT_ENABLE="1", TF_MPT_DTYPE=dtype,
                   TF_MPT_KERAS="policy" if way == "tf_mpt_policy" else "rewrite")
        if step_timing:
            env["TF_MPT_STEP_TIMING"] = step_timing
        if memory:
            env["TF_MPT_MEMORY"] = memory
        if memory_price:
            env["TF_MPT_MEMORY_PRICE"] = memory_price
    return env


# --- the child process ------------------------------------------------------------------------

def _build(keras, name, rng, scale=1):
    """(model, x, y, batch) of `name`, its batch `scale` times its own."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    if name in APPLICATIONS:
        batch = 16 * scale
        model = getattr(keras.applications, APPLICATIONS[name])(
            weights=None, input_shape=(128, 128, 3), classes=10)
        x = rng.rand(batch * 4, 128, 128, 3).astype(np.float32)
    elif name == "transformer":
        batch, length = 32 * scale, 128
        tokens = keras.Input((length,), dtype="int32")
        h = keras.layers.Embedding(8000, 256)(tokens)
        for _ in range(2):
            attended = keras.layers.MultiHeadAttention(4, 64)(h, h)
            h = keras.layers.LayerNormalization()(h + attended)
            mlp = keras.layers.Dense(256)(keras.layers.Dense(1024, activation="gelu")(h))
            h = keras.layers.LayerNormalization()(h + mlp)
        out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
        model = keras.Model(tokens, out)
        x = rng.randint(1, 8000, size=(batch * 4, length)).astype(np.int32)
    else:  # lstm
        batch, length = 32 * scale, 64
        tokens = keras.Input((length,), dtype="int32")
        h = keras.layers.LSTM(256)(keras.layers.Embedding(8000, 128)(tokens))
        model = keras.Model(tokens, keras.layers.Dense(10)(h))
        x = rng.randint(1, 8000, size=(batch * 4, length)).astype(np.int32)
    y = rng.randint(0, 10, size=len(x)).astype(np.int32)
    return model, x, y, batch


def compiled_model(name, way, dtype, keras_module, scale=1, jit=False):
    """(keras module, compiled model, x, y, batch) of `name` as `way` runs it (the policy
    way sets Keras's mixed `dtype` policy first), its batch `scale` times its own, compiled
    with `jit_compile=jit`; in a child process (imports TensorFlow)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    if keras_module == "tf_keras":
        import tf_keras as keras  # pylint: disable=import-outside-toplevel
    else:
        import keras  # pylint: disable=import-outside-toplevel
    keras.utils.set_random_seed(0)
    if way == "policy":
        keras.mixed_precision.set_global_policy(f"mixed_{dtype}")
    model, x, y, batch = _build(keras, name, np.random.RandomState(0), scale)
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit)
    return keras, model, x, y, batch


def _held_mib(model):
    """The MiB of the model's and its optimizer's variables (weights, batch norms' moving
    statistics, Adam's slots): held across steps, float32 in every way."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    found = {id(v): v for v in list(model.variables) + list(model.optimizer.variables)}
    return sum(math.prod(v.shape) * tf.as_dtype(v.dtype).size
               for v in found.values()) / (1 << 20)


def _child(name, way, steps, min_seconds, dtype, keras_module, scale, jit=False):
    import time  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    keras, model, x, y, batch = compiled_model(name, way, dtype, keras_module, scale, jit)
    times = {phase: [] for phase in PHASES}

    class Timer(keras.callbacks.Callback):
        def __init__(self, phase):
            super().__init__()
            self.phase, self.began = phase, 0.0

        def _begin(self, batch, logs=None):
            self.began = time.perf_counter()

        def _end(self, batch, logs=None):
            times[self.phase].append(time.perf_counter() - self.began)

        on_train_batch_begin = on_test_batch_begin = on_predict_batch_begin = _begin
        on_train_batch_end = on_test_batch_end = on_predict_batch_end = _end

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train_speed  # pylint: disable=import-outside-toplevel  (its memory readers)
    rewrites = _Rewrites()
    counts = {phase: WARM_UP_STEPS for phase in PHASES}
    memory = {}
    for warm in (True, False):
        for phase in PHASES:
            size = counts[phase] * batch  # (np.resize repeats the data to that size)
            fx, fy = np.resize(x, (size,) + x.shape[1:]), np.resize(y, (size,))
            rewrites.phase = phase
            timer = [Timer(phase)]
            if phase == "fit":
                if not warm:  # the timed fit's peaks: tensors and RSS over its steps
                    tracked = train_speed._reset_allocator_peak()  # pylint: disable=protected-access
                    train_speed._reset_peak_rss()  # pylint: disable=protected-access
                    rss = train_speed._peak_rss_mib()  # pylint: disable=protected-access
                model.fit(fx, fy, batch_size=batch, epochs=1, verbose=0, callbacks=timer)
                if not warm:
                    memory["fit_rss"] = train_speed._peak_rss_mib() - rss  # pylint: disable=protected-access
                    memory["fit_tensors"] = (tf.config.experimental.get_memory_info(
                        train_speed.CPU_DEVICE)["peak"] / train_speed.MIB if tracked else None)
                    memory["held"] = _held_mib(model)
            elif phase == "evaluate":
                model.evaluate(fx, fy, batch_size=batch, verbose=0, callbacks=timer)
            else:
                model.predict(fx, batch_size=batch, verbose=0, callbacks=timer)
        if warm:  # a short step gets more timed steps: at least min_seconds of them
            counts = {phase: max(steps, math.ceil(min_seconds / max(
                statistics.median(times[phase][1:]), 1e-3))) for phase in PHASES}
            times = {phase: [] for phase in PHASES}
    loss = float(model.evaluate(x[:batch], y[:batch], batch_size=batch, verbose=0))
    print(json.dumps({phase: statistics.median(t) * 1e3 for phase, t in times.items()}
                     | {"loss": loss, "converted": rewrites.converted, "steps": counts,
                        "timed": rewrites.timed} | memory))


class _Rewrites(logging.Handler):
    """Counts the nodes tf_mpt's rewrites converted, per phase, from its log ('Converted
    N/M nodes ...', one per traced step function): 0 in a phase means that phase ran
    Keras's own float32 graph. Set `phase` before each phase runs."""

    _CONVERTED = re.compile(r"Converted (\d+)/\d+ nodes")
    # step timing's verdict: each candidate's time and the one that runs
    _TIMED = re.compile(r"tf_mpt timed tf.function (\S+) on copies of its variables: graph "
                        r"timing \(median of \d+ rounds[^)]*\): (.*); picked ([a-z0-9 ]+?)"
                        r"(,| over|$)")
    _CANDIDATE = re.compile(r"(float32|rules checked|rules|cost model|contractions only) "
                            r"([\d.e+-]+) ms")
    _LEAN = re.compile(r"lean (rules|cost model|contractions only|float32) \([^)]*\) "
                       r"([\d.e+-]+) ms")

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.phase, self.converted, self.timed = None, {}, {}
        logger = logging.getLogger("tf_mpt")
        logger.addHandler(self)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)

    def emit(self, record):
        message = record.getMessage()
        found = self._CONVERTED.match(message)
        if found and self.phase is not None:
            self.converted[self.phase] = self.converted.get(self.phase, 0) + int(found.group(1))
        timed = self._TIMED.match(message)
        if timed and self.phase is not None:
            parts, _, refinement = timed.group(2).partition(", refined (")
            first = parts.partition(", lean ")[0]  # (the first rounds)
            times = {name: float(ms) for name, ms in self._CANDIDATE.findall(first)}
            refined = re.search(r"\) ([\d.e+-]+) ms beside", refinement)
            if refined:  # (timed beside the first rounds' pick)
                times["refined"] = float(refined.group(1))
            lean = self._LEAN.search(timed.group(2))
            pick = timed.group(3)
            if lean:  # (the lean version of one candidate, timed beside another)
                times["lean"] = float(lean.group(2))
                if pick == "lean":
                    pick = f"lean {lean.group(1)}"
            self.timed.setdefault(self.phase, []).append(
                {"function": timed.group(1), "ms": times, "pick": pick})


# --- the parent -------------------------------------------------------------------------------

def _measure(name, way, args, jit=False):
    command = [sys.executable, __file__, "--child", name, way, "--steps", str(args.steps),
               "--min-seconds", str(args.min_seconds), "--dtype", args.dtype,
               "--keras", args.keras, "--batch-scale", str(args.batch_scale)] + (
                   ["--jit"] if jit else [])
    done = subprocess.run(command, env=_env(way, args.dtype, args.keras, args.step_timing,
                                            args.memory, args.memory_price),
                          cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} / {way}{' (XLA)' if jit else ''} failed:\n"
                         f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median_of(runs, way, key):
    values = [r[way][key] for r in runs if r[way].get(key) is not None]
    return statistics.median(values) if values else None


def _print_held(memories, ways):
    """What the variables put out of reach: the bytes held across steps (float32 in every
    way), the lowest share of float32's peak a step reaches with every other byte in half,
    and each way's bytes over the held ones against float32's."""
    print("\nheld across steps = the model's and its optimizer's variables (weights, moving "
          "statistics, Adam's slots: float32 in every way); floor = (held + half of float32's "
          "other bytes at its peak) / float32's peak, what halving every other byte reaches; the "
          "rest = (peak - held) over float32's (MiB, medians over the rounds):")
    print("| model | held across steps | float32 tensors | floor | " +
          " | ".join(f"{w} (the rest)" for w in ways[1:]) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(ways[1:]))
    for name, runs in memories:
        held, base = _median_of(runs, "float32", "held"), _median_of(runs, "float32",
                                                                      "fit_tensors")
        if held is None or not base or base <= held:
            continue
        cells = []
        for way in ways[1:]:
            value = _median_of(runs, way, "fit_tensors")
            cells.append("n/a" if value is None else
                         f"{value / base:.2f}x ({(value - held) / (base - held):.2f}x)")
        print(f"| {name} | {held:.1f} | {base:.1f} | {(held + (base - held) / 2) / base:.2f}x"
              f" | " + " | ".join(cells) + " |")


def _speed_row(name, phase, runs, ways, ratios, jit, without_xla=None):
    """One row of a speed table: float32's median ms/step, its noise, each way's paired
    speed-up over float32 in the same rounds (`ratios` collects them); with `without_xla`
    (the same rounds with XLA off), tf_mpt's XLA time against float32's without XLA."""
    base = [r["float32"][phase] for r in runs]
    noise = (max(base) - min(base)) / 2 / statistics.median(base)
    cells = []
    for way in ways[1:]:
        each = [r["float32"][phase] / r[way][phase] for r in runs]
        paired = statistics.median(each)
        ratios[(way, jit)].append(paired)
        cell = f"{paired:.2f}x ±{(max(each) - min(each)) / 2 / paired:.0%}"
        if way.startswith("tf_mpt") and all(
                r[way].get("converted", {}).get(phase) == 0 for r in runs):
            cell += " (float32's graph)"  # tf_mpt converted nothing: noise only
        cells.append(cell)
    if without_xla is not None and "tf_mpt" in ways:
        each = [off["float32"][phase] / on["tf_mpt"][phase]
                for off, on in zip(without_xla, runs)]
        paired = statistics.median(each)
        cells.append(f"{paired:.2f}x ±{(max(each) - min(each)) / 2 / paired:.0%}")
    return (f"| {name} | {phase} | {statistics.median(base):.1f} | ±{noise:.0%} | " +
            " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--min-seconds", type=float, default=2.0,
                        help="timed steps per phase: at least --steps, and at least this "
                             "many seconds of them (by the warm-up steps' time)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--keras", default="keras", choices=("keras", "tf_keras"))
    parser.add_argument("--step-timing", choices=("auto", "always", "off"),
                        help="TF_MPT_STEP_TIMING for the tf_mpt ways (default: its default)")
    parser.add_argument("--memory", choices=("float32", "least", "any"),
                        help="TF_MPT_MEMORY for the tf_mpt ways (default: its default)")
    parser.add_argument("--memory-price", help="TF_MPT_MEMORY_PRICE for the tf_mpt ways "
                        "(default: unset, 0)")
    parser.add_argument("--batch-scale", type=int, default=1,
                        help="each model's batch this many times its own (activations "
                             "dominate more)")
    parser.add_argument("--jit", action="store_true",
                        help="every way with XLA off and with jit_compile=True (two tables)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS),
                        help="the ways to run (float32 always)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], args.steps, args.min_seconds, args.dtype,
               args.keras, args.batch_scale, args.jit)
        return
    ways = [way for way in WAYS if way == "float32" or way in args.ways]
    native = _cpu.has_native_bfloat16(_cpu.cpu_flags())
    print("; ".join(_cpu.facts()[:2]) + f"; {args.keras}, {args.dtype}, {args.rounds} "
          f"rounds of at least {args.steps} steps and {args.min_seconds:g} s per phase" +
          (f"; batches {args.batch_scale}x their own" if args.batch_scale != 1 else "") +
          (f"; TF_MPT_MEMORY={args.memory}" if args.memory else "") +
          (f"; TF_MPT_MEMORY_PRICE={args.memory_price}" if args.memory_price else "") +
          ("; each way with XLA off and on (jit_compile=True)" if args.jit else ""))
    if args.dtype == "bfloat16" and not native:
        print("(no native bfloat16 here: these speed-ups say nothing about Zen 4 / AMX)")
    settings = (False, True) if args.jit else (False,)
    ratios = {(way, jit): [] for way in ways[1:] for jit in settings}
    picks = []  # (model, phase, step timing's verdict)
    memories = []  # (model, the rounds' records, XLA off)
    tables = {jit: [] for jit in settings}  # the table's rows
    for name in args.models:
        runs = {jit: [] for jit in settings}
        for k in range(args.rounds):
            order = ways[k % len(ways):] + ways[:k % len(ways)]  # interleaved
            for jit in settings:
                runs[jit].append({way: _measure(name, way, args, jit) for way in order})
        memories.append((name, runs[False]))
        for jit in settings:
            for phase, found in runs[jit][0].get("tf_mpt", {}).get("timed", {}).items():
                picks.extend((name, phase + (" (XLA)" if jit else ""), each)
                             for each in found)
            for phase in PHASES:
                tables[jit].append(_speed_row(name, phase, runs[jit], ways, ratios, jit,
                                              runs[False] if jit else None))
    for jit in settings:
        if args.jit:
            print("\nXLA on (jit_compile=True): each way against float32 with XLA on" +
                  ("; last column: tf_mpt with XLA against float32 without it" if
                   "tf_mpt" in ways else "") if jit else "XLA off:")
        print("| model | phase | float32 ms/step | noise | " + " | ".join(ways[1:]) +
              (" | tf_mpt (XLA) / float32 (no XLA) |" if jit and "tf_mpt" in ways else " |"))
        print("|---|---|---|---|" + "---|" * (len(ways) - 1) +
              ("---|" if jit and "tf_mpt" in ways else ""))
        for row in tables[jit]:
            print(row)
        means = [statistics.geometric_mean(ratios[(way, jit)]) for way in ways[1:]]
        print("| geometric mean | | | | " + " | ".join(f"{m:.2f}x" for m in means) + " |",
              flush=True)
    if memories:
        print("\nfit's peak memory (the timed fit phase; medians over the rounds): tensors = "
              "peak in use by TensorFlow's CPU allocator (weights, optimizer slots, "
              "activations, gradients), RSS = the process's peak resident set size over the "
              "phase minus its resident size at its start (MiB):")
        print("| model | " + " | ".join(f"{w} tensors" for w in ways) + " | " +
              " | ".join(f"{w} RSS" for w in ways) + " |")
        print("|---|" + "---:|" * (2 * len(ways)))
        for name, runs in memories:
            cells = []
            for key in ("fit_tensors", "fit_rss"):
                base = _median_of(runs, "float32", key)
                for way in ways:
                    value = _median_of(runs, way, key)
                    cells.append("n/a" if value is None else f"{value:.1f}" + (
                        f" ({value / base:.2f}x)" if way != "float32" and base else ""))
            print(f"| {name} | " + " | ".join(cells) + " |")
        _print_held(memories, ways)
    if picks:
        print("\ntf_mpt's step timing (the default way: each traced step it timed, each "
              "candidate's sandbox ms per run (a candidate equal to another is timed once; "
              "refined: the pick with its op types profiled slower in half float32, timed "
              "beside it; lean: a candidate's lean version (tf_mpt/choose/transforms/), timed beside it; -: "
              "not tried) "
              "and the one that ran; first round):")
        names = ("float32", "rules", "cost model", "contractions only", "refined", "lean")
        print("| model | phase | function | " + " | ".join(f"{n} ms" for n in names) +
              " | pick |")
        print("|---|---|---|" + "---|" * len(names) + "---|")
        for name, phase, each in picks:
            cells = [f"{each['ms'][n]:.1f}" if n in each["ms"] else
                     "-" if n in ("refined", "lean") else "=" for n in names]
            print(f"| {name} | {phase} | {each['function']} | " + " | ".join(cells) +
                  f" | {each['pick']} |")


if __name__ == "__main__":
    main()
