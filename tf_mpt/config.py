"""Config: the only reader of TF_MPT_* environment variables.

`Config.from_env(environ)` parses a mapping once (tests pass a plain dict) into an immutable
Config. Bad values raise ValueError naming the variable, the value and what is accepted.

Example:
    >>> cfg = Config.from_env({"TF_MPT_DENYLIST_ADD": "Tanh"})
    >>> "Tanh" in cfg.lists_for("float16").deny
    True
"""

import dataclasses
import os
import re
import typing

from tf_mpt import lists as _lists
from tf_mpt import targets as _targets

TF_MPT_ALLOWLIST_ADD = "TF_MPT_ALLOWLIST_ADD"
TF_MPT_ALLOWLIST_REMOVE = "TF_MPT_ALLOWLIST_REMOVE"
TF_MPT_INFERLIST_ADD = "TF_MPT_INFERLIST_ADD"
TF_MPT_INFERLIST_REMOVE = "TF_MPT_INFERLIST_REMOVE"
TF_MPT_DENYLIST_ADD = "TF_MPT_DENYLIST_ADD"
TF_MPT_DENYLIST_REMOVE = "TF_MPT_DENYLIST_REMOVE"
TF_MPT_CLEARLIST_ADD = "TF_MPT_CLEARLIST_ADD"
TF_MPT_CLEARLIST_REMOVE = "TF_MPT_CLEARLIST_REMOVE"
TF_MPT_DUMP_DIR = "TF_MPT_DUMP_DIR"
TF_MPT_ENABLE = "TF_MPT_ENABLE"
TF_MPT_GRAPH_REWRITE = "TF_MPT_GRAPH_REWRITE"
TF_MPT_LOSS_SCALING = "TF_MPT_LOSS_SCALING"
TF_MPT_DTYPE = "TF_MPT_DTYPE"
TF_MPT_LOSS_SCALE = "TF_MPT_LOSS_SCALE"
TF_MPT_TARGET = "TF_MPT_TARGET"
TF_MPT_COST_MODEL = "TF_MPT_COST_MODEL"
TF_MPT_CPU_FLAGS = "TF_MPT_CPU_FLAGS"
TF_MPT_SESSION_REWRITE = "TF_MPT_SESSION_REWRITE"
TF_MPT_CACHE_DIR = "TF_MPT_CACHE_DIR"
TF_MPT_OP_COSTS = "TF_MPT_OP_COSTS"
TF_MPT_COST_BATCH = "TF_MPT_COST_BATCH"
TF_MPT_ALLREDUCE_DTYPE = "TF_MPT_ALLREDUCE_DTYPE"
TF_MPT_KERAS = "TF_MPT_KERAS"
TF_MPT_STEP_TIMING = "TF_MPT_STEP_TIMING"
TF_MPT_TIMING_BUDGET = "TF_MPT_TIMING_BUDGET"
TF_MPT_DISPATCH_CHECK = "TF_MPT_DISPATCH_CHECK"
TF_MPT_MEMORY = "TF_MPT_MEMORY"
TF_MPT_MEMORY_PRICE = "TF_MPT_MEMORY_PRICE"

