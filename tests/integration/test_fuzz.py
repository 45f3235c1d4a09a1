"""Property-based fuzzing: random float32 DAGs, rewritten to float16 and bfloat16.

Hypothesis draws a *recipe* (`Recipe`): 1-3 float32 placeholders of shape [8, 8], 0-2 float32
constants of that shape, a seed for their values and the feeds, and up to MAX_STEPS steps.
Each step applies one entry of `OP_TABLE` (allow, infer, deny, clear and unlisted ops, existing
Casts, a control dependency, a library function call) to earlier tensors and adds one [8, 8]
float32 tensor; about one step in ten is built inside `tf_mpt.keep_fp32()`. Node names come
from the recipe alone (`x0`, `c1`, `s3_MatMul/...`; a constant may take the name tf_mpt would
give a Cast), so a failing example that hypothesis prints names the same nodes on every run.

Every step keeps its output within [-BOUND, BOUND] whenever its inputs are (inputs are
uniform in [-1, 1]), so float16 cannot overflow and the comparison with float32 uses the
shared TOLERANCES unchanged.

Each graph is rewritten to both half dtypes (strict=True, so an internal error fails instead of
returning the input) with the default fetches and, when the recipe asks for it, with explicit
fetches. Structure is checked first (input not mutated, node names and ops kept, added Casts
named `*-TfMpt`, fetched and opted-out nodes untouched, no round trip, one Cast per (tensor,
dtype), idempotence), then numbers (imports, runs, fetched dtypes and shapes kept, values
within tolerance of the float32 graph).

Profiles (environment variable TF_MPT_FUZZ_PROFILE):
    ci (default): 300 graphs, derandomized (the same graphs on every run), under a minute on
        2 cores.
    thorough: 10,000 random graphs, about 25 minutes on 2 cores:
        TF_MPT_FUZZ_PROFILE=thorough python -m pytest tests/integration/test_fuzz.py
    A thorough failure prints a `@reproduce_failure` blob that replays it.
"""

import contextlib
import dataclasses
import os
import typing

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import tf_mpt
from conftest import HALF_DTYPES, TOLERANCES

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

PROFILE_ENV_VAR = "TF_MPT_FUZZ_PROFILE"
_COMMON = dict(deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=300, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=10_000, print_blob=True, **_COMMON)


def _fuzz_settings():
    """The settings of the profile named by TF_MPT_FUZZ_PROFILE (default 'ci')."""
    name = os.environ.get(PROFILE_ENV_VAR, "ci")
    if name not in ("ci", "thorough"):
        raise ValueError(f"{PROFILE_ENV_VAR}={name!r}; use 'ci' (default) or 'thorough'.")
    return settings.get_profile(name)


FUZZ_SETTINGS = _fuzz_settings()


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
class Recipe:
    """A random graph: the pool starts with placeholders, then constants, then step outputs.

    Attributes:
        placeholders: number of placeholders (x0, x1, ...).
        constants: names of the [8, 8] constants (see CONSTANT_NAMES).
        steps: the ops, in order.
        seed: seeds the constants' values and the feeds.
        fetches: indices into the tensor pool of tensors that are also passed as explicit
            fetches (empty: only the default fetches are tested).
        fetch_by_node: pass the explicit fetches as node names instead of tensor names.
    """
    placeholders: int
    constants: tuple
    steps: tuple
    seed: int
    fetches: tuple = ()
    fetch_by_node: bool = False


@dataclasses.dataclass
class BuiltGraph:
    """A recipe turned into a GraphDef, its feeds and the names of its pool tensors."""
    graph_def: typing.Any
    feeds: dict
    pool: list


