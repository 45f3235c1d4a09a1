"""Property-based fuzzing: random float32 graphs, rewritten to float16 and bfloat16.

Hypothesis draws a *recipe* (`Recipe`): 1-3 float32 placeholders of shape [8, 8], 0-2 float32
constants of that shape, a seed for their values and the feeds, and up to MAX_STEPS steps.
Each step applies one entry of `OP_TABLE` (allow, infer, deny, clear and unlisted ops, existing
Casts, a control dependency, a library function call) to earlier tensors and adds one [8, 8]
float32 tensor; about one step in ten is built inside `tf_mpt.keep_fp32()`. Node names come
from the recipe alone (`x0`, `c1`, `s3_MatMul/...`; a constant may take the name tf_mpt would
give a Cast), so a failing example that hypothesis prints names the same nodes on every run
(library functions carry TensorFlow's counters in their names).

Control-flow recipes (`recipes(max_depth=...)`) also have *blocks* (`Block`): a step that runs
sub-recipes, over a pool of its own starting with the block's inputs, in
    a while loop:  h <- body(h, *other inputs), 1-3 times;
    a cond:        one of two bodies, chosen by the parity of an int32 counter;
    a call:        a tf.function of the body, called once or twice (the second call reads the
                   first one's output), so a library function may have two callers;
and bodies hold blocks in turn, up to MAX_DEPTH deep (a cond in a loop in a function call).
The counter is the fed int32 scalar `k`, plus the iteration number inside loops; it is exact
in every dtype, so the float32 and the half graph always take the same branch. A recipe is
built either in a tf.Graph with control flow v1 (Enter/Switch/Merge/NextIteration/Exit; a call
is a PartitionedCall whose function has functional While/If inside) or *traced*: as the
graph_def of a tf.function, where every loop and cond is a functional While/If whose bodies
are library functions.

Every step keeps its output within [-BOUND, BOUND] whenever its inputs are (inputs are
uniform in [-1, 1]), so float16 cannot overflow, and loops stay bounded at every iteration;
the comparison with float32 uses the shared TOLERANCES unchanged.

Each graph is rewritten to both half dtypes (strict=True, so an internal error fails instead of
returning the input) with the default fetches and, when the recipe asks for it, with explicit
fetches. Structure is checked first, in the main graph and in every library function (input
not mutated, node names and ops kept, library functions and their signatures kept but for
values a While or call takes across in half, each function's copy for one caller made the
documented way, added Casts named `*-TfMpt`, fetched and opted-out nodes untouched, no round
trip, one Cast per (tensor, dtype), idempotence), then numbers (imports, runs, fetched dtypes
and shapes kept, values within tolerance of the float32 graph).

Profiles (environment variable TF_MPT_FUZZ_PROFILE):
    ci (default): 300 straight-line and CONTROL_FLOW_EXAMPLES['ci'] control-flow graphs,
        derandomized (the same graphs on every run), each test under a minute on 2 cores.
    thorough: 10,000 straight-line graphs (about 25 minutes on 2 cores) and
        CONTROL_FLOW_EXAMPLES['thorough'] control-flow graphs (about 10 minutes):
        TF_MPT_FUZZ_PROFILE=thorough python -m pytest tests/integration/test_fuzz.py
    A thorough failure prints a `@reproduce_failure` blob that replays it.
"""

import contextlib
import dataclasses
import os
import typing

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import op_def_pb2
from tensorflow.core.protobuf import rewriter_config_pb2

import tf_mpt
from support.tolerances import HALF_DTYPES, TOLERANCES

tf1 = tf.compat.v1

SHAPE = (8, 8)
BOUND = 2.0  # every tensor of a fuzz graph lies in [-BOUND, BOUND]
MAX_PLACEHOLDERS = 3
# Names the constants may get: plain, or a decoy taking the name tf_mpt gives the Cast of x0
# (which every graph has), so the rewrite must pick another name.
CONSTANT_NAMES = (
    ("c0", "x0-0-CastToFp16-TfMpt", "x0-0-CastToBf16-TfMpt"),
    ("c1", "x0-0-CastToFp16-1-TfMpt"),
)
MAX_STEPS = 24
KEEP_FP32_ONE_IN = 10  # about one step in ten is opted out with tf_mpt.keep_fp32()
ALLOW_ONE_IN = 5  # one step in five is an allow op, so most graphs have something to convert
CAST_SUFFIX = "-TfMpt"
KEEP_FP32_ATTR = "_tf_mpt_keep_fp32"
# Control-flow recipes: fewer steps per level, as blocks multiply the graph's size.
MAX_CONTROL_FLOW_STEPS = 8
MAX_BODY_STEPS = 3
MAX_DEPTH = 3  # blocks nest up to three deep
# One top-level step in two is a block, one body step in four: of the graphs, about half nest
# blocks three deep, a fifth two deep, a sixth one deep, and an eighth have none.
TOP_BLOCK_ONE_IN = 2
BODY_BLOCK_ONE_IN = 4
MAX_BLOCK_INPUTS = 3
# Loop iterations and calls of a block; few, as rounding errors compound with each.
MAX_TRIPS = {"while": 3, "cond": 1, "call": 2}
COUNTER = "k"  # the fed int32 scalar that chooses cond branches
WHILE_OPS = ("While", "StatelessWhile")
# Nodes that may take values across into the functions they call in half: op -> its function
# attrs, in the order tf_mpt numbers copies of shared functions.
BOUNDARY_FUNCTION_ATTRS = {
    "While": ("body", "cond"), "StatelessWhile": ("body", "cond"),
    "PartitionedCall": ("f",), "StatefulPartitionedCall": ("f",),
    "If": ("then_branch", "else_branch"), "StatelessIf": ("then_branch", "else_branch"),
    "Case": ("branches",), "StatelessCase": ("branches",),
}
SPECIALISED = "_tf_mpt_call_"  # <function>_tf_mpt_call_<node>_<k>: a copy for one caller
RUN_TIMEOUT_MS = 60_000  # a rewritten loop that never ends fails instead of hanging the test

PROFILE_ENV_VAR = "TF_MPT_FUZZ_PROFILE"
_COMMON = dict(deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=300, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=10_000, print_blob=True, **_COMMON)
# A control-flow graph is several times larger than a straight-line one, and slower to trace.
CONTROL_FLOW_EXAMPLES = {"ci": 120, "thorough": 2_000}