# (variable, default, meaning): the README's env-var table is checked against this by a test.
ENV_VARS = (
    (TF_MPT_ENABLE, "0", "Master switch for the automatic path: rewrite graphs and scale the "
     "loss in an unmodified script (1/0, true/false, yes/no, on/off)."),
    (TF_MPT_GRAPH_REWRITE, "(TF_MPT_ENABLE)", "Graph rewrite on/off; when set it wins over "
     "TF_MPT_ENABLE."),
    (TF_MPT_LOSS_SCALING, "(TF_MPT_ENABLE, float16 only)", "Automatic loss scaling on/off; "
     "when set it wins over TF_MPT_ENABLE. Unset: on for float16, off for bfloat16."),
    (TF_MPT_DTYPE, "auto", "float16, bfloat16 or auto (float16 with a GPU, bfloat16 on a CPU "
     "with native bfloat16, otherwise float32 with a warning)."),
    (TF_MPT_LOSS_SCALE, "dynamic", "dynamic, or a positive number for a static loss scale."),
    (TF_MPT_ALLREDUCE_DTYPE, "float32", "dtype in which tf_mpt's loss-scaling optimizers "
     "all-reduce gradients under tf.distribute: float32, float16 (the loss-scaled gradients; "
     "an overflow in the sum skips the step on every replica), bfloat16 (unscaled), or auto "
     "(float16 with a dynamic loss scale, else bfloat16)."),
    (TF_MPT_ALLOWLIST_ADD, "", "Comma-separated op names to put on the allow list "
     "(taken off any other list, so one ADD moves an op)."),
    (TF_MPT_ALLOWLIST_REMOVE, "", "Comma-separated op names to take off the allow list."),
    (TF_MPT_INFERLIST_ADD, "", "Comma-separated op names to put on the infer list."),
    (TF_MPT_INFERLIST_REMOVE, "", "Comma-separated op names to take off the infer list."),
    (TF_MPT_DENYLIST_ADD, "", "Comma-separated op names to put on the deny list."),
    (TF_MPT_DENYLIST_REMOVE, "", "Comma-separated op names to take off the deny list."),
    (TF_MPT_CLEARLIST_ADD, "", "Comma-separated op names to put on the clear list."),
    (TF_MPT_CLEARLIST_REMOVE, "", "Comma-separated op names to take off the clear list."),
    (TF_MPT_TARGET, "auto", "The machine precision decisions are made for. rules: the op lists "
     "alone (a GPU, or any machine nobody measured; nothing measured, the same output on "
     "every machine); here: this CPU, measured at first use (the cost model keeps ops float32 "
     "where their half kernels, Casts included, would be slower; static shapes needed); a "
     "file: a cost table written by `tf-mpt measure --out FILE` on the target machine "
     "(nothing measured); auto: here for bfloat16 on a CPU with native bfloat16 and no GPU, "
     "otherwise rules (float16's speed target is the GPU)."),
    (TF_MPT_COST_MODEL, "auto", "Older name of TF_MPT_TARGET, still accepted with one "
     "WARNING naming the TF_MPT_TARGET to set: 0 is TF_MPT_TARGET=rules, 1 is "
     "TF_MPT_TARGET=here (for float16 too), auto is auto. Setting both to different targets "
     "is an error."),
    (TF_MPT_OP_COSTS, "(measured)", "A cost table (JSON, written by `tf-mpt measure --out "
     "FILE`) standing in for this CPU's measurements: `auto` uses it for bfloat16 and `here` "
     "reads it instead of measuring; tests inject one so their decisions do not depend on "
     "the machine."),
    (TF_MPT_COST_BATCH, "32", "The batch size the cost model assumes where a graph leaves the "
     "leading dimension unknown (a placeholder of shape [None, ...]; Keras's default batch "
     "size); 0: assume none, and such parts keep the op lists' decisions."),
    (TF_MPT_CPU_FLAGS, "(/proc/cpuinfo)", "Space-separated CPU flags that `auto` decides from "
     "instead of the real CPU's, e.g. `avx2` or `avx512f avx512_bf16` (tests; what `auto` "
     "would pick on another CPU). Changes no kernel TensorFlow runs."),
    (TF_MPT_SESSION_REWRITE, "grappler", "Where the automatic path rewrites a TF1 Session's "
     "graph. grappler: inside the Session's own graph optimisation (tf_mpt's Grappler "
     "optimizer, compiled at first use; one graph, one copy of every queue, iterator and "
     "table); copy: the Session runs a rewritten copy of its graph (no compiler needed; a "
     "graph holding queues, iterators, tables or readers then runs float32 with a warning). "
     "grappler falls back to copy with a warning when it cannot be built or loaded."),
    (TF_MPT_KERAS, "rewrite", "How the automatic path gives Keras and tf_keras mixed precision. "
     "rewrite: Keras stays float32 (every tensor the script receives keeps its dtype) and "
     "tf_mpt rewrites the graphs Keras traces for fit / evaluate / predict, like a "
     "tf.function's; policy: the global mixed_float16 / mixed_bfloat16 dtype policy (layers "
     "compute and return half tensors; Keras's own LossScaleOptimizer for float16)."),
    (TF_MPT_STEP_TIMING, "auto", "Whether a rewritten tf.function (a Keras step included) has "
     "its candidate colourings timed before it runs: float32, the op lists', the cost "
     "model's and contractions only, as a graph's (TF_MPT_TIMING_BUDGET). auto: where the cost "
     "model measured this CPU and its predicted saving is small beside the kernel and Cast "
     "times it sums (under 30%), or rests on half kernels other than matrix products and "
     "convolutions (over 20% of it: each probed alone, not at the graph's shapes), or, with "
     "TF_MPT_MEMORY=float32, where the function computes "
     "gradients and the cost model kept 10% or more of its nodes float32, or keeps a loop's "
     "buffers (TensorLists, loop variables) half (what it holds is measured), and every step "
     "XLA compiles or that calls one XLA compiles (the cost model adds up TensorFlow's "
     "kernels, not XLA's program); always: wherever the cost model measured this CPU and "
     "something was converted; off: never. The candidates run in rotating rounds on copies "
     "of the function's variables and on made-up inputs of its argument shapes, in a Session "
     "of their own (the script's variables and inputs are not touched; a step XLA compiles: "
     "each candidate compiled once by XLA, outside the rounds, its compile time off the "
     "budget); the function then "
     "runs the fastest (the cost model's unless another is over 3% faster). A function with "
     "an op that acts outside its variables (printing, summaries, queues, iterators, "
     "collectives, Python calls) is not timed."),
    (TF_MPT_TIMING_BUDGET, "30", "Seconds of timed runs a rewrite for this CPU (target "
     "here; a traced tf.function where TF_MPT_STEP_TIMING times it) may spend timing the "
     "graph itself: its candidate colourings (float32, the op lists', the cost "
     "model's, contractions only) run on made-up inputs of its placeholders' shapes, each in "
     "a Session of its own with random copies of its variables, and the fastest is kept "
     "(the prediction unless another is over 3% faster). The first rounds spend up to 60% "
     "of it, a lean or refined version what is left; setting a candidate up (its import, "
     "a warm-up run: seconds for a graph of thousands of nodes) is not counted. Where 3 "
     "rounds of every candidate would not fit, a candidate over 20% slower than the fastest "
     "in every round so far runs no more rounds; where the others' still do not fit, the "
     "graph is not timed (see TF_MPT_MEMORY). "
     "0: never (the prediction decides). "
     "`tf-mpt convert` / `inspect --no-timing` is 0, and 0 turns step timing off too. A graph whose fetches need ops with "
     "effects outside their own state (files, queues, iterators, Python calls) is not timed."),
    (TF_MPT_MEMORY, "float32", "What graph timing allows a timed graph to hold. float32: "
     "never a colouring whose measured peak (the highest sum of bytes a traced run holds, "
     "plus its variables, optimizer slots and inputs) is over float32's by more than 2%; "
     "where the fastest is over, its lean versions (first its weight gradients' products "
     "ordered alone, so that two are not held in both dtypes at once, nor beside an "
     "activation about to be freed; if still over, with a held value's half Cast made at "
     "each use, after the use's other input, and a loss reduced before the backward pass "
     "starts; then a leaner one with those weight gradients computed in float32) are timed and measured too, and the fastest within "
     "float32's peak is kept; of candidates within 3% of the fastest, the one holding least; "
     "where the pick still holds over 0.65x float32's peak, its lean version with its "
     "activations saved in half (a float32 value read late, by the backward pass, held as "
     "its half copy and cast back where it is read), and those of the candidates within 15% "
     "of its time, and its own saved in half from the half copies it has alone (no new "
     "Cast down: one Cast up per late reader), are timed beside it, and the one holding "
     "least of those that hold less "
     "and are not over 3% slower, nor slower than float32, is kept, unless it still holds over 0.65x: then the fastest "
     "of them within 0.65x is kept if it is not over 10% slower than the pick and over 3% "
     "faster than float32 (the price of half the memory, said in the verdict's line); "
     "TF_MPT_STEP_TIMING=auto also times a traced step "
     "that computes gradients where the cost model kept 10% or more of its nodes float32, or "
     "through a loop whose buffers it keeps half. "
     "A graph too slow to time (3 rounds do not fit in the budget) has its peaks measured "
     "instead, one traced run each, under float32 and least: the prediction runs where within "
     "float32's peak, else its first lean version within it, else float32 (speed not "
     "measured; the check is cached, and read again under the same TF_MPT_TIMING_BUDGET). "
     "least: memory first (bigger batches), never slower than "
     "float32: the candidate holding least among those whose median time is not above "
     "float32's; every half pick's lean version is timed beside it and float32 and kept if "
     "it holds less and is not slower than float32; every traced tf.function is timed "
     "(TF_MPT_STEP_TIMING=auto acts as always); no refinement. any: the peaks are measured "
     "and reported, and the fastest is kept whatever it holds. The same for a traced tf.function that step timing times (its "
     "copies of the variables and inputs are the bytes held alike)."),
    (TF_MPT_MEMORY_PRICE, "0", "The share of float32's speed a timed graph may give up to "
     "hold within 0.65x float32's peak (a number from 0 to 1; 0.1: up to 10% slower than "
     "float32). 0: never slower than float32. Above 0, under TF_MPT_MEMORY=float32: where the "
     "pick (float32 included, in a graph that computes gradients) holds over 0.65x float32's "
     "peak, the lean versions of the candidates within this share of float32's time (or "
     "within 15% of the pick's) and float32's own (its compute float32, the activations its backward pass reads saved in "
     "half) are timed beside the pick and float32, and the fastest within 0.65x is kept if "
     "its median is not over float32's by more than this share; every traced step that "
     "computes gradients is timed (TF_MPT_STEP_TIMING=auto). Under least: the candidate "
     "holding least among those not over float32's time by more than this share, float32's "
     "own lean version among them. The verdict's line says what the memory cost. Not with "
     "TF_MPT_MEMORY=any (nothing is bounded), nor for a graph too slow to time (its speed "
     "is not measured)."),
    (TF_MPT_DISPATCH_CHECK, "1", "Where the graph runs on this machine (the automatic path "
     "in a process with no GPU; target here), each half op type is first run as TensorFlow "
     "runs it here (with the neighbours its remapper fuses into it) against float32, once "
     "per machine in a child process (cached), and an op type over 3x slower in half stays "
     "float32 with one WARNING naming the op and the ratio (a float16 Conv2DBackpropFilter "
     "on a CPU without AVX512_FP16 runs on oneDNN's reference path). The same run checks "
     "accuracy (the numerics check): an op type whose half output errs over 4x the rounding "
     "of float32's result on the same inputs stays float32, with one WARNING naming the "
     "remedy where one exists (with oneDNN off, Eigen's bfloat16 Conv2DBackpropFilter errs "
     "14x: TF_ENABLE_ONEDNN_OPTS=1). 0: neither check, every op the lists allow goes half. "
     "A table standing in for this CPU (TF_MPT_OP_COSTS) supplies the ratios instead (its "
     "\"dispatch\" and \"numerics\" entries)."),
    (TF_MPT_CACHE_DIR, "(~/.cache/tf_mpt)", "Directory of what tf_mpt measures and builds "
     "once per machine: this CPU's kernel times, graph timing's verdicts, the dispatch and "
     "numerics checks, the compiled Grappler optimizer ($XDG_CACHE_HOME/tf_mpt when that is "
     "set). `tf-mpt cache` lists it; `tf-mpt cache --clear` empties it (all made again when "
     "next needed). The optimizer is kept there only if the directory is yours and not "
     "writable by others; otherwise it is built in a private temporary directory for the "
     "process, with one warning."),
    (TF_MPT_DUMP_DIR, "", "Directory; every rewrite writes the graph before and after "
     "(.pb and .pbtxt), the effective op lists and the report (JSON) there."),
)