@st.composite
def recipes(draw):
    """Hypothesis strategy for Recipe."""
    placeholders = draw(st.integers(1, MAX_PLACEHOLDERS))
    constants = tuple(draw(st.sampled_from(names))
                      for names in CONSTANT_NAMES[:draw(st.integers(0, len(CONSTANT_NAMES)))])
    pool_size = placeholders + len(constants)
    steps = []
    for _ in range(draw(st.integers(1, MAX_STEPS))):
        from_allow = draw(st.integers(0, ALLOW_ONE_IN - 1)) == 0
        spec = draw(st.sampled_from(ALLOW_ENTRIES if from_allow else OP_TABLE))
        # Operands count back from the newest tensor, so examples shrink towards chains.
        operands = tuple(pool_size - 1 - draw(st.integers(0, pool_size - 1))
                         for _ in range(spec.arity))
        keep_fp32 = draw(st.integers(0, KEEP_FP32_ONE_IN - 1)) == 0
        steps.append(Step(spec.name, operands, keep_fp32))
        pool_size += 1
    seed = draw(st.integers(0, 2**31 - 1))
    if not draw(st.booleans()):
        return Recipe(placeholders, constants, tuple(steps), seed)
    fetches = draw(st.sets(st.integers(0, pool_size - 1), min_size=1, max_size=4))
    return Recipe(placeholders, constants, tuple(steps), seed, tuple(sorted(fetches)),
                  draw(st.booleans()))


def _uniform(rng):
    return rng.uniform(-1.0, 1.0, SHAPE).astype(np.float32)


def build_graph(recipe):
    """Builds the recipe's graph in a fresh tf.Graph.

    Args:
        recipe: a Recipe.

    Returns:
        BuiltGraph: the GraphDef, feeds {tensor name: value} and the pool tensor names.
    """
    rng = np.random.RandomState(recipe.seed)
    feeds = {}
    with tf.Graph().as_default() as graph:
        pool = []
        for k in range(recipe.placeholders):
            placeholder = tf1.placeholder(tf.float32, SHAPE, name=f"x{k}")
            feeds[placeholder.name] = _uniform(rng)
            pool.append(placeholder)
        for name in recipe.constants:
            pool.append(tf.constant(_uniform(rng), name=name))
        for k, step in enumerate(recipe.steps):
            with tf.name_scope(f"s{k}_{step.op}"), _maybe_keep_fp32(step.keep_fp32):
                out = OPS_BY_NAME[step.op].build(*(pool[i] for i in step.operands))
            assert out.dtype == tf.float32 and out.shape == SHAPE, (step, out)
            pool.append(out)
    return BuiltGraph(graph.as_graph_def(), feeds, [t.name for t in pool])


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
    """'a:1' -> 'a', '^a' -> 'a', 'a' -> 'a'."""
    name = tensor_name.lstrip("^")
    head, sep, tail = name.rpartition(":")
    return head if sep and tail.isdigit() else name


def _canonical_tensor(tensor_name):
    """'a' -> 'a:0'; 'a:1' -> 'a:1'."""
    head, sep, tail = tensor_name.rpartition(":")
    return tensor_name if sep and tail.isdigit() else f"{tensor_name}:0"


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


def _default_fetch_tensors(graph_def):
    """Every output of every node with no data consumer, except placeholders (fed)."""
    graph = _import(graph_def)
    operations = [graph.get_operation_by_name(name) for name in _sink_nodes(graph_def)]
    return [t.name for op in operations if op.type != "Placeholder" for t in op.outputs]


def _run(graph_def, fetches, feeds):
    """Imports `graph_def` into a new graph and runs `fetches`.

    Returns:
        (values, static dtypes, static shapes), each a dict keyed by fetch name.
    """
    graph = _import(graph_def)
    tensors = {name: graph.get_tensor_by_name(name) for name in fetches}
    config = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with tf1.Session(graph=graph, config=config) as sess:
        values = sess.run(tensors, feeds)
    return (values, {n: t.dtype for n, t in tensors.items()},
            {n: tuple(t.shape.as_list()) for n, t in tensors.items()})


# --- structural checks -------------------------------------------------------------------------