def _fuzz_profile():
    """The profile named by TF_MPT_FUZZ_PROFILE (default 'ci')."""
    name = os.environ.get(PROFILE_ENV_VAR, "ci")
    if name not in ("ci", "thorough"):
        raise ValueError(f"{PROFILE_ENV_VAR}={name!r}; use 'ci' (default) or 'thorough'.")
    return name


FUZZ_PROFILE = _fuzz_profile()
FUZZ_SETTINGS = settings.get_profile(FUZZ_PROFILE)
CONTROL_FLOW_SETTINGS = settings(FUZZ_SETTINGS,
                                 max_examples=CONTROL_FLOW_EXAMPLES[FUZZ_PROFILE])


# --- the op table ------------------------------------------------------------------------------

def _const(value):
    return tf.constant(value, tf.float32)


def _scaled(tensor, factor):
    return tensor * _const(factor)


def _to_4d(tensor):
    return tf.reshape(tensor, [1, 8, 8, 1])


def _from_4d(tensor):
    return tf.reshape(tensor, SHAPE)


def _conv2d(a, b):
    """[1, 4, 4, 4] image * [2, 2, 4, 4] filter: 16 products of terms <= BOUND, / 32."""
    image = tf.reshape(a, [1, 4, 4, 4])
    kernel = tf.reshape(b, [2, 2, 4, 4])
    return _scaled(tf.reshape(tf.nn.conv2d(image, kernel, 1, "SAME"), SHAPE), 1 / 32)


def _cast_through_int32(a):
    """An existing Cast pair: quantises to steps of 1/1024, far below every tolerance."""
    as_int = tf.cast(_scaled(a, 1024.0), tf.int32)
    return _scaled(tf.cast(as_int, tf.float32), 1 / 1024)


def _round_trip_cast(dtype):
    """An existing float32 -> `dtype` -> float32 Cast pair (rounds to `dtype` once)."""
    return lambda a: tf.cast(tf.cast(a, dtype), tf.float32)


def _after_control_input(a, b):
    """Identity of a that runs after b: a node with a control input."""
    with tf.control_dependencies([b]):
        return tf.identity(a)


def _fused_batch_norm(a):
    """Inference batch norm (mean 0, variance 1): x in half, statistics in float32 (attr U)."""
    channels = 4
    y, _, _ = tf1.nn.fused_batch_norm(
        tf.reshape(a, [1, 4, 4, channels]), scale=_const(np.linspace(0.25, 0.75, channels)),
        offset=_const(np.linspace(-0.25, 0.25, channels)), mean=_const(np.zeros(channels)),
        variance=_const(np.ones(channels)), is_training=False)
    return tf.reshape(y, SHAPE)


@tf.function
def _library_function(a):
    return tf.tanh(a) * 0.5


def _clip_by_value(a):
    return tf.raw_ops.ClipByValue(t=a, clip_value_min=_const(-0.5), clip_value_max=_const(0.5))


def _with_row_reduction(reduce_fn, factor=1.0):
    """(a + factor * reduce_fn(b) broadcast) / 2: a binary op through a reduction."""
    def build(a, b):
        return _scaled(a + _scaled(reduce_fn(b), factor), 0.5)
    return build


class OpSpec(typing.NamedTuple):
    """One fuzz op: `build(*tensors)` maps `arity` [8, 8] tensors to one [8, 8] tensor."""
    name: str
    arity: int
    build: typing.Callable