_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_>]*$")


def _parse_op_names(variable, value):
    names = [part.strip() for part in value.split(",") if part.strip()]
    for name in names:
        if not _OP_NAME.match(name):
            raise ValueError(
                f"{variable} must be a comma-separated list of op type names such as "
                f"'MatMul,Tanh'. Received: {variable}={value!r} (bad entry {name!r})")
    return frozenset(names)


DEFAULT_COST_BATCH = 32
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_DTYPES = ("float16", "bfloat16", "auto")
_SESSION_REWRITES = ("grappler", "copy")
KERAS_MODES = ("rewrite", "policy")
STEP_TIMINGS = ("auto", "always", "off")
MEMORY_MODES = ("float32", "least", "any")
ALLREDUCE_DTYPES = ("float32", "float16", "bfloat16", "auto")


def _parse_bool(environ, variable):
    """True/False for a set variable, None when unset or empty."""
    value = environ.get(variable)
    if value is None or not value.strip():
        return None
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{variable} must be one of {', '.join(_TRUE + _FALSE)}. "
                     f"Received: {variable}={value!r}")


def _parse_choice(environ, variable, choices, default):
    """The lower-cased value of `variable` if it is one of `choices`, `default` when unset."""
    value = environ.get(variable, "").strip()
    if not value:
        return default
    if value.lower() not in choices:
        raise ValueError(f"{variable} must be one of {', '.join(choices)}. "
                         f"Received: {variable}={value!r}")
    return value.lower()


