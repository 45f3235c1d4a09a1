"""What a sandbox may run: the stateful ops whose state is the candidate's own, the bytes
its copies may take, the time one run may take (policy.max_copy_bytes, run_timeout_ms);
NotTimed where it cannot run safely."""

from tensorflow.python.framework import op_def_registry as _op_def_registry

from tf_mpt.rewrite import function_bodies as _function_library


# Stateful ops whose state is the function's own (its variables, its random draws, state
# made and dropped within one run): running them on copies changes nothing outside.
_SAFE_STATEFUL = frozenset((
    "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "VarIsInitializedOp", "VariableShape", "ResourceGather", "ResourceGatherNd",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul", "ResourceScatterDiv",
    "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterUpdate",
    "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdUpdate",
    "ResourceStridedSliceAssign",
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "Multinomial",
    "ParameterizedTruncatedNormal", "StatefulUniform", "StatefulUniformInt",
    "StatefulUniformFullInt", "StatefulStandardNormalV2", "StatefulTruncatedNormal",
    "RngReadAndSkip", "RngSkip",
    "While", "If", "Case", "StatefulPartitionedCall", "PartitionedCall",
    "Assert", "CheckNumerics", "CheckNumericsV2",
    "TensorArrayV3", "TensorArrayGradV3", "TensorArrayWriteV3", "TensorArrayReadV3",
    "TensorArrayGatherV3", "TensorArrayScatterV3", "TensorArraySizeV3",
    "TensorArrayCloseV3", "TensorArrayConcatV3", "TensorArraySplitV3",
    "StackV2", "StackPushV2", "StackPopV2", "StackCloseV2",
))
_SAFE_STATEFUL_PREFIXES = ("ResourceApply", "ResourceSparseApply")


class NotTimed(Exception):
    """The function cannot be timed safely; the message says why."""


class TooSlow(NotTimed):
    """Its rounds do not fit in the budget: it runs, but too slowly to time (its peaks can
    still be measured, one traced run each: decision's memory check)."""


def refuse_unsafe(graph_defs):
    """NotTimed where one of {candidate: GraphDef} runs a stateful op not known to be safe
    (_unsafe_ops): its runs on the copies would act outside them."""
    unsafe = set().union(*(_unsafe_ops(g) for g in graph_defs.values()))
    if unsafe:
        raise NotTimed(f"it runs op(s) with effects outside its variables: "
                       f"{', '.join(sorted(unsafe)[:5])}")


def _unsafe_ops(graph_def):
    """Op types of the graph and its functions that are stateful and not known to be safe
    (an op TensorFlow does not know, nor the library defines, is: nothing is known of it)."""
    return unsafe_ops(_function_library.all_nodes(graph_def),
                      {f.signature.name for f in graph_def.library.function})


def unsafe_ops(nodes, library, also_safe=frozenset(), also_safe_prefixes=()):
    """Op types of `nodes` that are stateful and not known to be safe: neither a function of
    `library` (names), nor in _SAFE_STATEFUL or `also_safe`, nor starting with one of
    _SAFE_STATEFUL_PREFIXES or `also_safe_prefixes`."""
    found = set()
    prefixes = _SAFE_STATEFUL_PREFIXES + tuple(also_safe_prefixes)
    for node in nodes:
        op = node.op
        if op in library or op in _SAFE_STATEFUL or op in also_safe or op.startswith(prefixes):
            continue
        op_def = _op_def_registry.get(op)
        if op_def is None or op_def.is_stateful:
            found.add(op)
    return found


def first_line(error):
    """'<error type>: <the first line of its message that says what failed>'."""
    lines = [line for line in error.message.splitlines()
             if line.strip() and not line.startswith(
                 ("Graph execution error", "Detected at node", "  "))]
    return f"{type(error).__name__}: {(lines or [''])[0][:200]}"