# Each builder maps inputs in [-BOUND, BOUND] into [-BOUND, BOUND]; the comment names the bound
# where it is not obvious. `name` is the op type the entry exists for.
OP_TABLE = (
    # allow
    OpSpec("MatMul", 2, lambda a, b: tf.tanh(_scaled(tf.matmul(a, b), 0.25))),
    OpSpec("BatchMatMulV2", 2, lambda a, b: _scaled(  # 8 products <= 4, / 16
        tf.reshape(tf.linalg.matmul(tf.reshape(a, [2, 4, 8]), b), SHAPE), 1 / 16)),
    OpSpec("Einsum", 2, lambda a, b: tf.tanh(_scaled(tf.einsum("ij,kj->ik", a, b), 0.25))),
    OpSpec("Conv2D", 2, _conv2d),
    # infer
    OpSpec("Add", 2, lambda a, b: _scaled(tf.raw_ops.Add(x=a, y=b), 0.5)),
    OpSpec("AddV2", 2, lambda a, b: _scaled(a + b, 0.5)),
    OpSpec("AddN", 3, lambda a, b, c: _scaled(tf.add_n([a, b, c]), 1 / 3)),
    OpSpec("Sub", 2, lambda a, b: _scaled(a - b, 0.5)),
    OpSpec("Mul", 2, lambda a, b: a * _scaled(b, 0.5)),
    OpSpec("RealDiv", 2, lambda a, b: a / (tf.abs(b) + _const(1.0))),
    OpSpec("Reciprocal", 1, lambda a: tf.math.reciprocal(tf.abs(a) + _const(1.0))),
    OpSpec("Tanh", 1, tf.tanh),
    OpSpec("Sigmoid", 1, tf.sigmoid),
    OpSpec("Softplus", 1, lambda a: _scaled(tf.nn.softplus(a), 0.5)),  # softplus(2) = 2.13
    OpSpec("Softsign", 1, tf.nn.softsign),
    OpSpec("Elu", 1, tf.nn.elu),
    OpSpec("Selu", 1, lambda a: _scaled(tf.nn.selu(a), 0.5)),  # |selu| <= 2.11 on [-2, 2]
    OpSpec("LeakyRelu", 1, lambda a: tf.nn.leaky_relu(a, alpha=0.2)),
    OpSpec("Softmax", 1, tf.nn.softmax),
    OpSpec("LogSoftmax", 1, lambda a: _scaled(tf.nn.log_softmax(a), 0.25)),  # >= -6.08 / 4
    OpSpec("BiasAdd", 2, lambda a, b: _scaled(tf.nn.bias_add(a, b[0]), 0.5)),
    OpSpec("Mean", 2, _with_row_reduction(lambda b: tf.reduce_mean(b, 1, keepdims=True))),
    OpSpec("Sum", 2, _with_row_reduction(lambda b: tf.reduce_sum(b, 0, keepdims=True), 1 / 8)),
    OpSpec("Prod", 2, _with_row_reduction(
        lambda b: tf.reduce_prod(_scaled(b, 0.5), 1, keepdims=True))),
    OpSpec("Square", 1, lambda a: _scaled(tf.square(a), 0.25)),
    OpSpec("SquaredDifference", 2, lambda a, b: _scaled(tf.math.squared_difference(a, b), 1 / 8)),
    OpSpec("Sqrt", 1, lambda a: tf.sqrt(tf.abs(a) + _const(1.0))),
    OpSpec("Log", 1, lambda a: tf.math.log(tf.abs(a) + _const(1.0))),
    OpSpec("Log1p", 1, lambda a: tf.math.log1p(tf.abs(a))),
    OpSpec("Rsqrt", 1, lambda a: tf.math.rsqrt(tf.abs(a) + _const(1.0))),
    OpSpec("Erf", 1, tf.math.erf),
    OpSpec("FusedBatchNormV3", 1, _fused_batch_norm),  # |a| * 0.75 + 0.25
    OpSpec("AvgPool", 1, lambda a: _from_4d(tf.nn.avg_pool2d(_to_4d(a), 2, 1, "SAME"))),
    # deny
    OpSpec("Exp", 1, lambda a: _scaled(tf.exp(tf.tanh(a)), 0.5)),  # e / 2
    OpSpec("Pow", 2, lambda a, b: _scaled(  # (|a| + 1) ** tanh(b) <= 3
        tf.pow(tf.abs(a) + _const(1.0), tf.tanh(b)), 0.5)),
    # clear
    OpSpec("Relu", 1, tf.nn.relu),
    OpSpec("Relu6", 1, lambda a: _scaled(tf.nn.relu6(_scaled(a, 4.0)), 0.25)),
    OpSpec("Abs", 1, tf.abs),
    OpSpec("Neg", 1, tf.negative),
    OpSpec("Maximum", 2, tf.maximum),
    OpSpec("Minimum", 2, tf.minimum),
    OpSpec("Identity", 1, tf.identity),
    OpSpec("ControlDependency", 2, _after_control_input),
    OpSpec("IdentityN", 2, lambda a, b: tf.identity_n([a, b])[1]),  # output 0 unread
    OpSpec("Reshape", 1, lambda a: tf.reshape(tf.transpose(tf.reshape(a, [4, 16])), SHAPE)),
    OpSpec("Transpose", 1, tf.transpose),
    OpSpec("ConcatV2", 2, lambda a, b: tf.slice(tf.concat([a, b], 1), [0, 4], list(SHAPE))),
    OpSpec("Tile", 1, lambda a: tf.slice(tf.tile(a, [2, 1]), [3, 0], list(SHAPE))),
    OpSpec("Pad", 1, lambda a: tf.slice(tf.pad(a, [[1, 1], [1, 1]]), [0, 2], list(SHAPE))),
    OpSpec("Pack", 2, lambda a, b: tf.unstack(tf.stack([a, b]))[1]),
    OpSpec("Split", 1, lambda a: tf.concat(tf.split(a, 2, axis=1)[::-1], axis=1)),
    OpSpec("StridedSlice", 1, lambda a: a[::-1, :]),
    OpSpec("ReverseV2", 1, lambda a: tf.reverse(a, [1])),
    OpSpec("GatherV2", 1, lambda a: tf.gather(a, [3, 1, 4, 0, 5, 2, 7, 6])),
    OpSpec("Select", 2, lambda a, b: tf1.where(a > b, a, b)),  # max(a, b): continuous
    OpSpec("SelectV2", 2, lambda a, b: tf.where(a < b, a, b)),  # min(a, b): continuous
    OpSpec("ClipByValue", 1, _clip_by_value),
    OpSpec("Max", 2, _with_row_reduction(lambda b: tf.reduce_max(b, 1, keepdims=True))),
    OpSpec("Min", 2, _with_row_reduction(lambda b: tf.reduce_min(b, 0, keepdims=True))),
    OpSpec("ExpandDims", 1, lambda a: tf.squeeze(tf.expand_dims(a, 0), [0])),
    OpSpec("MaxPool", 1, lambda a: _from_4d(tf.nn.max_pool2d(_to_4d(a), 2, 1, "SAME"))),
    # on no list
    OpSpec("Cumsum", 1, lambda a: _scaled(tf.math.cumsum(a, axis=1), 1 / 8)),
    OpSpec("Cast", 1, _cast_through_int32),
    OpSpec("CastFloat16", 1, _round_trip_cast(tf.float16)),
    OpSpec("CastBfloat16", 1, _round_trip_cast(tf.bfloat16)),
    OpSpec("PartitionedCall", 1, _library_function),  # a call of a library function
)
OPS_BY_NAME = {spec.name: spec for spec in OP_TABLE}
ALLOW_ENTRIES = tuple(spec for spec in OP_TABLE if spec.name in tf_mpt.FLOAT16_LISTS.allow)
# Entries that exist for a structure, not for an op type of their own name.
STRUCTURE_ENTRIES = {"ControlDependency": "Identity", "CastFloat16": "Cast",
                     "CastBfloat16": "Cast"}
UNLISTED_OPS = ("Cumsum", "Cast", "PartitionedCall")
MIN_LISTED_OP_TYPES = 30


# --- recipes and graphs ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Step:
    """One op of a recipe.

    Attributes:
        op: the name of an OP_TABLE entry.
        operands: indices into the tensor pool.
        keep_fp32: build the step inside `tf_mpt.keep_fp32()` (opted out of the rewrite).
    """
    op: str
    operands: tuple
    keep_fp32: bool = False