def _parse_cost_model(environ):
    """TF_MPT_COST_MODEL, the older name of TF_MPT_TARGET: 'auto', '1' (here) or '0' (rules).
    Still accepted; set, it is said once (a WARNING naming the TF_MPT_TARGET to use)."""
    value = environ.get(TF_MPT_COST_MODEL, "").strip().lower()
    if not value or value == "auto":
        return "auto"
    parsed = "1" if value in _TRUE else "0" if value in _FALSE else None
    if parsed is not None:
        from tf_mpt._process import state as _state  # pylint: disable=C0415
        _state.warn_once(("deprecated", TF_MPT_COST_MODEL),
                         "%s=%s is the older name of %s=%s; it still works. Set %s instead",
                         TF_MPT_COST_MODEL,
                         environ.get(TF_MPT_COST_MODEL).strip(), TF_MPT_TARGET,
                         {"1": _targets.HERE, "0": _targets.RULES}[parsed], TF_MPT_TARGET)
        return parsed
    raise ValueError(f"{TF_MPT_COST_MODEL} must be auto, or one of "
                     f"{', '.join(_TRUE + _FALSE)}. Received: {TF_MPT_COST_MODEL}="
                     f"{environ.get(TF_MPT_COST_MODEL)!r}")


_CPU_FLAG = re.compile(r"^[a-z0-9_]+$")