def _rewrite(graph_def, dtype, fetches):
    return tf_mpt.rewrite_graph_def(graph_def, dtype=dtype, fetches=fetches, strict=True)


def check_input_not_mutated(before, graph_def, what):
    assert _serialize(graph_def) == before, f"{what}: rewrite_graph_def mutated its input"


def check_names_and_added_casts(original, result, what):
    """Original nodes all kept (same op); every new node is a `*-TfMpt` Cast."""
    old = {node.name: node for node in original.node}
    new = {node.name: node for node in result.graph_def.node}
    missing = sorted(set(old) - set(new))
    assert not missing, f"{what}: nodes of the input missing from the output: {missing}"
    changed_op = sorted(n for n in old if new[n].op != old[n].op)
    assert not changed_op, f"{what}: nodes whose op type changed: {changed_op}"
    added = [new[n] for n in new if n not in old]
    for node in added:
        assert node.op == "Cast" and node.name.endswith(CAST_SUFFIX), (
            f"{what}: added node {node.name!r} (op {node.op}) is not a Cast named *{CAST_SUFFIX}")
    assert sorted(n.name for n in added) == sorted(result.report.cast_names), (
        f"{what}: the report's cast_names differ from the Casts in the graph")
    assert result.modified == (_serialize(result.graph_def) != _serialize(original)), (
        f"{what}: modified={result.modified} disagrees with the GraphDefs")
    return added


def check_kept_nodes_unchanged(original, result, fetches, what):
    """Fetched and opted-out nodes keep every attr (only their inputs may read Casts)."""
    fetched = set(_sink_nodes(original)) if fetches is None else {_node_of(f) for f in fetches}
    new = {node.name: node for node in result.graph_def.node}
    for node in original.node:
        opted_out = node.attr[KEEP_FP32_ATTR].b if KEEP_FP32_ATTR in node.attr else False
        if node.name in fetched or opted_out:
            why = "fetched" if node.name in fetched else "opted out"
            assert new[node.name].attr == node.attr, (
                f"{what}: {why} node {node.name!r} ({node.op}) had its attrs changed")


def check_no_round_trip(result, added, what):
    """No added Cast reads a Cast that converts the opposite way."""
    nodes = {node.name: node for node in result.graph_def.node}
    for cast in added:
        producer = nodes[_node_of(cast.input[0])]
        if producer.op != "Cast":
            continue
        src, dst = cast.attr["SrcT"].type, cast.attr["DstT"].type
        assert not (producer.attr["SrcT"].type == dst and producer.attr["DstT"].type == src), (
            f"{what}: added Cast {cast.name!r} undoes Cast {producer.name!r} "
            f"({tf.as_dtype(dst).name} -> {tf.as_dtype(src).name} -> {tf.as_dtype(dst).name})")


def check_one_cast_per_tensor_and_dtype(added, what):
    seen = {}
    for cast in added:
        key = (_canonical_tensor(cast.input[0]), cast.attr["DstT"].type)
        assert key not in seen, (
            f"{what}: Casts {seen[key]!r} and {cast.name!r} both convert {key[0]} to "
            f"{tf.as_dtype(key[1]).name}")
        seen[key] = cast.name


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
    added = check_names_and_added_casts(graph_def, result, what)
    check_kept_nodes_unchanged(graph_def, result, fetches, what)
    check_no_round_trip(result, added, what)
    check_one_cast_per_tensor_and_dtype(added, what)
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
    """The float32 graph stays within [-BOUND, BOUND], the premise of the tolerances."""
    for name, value in values.items():
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


@FUZZ_SETTINGS
@given(recipe=recipes())
@example(recipe=all_ops_recipe())
def test_rewritten_random_graph_is_well_formed_and_matches_float32(recipe):
    """Both dtypes, default and explicit fetches: structure first, then numbers."""
    built = build_graph(recipe)
    default_tensors = _default_fetch_tensors(built.graph_def)
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