@dataclasses.dataclass(frozen=True)
class Block:
    """A step that runs sub-recipes in a loop, a cond or a library function.

    Each body is a tuple of steps (Step or Block) over a pool of its own that starts with the
    block's inputs (`operands`); its output is the last tensor of that pool.

    Attributes:
        kind: 'while' (h <- bodies[0](h, *other inputs), `trips` times, h the first input),
            'cond' (bodies[0] when the counter's parity is `parity`, else bodies[1]) or 'call'
            (a tf.function of bodies[0], called `trips` times; a call after the first reads the
            previous call's output as its first input).
        operands: indices into the tensor pool: the block's inputs.
        bodies: one body, or two for a cond.
        trips: loop iterations or calls.
        parity: for a cond, the counter parity that takes bodies[0].
        keep_fp32: build the block inside `tf_mpt.keep_fp32()`.
    """
    kind: str
    operands: tuple
    bodies: tuple
    trips: int = 1
    parity: int = 0
    keep_fp32: bool = False


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A random graph: the pool starts with placeholders, then constants, then step outputs.

    Attributes:
        placeholders: number of placeholders (x0, x1, ...).
        constants: names of the [8, 8] constants (see CONSTANT_NAMES).
        steps: the steps (Step or Block), in order.
        seed: seeds the constants' values and the feeds.
        fetches: indices into the tensor pool of tensors that are also passed as explicit
            fetches (empty: only the default fetches are tested).
        fetch_by_node: pass the explicit fetches as node names instead of tensor names.
        traced: build the graph as the graph_def of a tf.function (functional While/If)
            instead of in a tf.Graph with control flow v1.
    """
    placeholders: int
    constants: tuple
    steps: tuple
    seed: int
    fetches: tuple = ()
    fetch_by_node: bool = False
    traced: bool = False

    @property
    def has_blocks(self):
        return any(isinstance(step, Block) for step in self.steps)


@dataclasses.dataclass
class BuiltGraph:
    """A recipe turned into a GraphDef, its feeds, the names of its pool tensors and the name
    scopes of its (top-level) blocks."""
    graph_def: typing.Any
    feeds: dict
    pool: list
    block_scopes: tuple


def _draw_operands(draw, pool_size, count):
    # Operands count back from the newest tensor, so examples shrink towards chains.
    return tuple(pool_size - 1 - draw(st.integers(0, pool_size - 1)) for _ in range(count))


def _draw_steps(draw, pool_size, max_steps, depth, block_one_in=TOP_BLOCK_ONE_IN):
    """Steps over a pool of `pool_size` tensors; blocks nest at most `depth` levels."""
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        if depth > 0 and draw(st.integers(0, block_one_in - 1)) == 0:
            steps.append(_draw_block(draw, pool_size, depth))
        else:
            from_allow = draw(st.integers(0, ALLOW_ONE_IN - 1)) == 0
            spec = draw(st.sampled_from(ALLOW_ENTRIES if from_allow else OP_TABLE))
            operands = _draw_operands(draw, pool_size, spec.arity)
            keep_fp32 = draw(st.integers(0, KEEP_FP32_ONE_IN - 1)) == 0
            steps.append(Step(spec.name, operands, keep_fp32))
        pool_size += 1
    return tuple(steps)


def _draw_block(draw, pool_size, depth):
    kind = draw(st.sampled_from(BLOCK_KINDS))
    operands = _draw_operands(draw, pool_size, draw(st.integers(1, MAX_BLOCK_INPUTS)))
    bodies = tuple(_draw_steps(draw, len(operands), MAX_BODY_STEPS, depth - 1, BODY_BLOCK_ONE_IN)
                   for _ in range(2 if kind == "cond" else 1))
    trips = draw(st.integers(1, MAX_TRIPS[kind]))
    parity = draw(st.integers(0, 1)) if kind == "cond" else 0
    keep_fp32 = draw(st.integers(0, KEEP_FP32_ONE_IN - 1)) == 0
    return Block(kind, operands, bodies, trips, parity, keep_fp32)


@st.composite
def recipes(draw, max_steps=MAX_STEPS, max_depth=0):
    """Hypothesis strategy for Recipe; max_depth > 0 gives control-flow recipes."""
    placeholders = draw(st.integers(1, MAX_PLACEHOLDERS))
    constants = tuple(draw(st.sampled_from(names))
                      for names in CONSTANT_NAMES[:draw(st.integers(0, len(CONSTANT_NAMES)))])
    steps = _draw_steps(draw, placeholders + len(constants), max_steps, max_depth)
    pool_size = placeholders + len(constants) + len(steps)
    traced = max_depth > 0 and draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    if not draw(st.booleans()):
        return Recipe(placeholders, constants, steps, seed, traced=traced)
    fetches = draw(st.sets(st.integers(0, pool_size - 1), min_size=1, max_size=4))
    return Recipe(placeholders, constants, steps, seed, tuple(sorted(fetches)),
                  draw(st.booleans()), traced)


def _uniform(rng):
    return rng.uniform(-1.0, 1.0, SHAPE).astype(np.float32)


def _while_block(block, inputs, counter):
    def body(i, h):
        return i + 1, _build_steps(block.bodies[0], [h, *inputs[1:]], counter + i)
    return tf.while_loop(lambda i, h: i < block.trips, body, [tf.constant(0), inputs[0]])[1]


def _cond_block(block, inputs, counter):
    def branch(steps):
        return lambda: _build_steps(steps, list(inputs), counter)
    taken = tf.equal(tf.math.floormod(counter, 2), block.parity)
    return tf.cond(taken, branch(block.bodies[0]), branch(block.bodies[1]))


def _call_block(block, inputs, counter):
    @tf.function(autograph=False)
    def called(*args):
        return _build_steps(block.bodies[0], list(args[:-1]), args[-1])

    out = called(*inputs, counter)
    for _ in range(block.trips - 1):
        out = called(out, *inputs[1:], counter)
    return out


BLOCK_BUILDERS = {"while": _while_block, "cond": _cond_block, "call": _call_block}
BLOCK_KINDS = tuple(BLOCK_BUILDERS)


def _scope(k, step):
    return f"s{k}_{step.kind if isinstance(step, Block) else step.op}"


def _build_steps(steps, pool, counter):
    """Appends each step's output to `pool` (a list of tensors) and returns the last one."""
    for k, step in enumerate(steps):
        with tf.name_scope(_scope(k, step)), _maybe_keep_fp32(step.keep_fp32):
            inputs = [pool[i] for i in step.operands]
            if isinstance(step, Block):
                out = BLOCK_BUILDERS[step.kind](step, inputs, counter)
            else:
                out = OPS_BY_NAME[step.op].build(*inputs)
        assert out.dtype == tf.float32 and out.shape == SHAPE, (step, out)
        pool.append(out)
    return pool[-1]