def _parse_target(environ):
    """TF_MPT_TARGET ('auto' when unset), with TF_MPT_COST_MODEL checked against it."""
    value = environ.get(TF_MPT_TARGET, "")
    if not value.strip():
        return _targets.AUTO
    target = _targets.parse(value, TF_MPT_TARGET)
    cost_model = _parse_cost_model(environ)
    implied = {"0": _targets.RULES, "1": _targets.HERE}.get(cost_model)
    if implied is not None and implied != target:
        raise ValueError(
            f"{TF_MPT_TARGET}={value!r} and {TF_MPT_COST_MODEL}={environ[TF_MPT_COST_MODEL]!r} "
            f"ask for different targets ({TF_MPT_COST_MODEL} is the older name: "
            f"{cost_model} means {TF_MPT_TARGET}={implied}). Unset {TF_MPT_COST_MODEL}.")
    return target


def _parse_cpu_flags(environ):
    """None when unset (read the real CPU), else the frozenset of flags given."""
    value = environ.get(TF_MPT_CPU_FLAGS)
    if value is None or not value.strip():
        return None
    flags = value.replace(",", " ").lower().split()
    for flag in flags:
        if not _CPU_FLAG.match(flag):
            raise ValueError(
                f"{TF_MPT_CPU_FLAGS} must be space-separated CPU flags as /proc/cpuinfo names "
                f"them, such as 'avx2' or 'avx512f avx512_bf16'. Received: "
                f"{TF_MPT_CPU_FLAGS}={value!r} (bad entry {flag!r})")
    return frozenset(flags)