def build_graph(recipe):
    """Builds the recipe's graph: in a fresh tf.Graph, or traced (see Recipe.traced).

    Args:
        recipe: a Recipe.

    Returns:
        BuiltGraph.
    """
    rng = np.random.RandomState(recipe.seed)
    feeds = {f"x{k}:0": _uniform(rng) for k in range(recipe.placeholders)}
    constants = {name: _uniform(rng) for name in recipe.constants}
    specs = [tf.TensorSpec(SHAPE, tf.float32, name=f"x{k}") for k in range(recipe.placeholders)]
    if recipe.has_blocks:
        feeds[f"{COUNTER}:0"] = np.int32(rng.randint(0, 4))
        specs.append(tf.TensorSpec([], tf.int32, name=COUNTER))
    pool = []

    def build(*args):
        pool.extend(args[:recipe.placeholders])
        pool.extend(tf.constant(value, name=name) for name, value in constants.items())
        counter = args[recipe.placeholders] if recipe.has_blocks else None
        return _build_steps(recipe.steps, pool, counter)

    if recipe.traced:
        graph = tf.function(build, autograph=False).get_concrete_function(*specs).graph
    else:
        with _control_flow_v1(), tf.Graph().as_default() as graph:
            build(*(tf1.placeholder(s.dtype, s.shape, name=s.name) for s in specs))
    block_scopes = tuple(f"{_scope(k, step)}/" for k, step in enumerate(recipe.steps)
                         if isinstance(step, Block))
    return BuiltGraph(graph.as_graph_def(), feeds, [t.name for t in pool], block_scopes)


@contextlib.contextmanager
def _control_flow_v1():
    """Loops and conds built inside are v1 (the TF2 default is v2 even in a tf.Graph).

    The switch is global: it is restored on exit so no other test sees it.
    """
    was_v2 = tf1.control_flow_v2_enabled()
    tf1.disable_control_flow_v2()
    try:
        yield
    finally:
        if was_v2:
            tf1.enable_control_flow_v2()


def _maybe_keep_fp32(keep):
    return tf_mpt.keep_fp32() if keep else contextlib.nullcontext()


def all_ops_recipe():
    """A recipe that applies every OP_TABLE entry once, each to the previous output."""
    steps = []
    for spec in OP_TABLE:
        previous = 1 + len(steps)  # the last pool entry (x1 for the first step)
        operands = (previous,) + tuple(range(spec.arity - 1))
        steps.append(Step(spec.name, operands))
    return Recipe(placeholders=2, constants=(), steps=tuple(steps), seed=0,
                  fetches=(2 + len(steps) // 2,))


# --- helpers over GraphDefs --------------------------------------------------------------------

def _node_of(tensor_name):
    """'a:1' -> 'a', '^a' -> 'a', 'a' -> 'a'; in a function body 'a:output:0' -> 'a'."""
    return tensor_name.lstrip("^").split(":")[0]


def _canonical_tensor(tensor_name):
    """'a' -> 'a:0'; 'a:1' -> 'a:1'; 'a:output:0' -> 'a:output:0'."""
    head, sep, tail = tensor_name.rpartition(":")
    return tensor_name if sep and tail.isdigit() else f"{tensor_name}:0"


def _graphs(graph_def):
    """{None: the main graph's nodes by name, function name: its body's nodes by name}."""
    graphs = {None: {node.name: node for node in graph_def.node}}
    for fdef in graph_def.library.function:
        graphs[fdef.signature.name] = {node.name: node for node in fdef.node_def}
    return graphs


def _where(function):
    return "main graph" if function is None else f"function {function}"


def _serialize(graph_def):
    return graph_def.SerializeToString(deterministic=True)


def _import(graph_def):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return graph


def _sink_nodes(graph_def):
    """Names of the nodes with no data consumer (the default fetches), in GraphDef order."""
    consumed = {_node_of(i) for node in graph_def.node for i in node.input
                if not i.startswith("^")}
    return [node.name for node in graph_def.node if node.name not in consumed]


def _default_fetch_tensors(built):
    """Every output of every node with no data consumer, except placeholders (fed) and nodes
    inside a block other than its output: a Session cannot fetch a tensor of a v1 loop (set
    once per iteration) or of a v1 cond (dead in the branch not taken)."""
    graph = _import(built.graph_def)
    outputs = {_node_of(t) for t in built.pool}
    names = [name for name in _sink_nodes(built.graph_def)
             if name in outputs or not name.startswith(built.block_scopes)]
    operations = [graph.get_operation_by_name(name) for name in names]
    return [t.name for op in operations if op.type != "Placeholder" for t in op.outputs]


def _run(graph_def, fetches, feeds):
    """Imports `graph_def` into a new graph and runs `fetches`.

    Returns:
        (values, static dtypes, static shapes), each a dict keyed by fetch name. A static
        shape may be unknown (an imported v1 loop's outputs have none).
    """
    graph = _import(graph_def)
    tensors = {name: graph.get_tensor_by_name(name) for name in fetches}
    config = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    if any(node.op == "Switch" for node in graph_def.node):
        # Grappler (TF 2.21) breaks v1 control flow, in the float32 graph as in any other: its
        # arithmetic optimizer makes a cond's output dead ("Retval[0] does not have value")
        # when the branch taken computes x + x or AddN(x, x, ...) of a tensor from outside the
        # cond; its model pruner and its dependency optimizer each make a loop whose body
        # returns a tensor from outside the loop through IdentityN spin forever (past the
        # timeout). Those three are off for graphs with v1 control flow.
        options = config.graph_options.rewrite_options
        options.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.OFF
        options.dependency_optimization = rewriter_config_pb2.RewriterConfig.OFF
        options.disable_model_pruning = True
    with tf1.Session(graph=graph, config=config) as sess:
        values = sess.run(tensors, feeds, options=tf1.RunOptions(timeout_in_ms=RUN_TIMEOUT_MS))
    return (values, {n: t.dtype for n, t in tensors.items()},
            {n: t.shape for n, t in tensors.items()})


# --- structural checks -------------------------------------------------------------------------

def _rewrite(graph_def, dtype, fetches):
    return tf_mpt.rewrite_graph_def(graph_def, dtype=dtype, fetches=fetches, strict=True)


def check_input_not_mutated(before, graph_def, what):
    assert _serialize(graph_def) == before, f"{what}: rewrite_graph_def mutated its input"


def _called_functions(node):
    """Names of the library functions a node calls through its function-valued attrs."""
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        yield from (func.name for func in value.list.func)


def _boundary_functions(node):
    """[(function attr, function name)] of a While or call, in the order tf_mpt numbers the
    copies it makes of shared ones."""
    return [(attr, name) for attr in BOUNDARY_FUNCTION_ATTRS[node.op]
            for name in ([f.name for f in node.attr[attr].list.func]
                         if node.attr[attr].WhichOneof("value") == "list"
                         else [node.attr[attr].func.name])]


def _typed_args(op, type_attr, function_attr):
    """The signature arg lists of a called function that a While's or call's type attr types."""
    if op in WHILE_OPS:
        return ("input_arg", "output_arg") if function_attr == "body" else ("input_arg",)
    return ("input_arg",) if type_attr == "Tin" else ("output_arg",)


def check_library(original, result, dtype, what):
    """Library functions keep their names and signatures, but for values kept half.

    A While or call (PartitionedCall, If, Case), in the main graph or in a function, may
    switch a float32 loop variable, argument or result to half, in its type attr and at the
    same position in the signatures of the functions it calls (a loop body takes and returns
    it, a loop cond takes it). It first copies a function that others call too, as
    `<function>_tf_mpt_call_<node>_<k>`. Every other caller sees the signature of the input.

    Returns:
        {function of the output: the function of the input it is, or copies}.
    """
    half, float32 = tf.as_dtype(dtype).as_datatype_enum, tf.float32.as_datatype_enum
    old_graphs, new_graphs = _graphs(original), _graphs(result.graph_def)
    old_signatures = {f.signature.name: f.signature for f in original.library.function}
    origins = {name: name for name in old_signatures}
    expected = {}  # function of the output -> (its expected signature, the caller that expects it)

    def expect(name, signature, caller):
        if name in expected:
            assert expected[name][0] == signature, (
                f"{what}: {caller} and {expected[name][1]} call function {name} with different "
                "signatures")
        expected[name] = (signature, caller)

    todo, examined = [None], set()  # graphs whose callers to examine, from the main graph down
    while todo:
        graph = todo.pop()
        if graph in examined:
            continue
        examined.add(graph)
        old_nodes = old_graphs[origins.get(graph)]
        for node in new_graphs[graph].values():
            caller = f"{node.op} {node.name!r} in the {_where(graph)}"
            if node.op not in BOUNDARY_FUNCTION_ATTRS:
                for name in _called_functions(node):
                    expect(name, old_signatures[name], caller)
                    todo.append(name)
                continue
            old = old_nodes[node.name]
            switched = {}
            for type_attr in ("T",) if node.op in WHILE_OPS else ("Tin", "Tout"):
                before, after = old.attr[type_attr].list.type, node.attr[type_attr].list.type
                switched[type_attr] = [k for k, (b, a) in enumerate(zip(before, after)) if b != a]
                assert len(before) == len(after) and all(
                    before[k] == float32 and after[k] == half for k in switched[type_attr]), (
                    f"{what}: {caller} has {type_attr} {list(after)}, was {list(before)}")
            calls = zip(_boundary_functions(old), _boundary_functions(node))
            for k, ((attr, before_name), (_, name)) in enumerate(calls):
                if name != before_name:
                    assert name == f"{before_name}{SPECIALISED}{node.name}_{k}", (
                        f"{what}: {caller} calls {name} instead of {before_name}")
                    origins[name] = before_name
                signature = op_def_pb2.OpDef()
                signature.CopyFrom(old_signatures[before_name])
                signature.name = name
                for type_attr, positions in switched.items():
                    for arg_list in _typed_args(node.op, type_attr, attr):
                        for position in positions:
                            getattr(signature, arg_list)[position].type = half
                expect(name, signature, caller)
                todo.append(name)
    new_signatures = {f.signature.name: f.signature for f in result.graph_def.library.function}
    assert len(new_signatures) == len(result.graph_def.library.function), (
        f"{what}: two library functions share a name")
    assert set(new_signatures) == set(origins), (
        f"{what}: library functions changed: {sorted(set(origins) ^ set(new_signatures))}")
    for name, signature in new_signatures.items():
        wanted = expected.get(name, (old_signatures.get(name),))[0]
        assert signature == wanted, (
            f"{what}: function {name} has the signature {signature}, expected {wanted}")
    return origins


def check_names_and_added_casts(original, result, origins, what):
    """Nodes all kept (same op), in the main graph and in every function (a copy keeps those
    of the function it copies, see check_library); every new node is a `*-TfMpt` Cast.

    Returns:
        {None (the main graph) or function name: the Casts added to that graph}.
    """
    old_graphs, new_graphs = _graphs(original), _graphs(result.graph_def)
    assert result.graph_def.library.gradient == original.library.gradient, (
        f"{what}: the library's gradient table changed")
    added, cast_names = {}, []
    for function, new in new_graphs.items():
        old, where = old_graphs[origins.get(function)], f"{what}, {_where(function)}"
        missing = sorted(set(old) - set(new))
        assert not missing, f"{where}: nodes of the input missing from the output: {missing}"
        changed_op = sorted(n for n in old if new[n].op != old[n].op)
        assert not changed_op, f"{where}: nodes whose op type changed: {changed_op}"
        added[function] = [new[n] for n in new if n not in old]
        for node in added[function]:
            assert node.op == "Cast" and node.name.endswith(CAST_SUFFIX), (
                f"{where}: added node {node.name!r} (op {node.op}) is not a Cast named "
                f"*{CAST_SUFFIX}")
        cast_names += [node.name if function is None else f"{function}/{node.name}"
                       for node in added[function]]
    assert sorted(cast_names) == sorted(result.report.cast_names), (
        f"{what}: the report's cast_names differ from the Casts in the graph")
    assert result.modified == (_serialize(result.graph_def) != _serialize(original)), (
        f"{what}: modified={result.modified} disagrees with the GraphDefs")
    return added


def check_kept_nodes_unchanged(original, result, origins, fetches, what):
    """Fetched and opted-out nodes keep every attr (only their inputs may read Casts)."""
    fetched = set(_sink_nodes(original)) if fetches is None else {_node_of(f) for f in fetches}
    old_graphs = _graphs(original)
    for function, new in _graphs(result.graph_def).items():
        for node in old_graphs[origins.get(function)].values():
            opted_out = node.attr[KEEP_FP32_ATTR].b if KEEP_FP32_ATTR in node.attr else False
            is_fetched = function is None and node.name in fetched
            if is_fetched or opted_out:
                why = "fetched" if is_fetched else "opted out"
                assert new[node.name].attr == node.attr, (
                    f"{what}, {_where(function)}: {why} node {node.name!r} ({node.op}) had its "
                    "attrs changed")


def check_no_round_trip(result, added, what):
    """No added Cast reads a Cast of the same graph that converts the opposite way."""
    for function, nodes in _graphs(result.graph_def).items():
        for cast in added[function]:
            producer = nodes.get(_node_of(cast.input[0]))  # None: a function argument
            if producer is None or producer.op != "Cast":
                continue
            src, dst = cast.attr["SrcT"].type, cast.attr["DstT"].type
            assert not (producer.attr["SrcT"].type == dst and producer.attr["DstT"].type == src), (
                f"{what}, {_where(function)}: added Cast {cast.name!r} undoes Cast "
                f"{producer.name!r} ({tf.as_dtype(dst).name} -> {tf.as_dtype(src).name} -> "
                f"{tf.as_dtype(dst).name})")


def check_one_cast_per_tensor_and_dtype(added, what):
    """Within each graph (main or function body), one added Cast per (tensor, dtype)."""
    for function, casts in added.items():
        seen = {}
        for cast in casts:
            key = (_canonical_tensor(cast.input[0]), cast.attr["DstT"].type)
            assert key not in seen, (
                f"{what}, {_where(function)}: Casts {seen[key]!r} and {cast.name!r} both "
                f"convert {key[0]} to {tf.as_dtype(key[1]).name}")
            seen[key] = cast.name


def check_every_attr_has_a_value(result, what):
    """No AttrValue without a value (reading a missing attr through the map adds one, which
    TensorFlow's importer refuses)."""
    for function, nodes in _graphs(result.graph_def).items():
        empty = [(name, key) for name, node in nodes.items() for key, value in node.attr.items()
                 if value.WhichOneof("value") is None]
        assert not empty, f"{what}, {_where(function)}: attrs without a value: {empty}"


def check_idempotent(result, dtype, fetches, what):
    again = _rewrite(result.graph_def, dtype, fetches)
    assert not again.modified, (
        f"{what}: rewriting the rewritten graph modified it again: {again.report.summary()}")
    assert _serialize(again.graph_def) == _serialize(result.graph_def), (
        f"{what}: rewriting the rewritten graph gave a different GraphDef")


def rewrite_and_check_structure(graph_def, dtype, fetches):
    """Rewrites `graph_def` and checks every structural invariant.

    Returns:
        The RewriteResult.
    """
    before = _serialize(graph_def)
    result = _rewrite(graph_def, dtype, fetches)
    what = f"{dtype}, fetches={fetches} ({result.report.summary()})"
    check_input_not_mutated(before, graph_def, what)
    origins = check_library(graph_def, result, dtype, what)
    added = check_names_and_added_casts(graph_def, result, origins, what)
    check_kept_nodes_unchanged(graph_def, result, origins, fetches, what)
    check_no_round_trip(result, added, what)
    check_one_cast_per_tensor_and_dtype(added, what)
    check_every_attr_has_a_value(result, what)
    check_idempotent(result, dtype, fetches, what)
    check_input_not_mutated(before, graph_def, what)
    return result


# --- numeric checks ----------------------------------------------------------------------------

def check_outputs(result, dtype, fetch_tensors, feeds, reference, what):
    """The rewritten graph runs; fetched outputs keep dtype and shape and match float32."""
    values, dtypes, shapes = _run(result.graph_def, fetch_tensors, feeds)
    ref_values, ref_dtypes, ref_shapes = reference
    for name in fetch_tensors:
        assert dtypes[name] == ref_dtypes[name], (
            f"{what}: fetched {name} is {dtypes[name].name}, was {ref_dtypes[name].name}")
        assert shapes[name] == ref_shapes[name], (
            f"{what}: fetched {name} has static shape {shapes[name]}, was {ref_shapes[name]}")
        actual, expected = np.asarray(values[name]), np.asarray(ref_values[name])
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
            f"{what}: {name} ran as {actual.dtype}{actual.shape}, "
            f"float32 graph gave {expected.dtype}{expected.shape}")
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(
                actual, expected, **TOLERANCES[dtype],
                err_msg=f"{what}: {name} differs from the float32 graph")
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=f"{what}: {name}")