def _parse_cost_batch(environ):
    value = environ.get(TF_MPT_COST_BATCH, "").strip()
    if not value:
        return DEFAULT_COST_BATCH
    if not value.isdigit():
        raise ValueError(f"{TF_MPT_COST_BATCH} must be a whole number >= 0 (the batch size the "
                         "cost model assumes where a graph leaves it unknown; 0: assume none). "
                         f"Received: {TF_MPT_COST_BATCH}={value!r}")
    return int(value)


DEFAULT_TIMING_BUDGET = 30.0


def _parse_timing_budget(environ):
    value = environ.get(TF_MPT_TIMING_BUDGET, "").strip()
    if not value:
        return DEFAULT_TIMING_BUDGET
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number < float("inf"):
        raise ValueError(f"{TF_MPT_TIMING_BUDGET} must be a number of seconds >= 0 (how long a "
                         "rewrite for this CPU may time its candidate graphs; 0: never). "
                         f"Received: {TF_MPT_TIMING_BUDGET}={value!r}")
    return number


def _parse_memory_price(environ, memory):
    value = environ.get(TF_MPT_MEMORY_PRICE, "").strip()
    if not value:
        return 0.0
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number <= 1:
        raise ValueError(f"{TF_MPT_MEMORY_PRICE} must be a number from 0 to 1: the share of "
                         "float32's speed a timed graph may give up to hold within 0.65x of "
                         "float32's peak memory (0.1: up to 10% slower; 0: never slower). "
                         f"Received: {TF_MPT_MEMORY_PRICE}={value!r}")
    if number and memory == "any":
        raise ValueError(f"{TF_MPT_MEMORY_PRICE}={value!r} has no effect with "
                         f"{TF_MPT_MEMORY}=any (the fastest colouring is kept whatever it "
                         f"holds). Unset {TF_MPT_MEMORY_PRICE}, or set {TF_MPT_MEMORY} to "
                         "float32 or least.")
    return number