def check_values_bounded(values):
    """The float32 graph stays within [-BOUND, BOUND], the premise of the tolerances (integer
    outputs, such as a loop's iteration count, are not compared with tolerances)."""
    for name, value in values.items():
        if np.asarray(value).dtype.kind != "f":
            continue
        largest = np.max(np.abs(value))
        assert largest <= BOUND, (
            f"float32 value of {name} reaches {largest} > BOUND={BOUND}: an OP_TABLE builder "
            "does not keep its output bounded (a bug in this test, not in tf_mpt)")


def _explicit_fetches(recipe, built):
    """(fetches argument for the rewrite, tensor names to run), or None."""
    if not recipe.fetches:
        return None
    tensors = [built.pool[k] for k in recipe.fetches]
    names = sorted({_node_of(t) for t in tensors}) if recipe.fetch_by_node else tensors
    return names, tensors


def check_recipe(recipe):
    """Both dtypes, default and explicit fetches: structure first, then numbers."""
    built = build_graph(recipe)
    default_tensors = _default_fetch_tensors(built)
    explicit = _explicit_fetches(recipe, built)
    variants = [(None, default_tensors)] + ([explicit] if explicit else [])
    rewrites = [(dtype, fetches, tensors,
                 rewrite_and_check_structure(built.graph_def, dtype, fetches))
                for dtype in HALF_DTYPES for fetches, tensors in variants]
    all_tensors = sorted({t for _, tensors in variants for t in tensors})
    reference = _run(built.graph_def, all_tensors, built.feeds)
    check_values_bounded(reference[0])
    for dtype, _, _, result in rewrites:
        event(f"{dtype} rewrite {'modified the graph' if result.modified else 'changed nothing'}")
    for dtype, fetches, tensors, result in rewrites:
        check_outputs(result, dtype, tensors, built.feeds, reference,
                      f"{dtype}, fetches={fetches}")


def nested_recipe(traced):
    """Blocks three deep: a cond in a loop in a function called twice, a loop in a cond in a
    loop whose variable a MatMul reads first (so a traced While may keep it half)."""
    cond_in_loop = Block("cond", (0, 1), (
        (Step("MatMul", (0, 1)),),
        (Step("Exp", (0,)), Step("Tanh", (2,)))))
    loop_in_call = Block("call", (0, 1), ((Block("while", (0, 1), ((cond_in_loop,),), trips=2),),),
                         trips=2)
    loop_in_cond = Block("cond", (2, 1), (
        (Block("while", (0, 1), ((Step("Conv2D", (0, 1)),),), trips=2),),
        (Step("Relu", (0,)),)), parity=1)
    outer_loop = Block("while", (2, 1), ((Step("MatMul", (0, 1)), loop_in_cond,
                                          Step("AddV2", (3, 2))),), trips=3)
    return Recipe(placeholders=2, constants=(), seed=0, traced=traced,
                  steps=(loop_in_call, outer_loop, Step("MatMul", (3, 2))))


def _depth(steps):
    """How deep blocks nest in `steps` (0: no block)."""
    return max((1 + max(_depth(body) for body in step.bodies) for step in steps
                if isinstance(step, Block)), default=0)


# --- tests -------------------------------------------------------------------------------------

def test_op_table_covers_enough_listed_op_types():
    """Every OP_TABLE entry builds its op; at least 30 listed op types, every list used."""
    built = build_graph(all_ops_recipe())
    op_types = {node.op for node in built.graph_def.node}
    for spec in OP_TABLE:
        op = STRUCTURE_ENTRIES.get(spec.name, spec.name)
        assert op in op_types, f"OP_TABLE entry {spec.name} builds no {op} node"
    for dtype in HALF_DTYPES:
        lists = tf_mpt.default_lists(dtype)
        listed = sorted(op for op in op_types if lists.list_of(op) is not None)
        assert len(listed) >= MIN_LISTED_OP_TYPES, (
            f"the fuzz graphs use only {len(listed)} op types on the {dtype} lists: {listed}")
        for list_name in ("allow", "infer", "deny", "clear"):
            assert any(lists.list_of(op) == list_name for op in op_types), list_name
        for op in UNLISTED_OPS:
            assert lists.list_of(op) is None, f"{op} is meant to be on no {dtype} list"


def test_all_ops_graph_is_rewritten_not_just_copied():
    """Guards the fuzz test against vacuity: the rewrite really converts and casts."""
    graph_def = build_graph(all_ops_recipe()).graph_def
    for dtype in HALF_DTYPES:
        result = rewrite_and_check_structure(graph_def, dtype, None)
        assert result.modified and result.report.casts_added > 0, result.report.summary()
        assert result.report.converted_nodes >= 10, result.report.summary()


@pytest.mark.parametrize("traced", [False, True], ids=["control_flow_v1", "traced"])
def test_nested_control_flow_graph_has_its_structure_and_is_rewritten_inside(traced,
                                                                           no_cost_model):
    """Guards the control-flow fuzz test against vacuity: the blocks build the control flow
    they stand for, and the rewrite converts ops inside loops, conds and called functions
    (by the lists: the cost model, off here, keeps these tiny bodies float32 on a CPU)."""
    graph_def = build_graph(nested_recipe(traced)).graph_def
    main_ops = {node.op for node in graph_def.node}
    function_ops = {node.op for f in graph_def.library.function for node in f.node_def}
    if traced:
        assert {"PartitionedCall", "StatelessWhile"} <= main_ops, main_ops
    else:
        assert {"Enter", "Switch", "Merge", "NextIteration", "Exit",
                "PartitionedCall"} <= main_ops, main_ops
    assert {"StatelessWhile", "StatelessIf"} <= function_ops, function_ops
    for dtype in HALF_DTYPES:
        result = rewrite_and_check_structure(graph_def, dtype, None)
        converted = [d for d in result.report.decisions.values() if d.converted]
        assert {d.op for d in converted} >= {"MatMul", "Conv2D"}, result.report.summary()
        # The cond's MatMul, in a loop in the called function, is half.
        assert any(d.function and d.op == "MatMul" for d in converted), result.report.summary()
        # The Conv2D in a loop in a cond in a loop: v1 frames in the main graph, or a function.
        assert any(d.op == "Conv2D" and bool(d.function) == traced for d in converted)
        # The traced outer loop keeps its variable half, which changes signatures (see
        # check_library); v1 loops have no signatures.
        assert result.report.loop_variables_kept_half >= (1 if traced else 0), result.report


def test_control_flow_v1_switch_is_restored():
    """Building a control-flow v1 recipe leaves control flow v2 on for every other test."""
    assert tf1.control_flow_v2_enabled()
    build_graph(nested_recipe(traced=False))
    assert tf1.control_flow_v2_enabled()


@pytest.mark.heavy
@FUZZ_SETTINGS
@given(recipe=recipes())
@example(recipe=all_ops_recipe())
def test_rewritten_random_graph_is_well_formed_and_matches_float32(recipe):
    """Straight-line graphs."""
    check_recipe(recipe)


@pytest.mark.heavy
@CONTROL_FLOW_SETTINGS
@given(recipe=recipes(max_steps=MAX_CONTROL_FLOW_STEPS, max_depth=MAX_DEPTH))
@example(recipe=nested_recipe(traced=False))
@example(recipe=nested_recipe(traced=True))
def test_rewritten_random_control_flow_graph_is_well_formed_and_matches_float32(recipe):
    """Graphs with loops, conds and function calls nested up to MAX_DEPTH deep."""
    event("traced: functional While/If" if recipe.traced else "tf.Graph: control flow v1")
    event(f"blocks nested {_depth(recipe.steps)} deep")
    check_recipe(recipe)