def _parse_loss_scale(environ):
    value = environ.get(TF_MPT_LOSS_SCALE, "").strip()
    if not value or value.lower() == "dynamic":
        return "dynamic"
    try:
        number = float(value)
    except ValueError:
        number = None
    if number is None or not number > 0 or number == float("inf"):
        raise ValueError(f"{TF_MPT_LOSS_SCALE} must be 'dynamic' or a positive finite number "
                         f"such as 128. Received: {TF_MPT_LOSS_SCALE}={value!r}")
    return number


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything tf_mpt reads from the environment, parsed once.

    Attributes:
        list_add: tuple of (list name, frozenset of op names) from TF_MPT_*LIST_ADD.
        list_remove: tuple of (list name, frozenset of op names) from TF_MPT_*LIST_REMOVE.
        dump_dir: directory for TF_MPT_DUMP_DIR dumps, or None.
        enable: TF_MPT_ENABLE.
        graph_rewrite: the rewrite switch, resolved (an explicit TF_MPT_GRAPH_REWRITE wins).
        loss_scaling: True/False if TF_MPT_LOSS_SCALING is set, else None (see
            `loss_scaling_for`).
        dtype: 'float16', 'bfloat16' or 'auto'.
        loss_scale: 'dynamic' or a positive float.
        target: 'auto', 'here', 'rules' or the absolute path of a cost table (TF_MPT_TARGET;
            see tf_mpt.targets).
        cost_model: 'auto', '1' or '0' (TF_MPT_COST_MODEL, an alias of the target).
        cpu_flags: frozenset of CPU flags from TF_MPT_CPU_FLAGS, or None (the real CPU's).
        session_rewrite: 'grappler' or 'copy' (TF_MPT_SESSION_REWRITE).
        cache_dir: TF_MPT_CACHE_DIR, or None (the default cache directory).
        op_costs: TF_MPT_OP_COSTS (a file of op costs), or None (measured on this CPU).
        cost_batch: TF_MPT_COST_BATCH, the batch size the cost model assumes for a leading
            dimension the graph leaves unknown (0: none; such sizes stay unknown).
        allreduce_dtype: 'float32', 'float16', 'bfloat16' or 'auto' (TF_MPT_ALLREDUCE_DTYPE).
        keras: 'rewrite' or 'policy' (TF_MPT_KERAS).
        step_timing: 'auto', 'always' or 'off' (TF_MPT_STEP_TIMING).
        timing_budget: TF_MPT_TIMING_BUDGET, seconds of graph timing per graph (0: none).
        dispatch_check: TF_MPT_DISPATCH_CHECK, whether slow and inaccurate half kernels are
            checked for.
        memory: 'float32', 'least' or 'any' (TF_MPT_MEMORY): whether graph timing keeps a
            colouring whose step peak is over float32's; least: the one holding least of
            those not slower than float32.
        memory_price: TF_MPT_MEMORY_PRICE, the share of float32's speed a timed graph may
            give up to hold within policy.smaller_above of float32's peak (0: none).
    """
    list_add: tuple = ()
    list_remove: tuple = ()
    dump_dir: str = None
    enable: bool = False
    graph_rewrite: bool = False
    loss_scaling: typing.Optional[bool] = None
    dtype: str = "auto"
    loss_scale: typing.Union[str, float] = "dynamic"
    target: str = "auto"
    cost_model: str = "auto"
    cpu_flags: typing.Optional[frozenset] = None
    session_rewrite: str = "grappler"
    cache_dir: typing.Optional[str] = None
    op_costs: typing.Optional[str] = None
    cost_batch: int = DEFAULT_COST_BATCH
    allreduce_dtype: str = "float32"
    keras: str = "rewrite"
    step_timing: str = "auto"
    timing_budget: float = DEFAULT_TIMING_BUDGET
    dispatch_check: bool = True
    memory: str = "float32"
    memory_price: float = 0.0

    @classmethod
    def from_env(cls, environ):
        """Parses a mapping of environment variables (e.g. os.environ or a dict)."""
        add, remove = [], []
        for list_name in _lists.LIST_NAMES:
            for suffix, target in (("ADD", add), ("REMOVE", remove)):
                variable = f"TF_MPT_{list_name.upper()}LIST_{suffix}"
                value = environ.get(variable, "")
                ops = _parse_op_names(variable, value)
                if ops:
                    target.append((list_name, ops))
        dump_dir = environ.get(TF_MPT_DUMP_DIR, "").strip() or None
        enable = bool(_parse_bool(environ, TF_MPT_ENABLE))
        graph_rewrite = _parse_bool(environ, TF_MPT_GRAPH_REWRITE)
        loss_scaling = _parse_bool(environ, TF_MPT_LOSS_SCALING)
        memory = _parse_choice(environ, TF_MPT_MEMORY, MEMORY_MODES, "float32")
        return cls(list_add=tuple(add), list_remove=tuple(remove), dump_dir=dump_dir,
                   enable=enable,
                   graph_rewrite=enable if graph_rewrite is None else graph_rewrite,
                   loss_scaling=loss_scaling,
                   dtype=_parse_choice(environ, TF_MPT_DTYPE, _DTYPES, "auto"),
                   loss_scale=_parse_loss_scale(environ),
                   target=_parse_target(environ),
                   cost_model=_parse_cost_model(environ),
                   cpu_flags=_parse_cpu_flags(environ),
                   session_rewrite=_parse_choice(environ, TF_MPT_SESSION_REWRITE,
                                                 _SESSION_REWRITES, "grappler"),
                   cache_dir=environ.get(TF_MPT_CACHE_DIR, "").strip() or None,
                   op_costs=environ.get(TF_MPT_OP_COSTS, "").strip() or None,
                   cost_batch=_parse_cost_batch(environ),
                   allreduce_dtype=allreduce_dtype_from_env(environ),
                   keras=_parse_choice(environ, TF_MPT_KERAS, KERAS_MODES, "rewrite"),
                   step_timing=_parse_choice(environ, TF_MPT_STEP_TIMING, STEP_TIMINGS,
                                             "auto"),
                   timing_budget=_parse_timing_budget(environ),
                   dispatch_check=_parse_bool(environ, TF_MPT_DISPATCH_CHECK) is not False,
                   memory=memory,
                   memory_price=_parse_memory_price(environ, memory))

    def loss_scaling_for(self, dtype):
        """Whether the automatic path scales the loss for `dtype` ('float16'/'bfloat16').

        An explicit TF_MPT_LOSS_SCALING wins; otherwise on with TF_MPT_ENABLE for float16
        (small gradients underflow) and off for bfloat16 (float32's exponent range).
        """
        if self.loss_scaling is not None:
            return self.loss_scaling
        return self.enable and dtype == "float16"

    def __post_init__(self):
        object.__setattr__(self, "target", _targets.parse(self.target, "Config.target"))

    def resolve_dtype(self, gpu_visible, native_bfloat16):
        """The half dtype to use, or None (auto found no fast half type: stay float32)."""
        if self.dtype != "auto":
            return self.dtype
        if gpu_visible:
            return "float16"
        if native_bfloat16:
            return "bfloat16"
        return None

    @property
    def cache_directory(self):
        """Where this CPU's caches are: TF_MPT_CACHE_DIR, else default_cache_dir()."""
        return self.cache_dir or default_cache_dir()

    def lists_for(self, dtype):
        """Returns the default lists for `dtype` with this config's ADD/REMOVE edits applied."""
        base = _lists.default_lists(dtype)
        if not self.list_add and not self.list_remove:
            return base
        return base.edited(add=dict(self.list_add), remove=dict(self.list_remove))


def default_cache_dir():
    """$XDG_CACHE_HOME/tf_mpt, or ~/.cache/tf_mpt (where TF_MPT_CACHE_DIR is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tf_mpt")


def any_switch_on(environ):
    """Whether TF_MPT_ENABLE, TF_MPT_GRAPH_REWRITE or TF_MPT_LOSS_SCALING is on (only these
    are parsed; a bad value of one of them raises ValueError)."""
    return any(_parse_bool(environ, v)
               for v in (TF_MPT_ENABLE, TF_MPT_GRAPH_REWRITE, TF_MPT_LOSS_SCALING))


def allreduce_dtype_from_env(environ):
    """TF_MPT_ALLREDUCE_DTYPE alone ('float32' when unset); ValueError for a bad value."""
    return _parse_choice(environ, TF_MPT_ALLREDUCE_DTYPE, ALLREDUCE_DTYPES, "float32")


def env_var_table_markdown():
    """The README's env-var table, generated from ENV_VARS (a test keeps README in step)."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {default or '(unset)'} | {meaning} |"
             for name, default, meaning in ENV_VARS]
    return "\n".join(rows)
