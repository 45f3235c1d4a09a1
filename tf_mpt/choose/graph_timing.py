"""Graph timing: candidate colourings of one GraphDef run on this CPU, the fastest kept.

A per-op table cannot see what a graph does on the machine (fusions that do or do not
happen, layout reorders, element-wise kernels in context, memory traffic), so where the
decisions are for this CPU the rewrite runs the graph itself, as TensorRT's builder times
candidate precisions per layer and keeps float32 where it is faster:

    candidates      float32 (the graph as given), the op lists' colouring (`rules`), the cost
                    model's (`cost model`), contractions only (matrix products and
                    convolutions half, every other op float32, Casts around each)
    sandbox         one tf.Graph and Session per candidate, each importing its GraphDef;
                    made-up inputs of its placeholders' shapes (an unknown leading dimension:
                    the cost model's batch) held in variables; the graph's variables copies
                    of nothing (random values): the script's variables, inputs, iterators and
                    files are never touched
    runs            one warm-up run each (Grappler, kernel set-up), then rounds of one run
                    each, the order rotating, until the budget is spent, MAX_ROUNDS, or (after
                    MIN_ROUNDS) the fastest's slowest run beats every other's fastest
    verdict         the fastest median; the prediction's candidate stays unless another is
                    faster by more than MARGIN (timing noise does not overturn it)

Only the part of the graph its fetches need is run. A graph whose fetches need an op with
effects outside the sandbox (files, queues, iterators, tables, Python calls, printing,
summaries, collectives) is not timed; nor one whose inputs have an unknown size other than
the batch, or a dtype with no made-up value (strings). It then keeps the prediction, and
the report says why.
"""

import dataclasses
import logging
import statistics
import time

import numpy as np
from tensorflow.core.framework import types_pb2

from tf_mpt._process import state as _state
from tf_mpt.choose import step_timing as _step_timing
from tf_mpt.rewrite import function_bodies as _function_library
from tf_mpt.rewrite import graph_view as _graph_view

FLOAT32, RULES, COST, CONTRACTIONS = "float32", "rules", "cost model", "contractions only"
REFINED = "refined"  # the pick with the op types its profile shows slower in half float32
LEAN = "lean"  # the fastest candidate rearranged to hold less (lean.py)
MIN_ROUNDS = 3
MAX_ROUNDS = 15
MARGIN = 0.03  # another candidate must be this much faster than the prediction's to win
# Where MIN_ROUNDS rounds of every candidate would not fit in the budget, a candidate slower
# than the fastest by over this share in every round so far runs no more rounds (it cannot
# win), and the others' rounds are timed if they fit: ResNet50's fit step at batch 64 (7.2 s
# a round: float32 2.1 s against the op lists' 1.5 s) did not fit in the default budget with
# float32 and fits without it.
DROP_SLOWER = 0.2
DEFAULT_BUDGET_SECONDS = 30.0
# The refinement: an op type goes float32 where its half nodes' summed time in the pick's
# per-node profile is over (1 + SLOWER) times the same nodes' float32 time, by FLOOR_SECONDS
# at least; it is tried only while REFINE_SHARE of the budget is left.
SLOWER = 0.1
FLOOR_SECONDS = 5e-6
PROFILE_RUNS = 3
REFINE_SHARE = 1.0 / 3.0
# Memory (issue "memory"): a candidate whose measured step peak is over float32's by more than
# this share is not kept (TF_MPT_MEMORY=float32) and is flagged in the verdict.
PEAK_SLACK = 0.02
# peaks[RESIDENT]: the bytes every candidate holds alike across its steps (its variables, the
# optimizer's slots among them, and its inputs), added to each step peak where compared.
RESIDENT = _step_timing.RESIDENT

NotTimed = _step_timing.NotTimed
TooSlow = _step_timing.TooSlow
_log = logging.getLogger("tf_mpt.rewrite")
_MADE_UP_DTYPES = frozenset((
    types_pb2.DT_FLOAT, types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_DOUBLE,
    types_pb2.DT_INT32, types_pb2.DT_INT64, types_pb2.DT_INT8, types_pb2.DT_UINT8,
    types_pb2.DT_INT16, types_pb2.DT_UINT16, types_pb2.DT_BOOL))

# Stateful ops that only act on the sandbox's own state: a TF1 graph's reference variables
# and their updates (besides step timing's resource-variable and random ops).
_SAFE_REF_STATEFUL = frozenset((
    "VariableV2", "Variable", "VarHandleOp", "Assign", "AssignAdd", "AssignSub",
    "IsVariableInitialized", "VarIsInitializedOp", "TemporaryVariable",
    "DestroyTemporaryVariable", "ScatterAdd", "ScatterSub", "ScatterMul", "ScatterDiv",
    "ScatterUpdate", "ScatterMin", "ScatterMax", "ScatterNdAdd", "ScatterNdSub",
    "ScatterNdUpdate", "NoOp", "Placeholder", "PlaceholderWithDefault"))
_SAFE_REF_PREFIXES = ("Apply", "SparseApply")  # (the Resource* ones: step timing's)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What graph timing found for one graph.

    Attributes:
        times: {candidate: (seconds per run, one per round)} of the candidates timed, in the
            order they were timed; {} where nothing was timed.
        pick: the candidate the graph runs as.
        predicted: the candidate the prediction (the cost model, or the op lists) chose.
        why: '' where timed; else why the graph was not timed (it keeps the prediction).
        same_as: {candidate: the candidate whose graph it equals} for candidates not timed
            because their graph was another's.
        source: 'timed' (here, now), 'cached' (here, by an earlier process: nothing timed)
            or 'table' (a cost table file's, `tf-mpt measure --model`: nothing timed).
        refined: the node names the refinement kept float32 (() where none was tried);
            times[REFINED] its candidate's rounds, timed beside `refined_from`'s (`beside`).
        refined_from: the candidate refined (the pick of the first rounds).
        refined_ops: {op type: nodes kept float32}.
        beside: `refined_from`'s times in the refinement's rounds.
        peaks: {candidate: step peak bytes of a traced run} where measured ({} otherwise); a
            candidate over PEAK_SLACK above float32's is flagged where it is printed.
        lean_from: the candidate made lean (LEAN; '' where none was); times[LEAN] its
            rounds, timed beside `lean_against`'s (`lean_beside`).
        lean_against: the candidate the lean one was timed beside (the fastest within
            float32's peak in the first rounds).
        lean_beside: `lean_against`'s times in those rounds.
        lean_changes: {change: count} (lean.lean).
        lean_others: {candidate: (median seconds, step peak bytes or None)} of the other
            lean versions timed in the same rounds and not recorded as LEAN (decision.
            _make_smaller: those of candidates near the pick's time).
        memory_price: TF_MPT_MEMORY_PRICE where the lean pick was kept under it (0: none).
        compiled: the candidates were timed as XLA compiles them (a jit_compile step:
            step_timing.time_compiled; no step peaks, nor a refinement, are measured there).
    """
    times: dict
    pick: str
    predicted: str
    why: str = ""
    same_as: dict = dataclasses.field(default_factory=dict)
    source: str = "timed"
    refined: tuple = ()
    refined_from: str = ""
    refined_ops: dict = dataclasses.field(default_factory=dict)
    beside: tuple = ()
    peaks: dict = dataclasses.field(default_factory=dict)
    lean_from: str = ""
    lean_against: str = ""
    lean_beside: tuple = ()
    lean_changes: dict = dataclasses.field(default_factory=dict)
    lean_others: dict = dataclasses.field(default_factory=dict)
    memory_price: float = 0.0
    compiled: bool = False

    @classmethod
    def from_dict(cls, data, source):
        """A verdict as `to_dict` wrote it (None where it does not read as one)."""
        try:
            times = {str(k): tuple(float(t) for t in v) for k, v in data["times"].items()}
            pick, predicted = str(data["pick"]), str(data["predicted"])
            refined = tuple(str(n) for n in data.get("refined", ()))
            refined_from = str(data.get("refined_from", ""))
            refined_ops = {str(k): int(v) for k, v in data.get("refined_ops", {}).items()}
            beside = tuple(float(t) for t in data.get("beside", ()))
            peaks = {str(k): int(v) for k, v in data.get("peaks", {}).items()}
            lean_from = str(data.get("lean_from", ""))
            lean_against = str(data.get("lean_against", ""))
            lean_beside = tuple(float(t) for t in data.get("lean_beside", ()))
            lean_changes = {str(k): int(v) for k, v in data.get("lean_changes", {}).items()}
            lean_others = {str(k): (float(v[0]), None if v[1] is None else int(v[1]))
                           for k, v in data.get("lean_others", {}).items()}
            why = str(data.get("why", ""))
            memory_price = float(data.get("memory_price", 0.0))
            compiled = bool(data.get("compiled", False))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        if not times:  # (a graph too slow to time, its peaks measured instead: decision's
            # memory check; the prediction, float32 or a lean version of the prediction)
            if not why or FLOAT32 not in peaks or not set(peaks) - {FLOAT32, RESIDENT} or \
                    pick not in (predicted, FLOAT32, LEAN) or (
                    pick == LEAN and not (lean_from and LEAN in peaks and lean_changes)):
                return None
            return cls({}, pick, predicted, why, {}, source, peaks=peaks, lean_from=lean_from,
                       lean_changes=lean_changes)
        if pick not in times or not all(times.values()) or (
                pick == REFINED and not (refined and refined_from in times and beside)) or (
                pick == LEAN and not (lean_from in times and lean_beside)):
            return None
        return cls(times, pick, predicted, "", {}, source, refined, refined_from, refined_ops,
                   beside, peaks, lean_from, lean_against, lean_beside, lean_changes,
                   lean_others, memory_price, compiled)

    @property
    def timed(self):
        return bool(self.times)

    def median(self, name):
        return statistics.median(self.times[name]) if name in self.times else None

    def describe(self):
        """One line: each candidate's median time and the pick."""
        if not self.timed:
            return self._describe_untimed()
        first = {name: len(t) for name, t in self.times.items() if name not in (REFINED, LEAN)}
        dropped = {name for name, n in first.items() if n < max(first.values(), default=0)}
        rounds = min(len(t) for name, t in self.times.items() if name not in dropped)
        where = {"cached": "cached here, ", "table": "from the target's table, "}.get(
            self.source, "")
        listed = (FLOAT32, COST, RULES, CONTRACTIONS)  # (a cached verdict's come sorted)
        parts = [f"{name} {self.median(name) * 1e3:.3g} ms" + (
                    f" (over {DROP_SLOWER:.0%} slower: {first[name]} round"
                    f"{'s' if first[name] > 1 else ''})" if name in dropped else "") +
                 self._peak(name)
                 for name in sorted(self.times, key=lambda n: (
                     listed.index(n) if n in listed else len(listed), n))
                 if name not in (REFINED, LEAN)]
        parts += [f"{name} = {other}" for name, other in self.same_as.items()]
        if REFINED in self.times:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(self.refined_ops.items()))
            parts.append(f"{REFINED} ({ops} float32) {self.median(REFINED) * 1e3:.3g} ms"
                         f"{self._peak(REFINED)} beside {self.refined_from} "
                         f"{statistics.median(self.beside) * 1e3:.3g} ms")
        if LEAN in self.times:
            changes = ", ".join(f"{change} x{n}" for change, n in
                                sorted(self.lean_changes.items()) if n)
            parts.append(f"{LEAN} {self.lean_from} ({changes}) {self.median(LEAN) * 1e3:.3g} ms"
                         f"{self._peak(LEAN)} beside {self.lean_against} "
                         f"{statistics.median(self.lean_beside) * 1e3:.3g} ms")
        for name, (median, peak) in self.lean_others.items():
            mark = ": over float32's" if peak is not None and over_float32(
                {**self.peaks, LEAN: peak}, LEAN) else ""
            held = "" if peak is None else f" (peak {peak / 2**20:.1f} MiB{mark})"
            parts.append(f"{LEAN} {name} {median * 1e3:.3g} ms{held}, not kept")
        base = self.median(FLOAT32)
        speed = (f", {base / self.median(self.pick):.2f}x float32" if base and
                 self.pick not in (FLOAT32, REFINED, LEAN) else "")
        if base and self.pick == LEAN:
            ratio = (base / self.median(self.lean_against) *
                     statistics.median(self.lean_beside) / self.median(LEAN))
            speed = f", {ratio:.2f}x float32"
            slower = self.median(LEAN) / statistics.median(self.lean_beside) - 1.0
            if slower > MARGIN and FLOAT32 in self.peaks and LEAN in self.peaks:
                share = total_peak(self.peaks, LEAN) / total_peak(self.peaks, FLOAT32)
                price = (f": TF_MPT_MEMORY_PRICE={self.memory_price:g}"
                         if self.memory_price and ratio < 1.0 else "")
                speed += (f" ({slower:.0%} slower than {self.lean_against}, holding "
                          f"{share:.2f}x float32's peak{price})")
        if base and self.pick == REFINED:  # (two ratios, each measured in one set of rounds)
            ratio = (base / self.median(self.refined_from) *
                     statistics.median(self.beside) / self.median(REFINED))
            speed = f", {ratio:.2f}x float32"
        predicted = self.same_as.get(self.predicted, self.predicted)
        over = sorted(name for name in self.times if over_float32(self.peaks, name) and
                      self.median(name) < (self.median(self.pick) or 0))
        held = (f" (faster but over float32's peak: {', '.join(over)})" if over else "")
        how = ", compiled by XLA as the step runs" if self.compiled else ""
        return (f"graph timing ({where}median of {rounds} rounds{how}): {', '.join(parts)}; "
                f"picked {self.pick}{speed}" + ("" if self.pick == predicted else
                                         f" over the prediction ({self.predicted})") + held)

    def _describe_untimed(self):
        """The line of a verdict not timed: why, and where its peaks were measured instead
        (decision's memory check of a graph too slow to time), what they were and what was
        kept."""
        text = f"graph not timed ({self.why})"
        if not any(name in self.peaks for name in (FLOAT32, self.predicted)):
            return f"{text}: kept the prediction ({self.predicted})"
        parts = [f"{name}{self._peak(name)}" for name in (FLOAT32, self.predicted)
                 if name in self.peaks]
        if LEAN in self.peaks:
            changes = ", ".join(f"{change} x{n}" for change, n in
                                sorted(self.lean_changes.items()) if n)
            parts.append(f"{LEAN} {self.lean_from} ({changes}){self._peak(LEAN)}")
        kept = {FLOAT32: "float32", LEAN: f"{LEAN} {self.lean_from}"}.get(
            self.pick, f"the prediction ({self.predicted})")
        where = "cached here: " if self.source == "cached" else ""
        return (f"{text}; {where}its peaks measured instead (one traced run each): "
                f"{', '.join(parts)}; kept {kept}, "
                + ("the only one within float32's peak" if self.pick == FLOAT32 else
                   "within float32's peak") + " (its speed not measured)")

    def _peak(self, name):
        """' (peak 12.3 MiB)' where `name`'s step peak was measured, ' (peak 12.3 MiB: over
        float32's)' where it is over float32's by more than PEAK_SLACK."""
        if name not in self.peaks:
            return ""
        over = "" if name == FLOAT32 or not over_float32(self.peaks, name) else \
            ": over float32's"
        return f" (peak {self.peaks[name] / 2**20:.1f} MiB{over})"

    def to_dict(self):
        return {"times": {k: list(v) for k, v in self.times.items()}, "pick": self.pick,
                "predicted": self.predicted, "why": self.why, "same_as": dict(self.same_as),
                "source": self.source, "refined": list(self.refined),
                "refined_from": self.refined_from, "refined_ops": dict(self.refined_ops),
                "beside": list(self.beside), "peaks": dict(self.peaks),
                "lean_from": self.lean_from, "lean_against": self.lean_against,
                "lean_beside": list(self.lean_beside), "lean_changes": dict(self.lean_changes),
                "lean_others": {k: list(v) for k, v in self.lean_others.items()},
                "memory_price": self.memory_price, "compiled": self.compiled}


def total_peak(peaks, name):
    """Candidate `name`'s measured peak: its step peak plus peaks[RESIDENT], the bytes every
    candidate holds alike."""
    return peaks[name] + peaks.get(RESIDENT, 0)


def over_float32(peaks, name):
    """Whether candidate `name`'s measured peak (total_peak) is over PEAK_SLACK above
    float32's."""
    return FLOAT32 in peaks and name in peaks and \
        total_peak(peaks, name) > total_peak(peaks, FLOAT32) * (1.0 + PEAK_SLACK)


def pick(times, predicted, peaks=None, least=False, price=0.0):
    """The candidate to keep from {candidate: per-round seconds}: the fastest median, unless
    the prediction's is within MARGIN of it. With `peaks` ({candidate: step peak bytes}, and
    RESIDENT): only among the candidates not over float32's (over_float32; float32 never
    is), and among those within MARGIN of the fastest, the ones holding least (within
    PEAK_SLACK of the lowest total) first: a tie in time goes to memory. With `least`
    (TF_MPT_MEMORY=least) and peaks: among the candidates not slower than float32 (their
    median not above float32's times one plus `price`, TF_MPT_MEMORY_PRICE), the one
    holding least (within PEAK_SLACK: the fastest of those)."""
    medians = {name: statistics.median(t) for name, t in times.items()
               if not (peaks and over_float32(peaks, name))}
    if least and peaks and FLOAT32 in medians and set(medians) <= set(peaks):
        fast_enough = [name for name, m in medians.items()
                       if m <= medians[FLOAT32] * (1.0 + price)]
        fewest = min(total_peak(peaks, name) for name in fast_enough)
        return min((name for name in fast_enough
                    if total_peak(peaks, name) <= fewest * (1.0 + PEAK_SLACK)),
                   key=medians.get)
    fastest = min(medians, key=medians.get)
    near = {name for name, m in medians.items() if m <= medians[fastest] * (1.0 + MARGIN)}
    if peaks and near <= set(peaks):
        least = min(total_peak(peaks, name) for name in near)
        near = {name for name in near if total_peak(peaks, name) <= least * (1.0 + PEAK_SLACK)}
        if predicted in near:
            return predicted
        return min(near, key=medians.get)
    if predicted in medians and medians[predicted] <= medians[fastest] * (1.0 + MARGIN):
        return predicted
    return fastest


def clear_winner(times):
    """After MIN_ROUNDS: the fastest median's slowest run is below every other candidate's
    fastest run (more rounds would not change the pick)."""
    if len(times) < 2 or min(len(t) for t in times.values()) < MIN_ROUNDS:
        return False
    medians = {name: statistics.median(t) for name, t in times.items()}
    best = min(medians, key=medians.get)
    return all(max(times[best]) < min(t) for name, t in times.items() if name != best)


def runnable(graph_def, fetches):
    """(the fetches whose runs stay in a sandbox, the main-graph nodes those need). A fetch
    that needs an op with effects outside the sandbox (a SavedModel's saver, a summary
    writer) or an input with no made-up value (a string: a saver's file name) is left out;
    NotTimed where none is left."""
    view = {node.name: node for node in graph_def.node}
    library = {f.signature.name: f for f in graph_def.library.function}
    kept, needed, unsafe = [], set(), set()
    for fetch in fetches:
        if fetch not in view or _initializer_only(view, fetch) or _variable_initializer(
                view, fetch):
            continue  # (an initializer runs once, not every step: not timed)
        mine, stack = set(), [fetch]
        while stack:
            name = stack.pop()
            if name in mine:
                continue
            mine.add(name)
            for ref in view[name].input:
                source = ref.lstrip("^").partition(":")[0]
                if source in view and source not in mine:
                    stack.append(source)
        nodes, functions, stack = [view[n] for n in mine], set(), [view[n] for n in mine]
        while stack:
            node = stack.pop()
            for name in [node.op] + [f.name for f in _function_library.called_functions(node)]:
                if name in library and name not in functions:
                    functions.add(name)
                    stack.extend(library[name].node_def)
                    nodes.extend(library[name].node_def)
        found = _step_timing.unsafe_ops(nodes, library, _SAFE_REF_STATEFUL,
                                        _SAFE_REF_PREFIXES) | {
            f"Placeholder of {types_pb2.DataType.Name(view[n].attr['dtype'].type)}"
            for n in mine if view[n].op == "Placeholder" and
            view[n].attr["dtype"].type not in _MADE_UP_DTYPES}
        if found:
            unsafe |= found
            continue
        kept.append(fetch)
        needed |= mine
    if not kept:
        raise NotTimed(f"its fetches need op(s) with effects outside its own state: "
                       f"{', '.join(sorted(unsafe)[:5]) or 'no fetch found'}")
    return kept, needed


def _variable_initializer(view, name):
    """Whether node `name` is a variable's initializer: `<variable>/Assign` assigning to
    `<variable>` (a graph's sinks when no fetches are given)."""
    return _graph_view.initialized_variable(
        view[name], lambda n: view[n].op if n in view else None) is not None


def _initializer_only(view, name, seen=None):
    """Whether node `name` is a NoOp grouping only variable assignments (a TF1
    `global_variables_initializer`), directly or through other such NoOps."""
    node = view[name]
    if node.op != "NoOp" or not node.input:
        return False
    seen = set() if seen is None else seen
    seen.add(name)
    for ref in node.input:
        source = ref.lstrip("^").partition(":")[0]
        if source in seen or source not in view:
            continue
        op = view[source].op
        if op == "NoOp":
            if not _initializer_only(view, source, seen):
                return False
        elif op not in _graph_view.INITIALIZING_OPS:
            return False
    return True


def made_up_inputs(graph_def, needed, batch, seed=0):
    """{placeholder name: array} for the Placeholders among `needed`: normal noise for floats,
    zeros for integers and booleans (a valid index or label); an unknown leading dimension is
    `batch`. Raises NotTimed where no value can be made."""
    from tensorflow.python.framework import dtypes  # pylint: disable=import-outside-toplevel
    rng = np.random.RandomState(seed)
    values, total = {}, 0
    for node in graph_def.node:
        if node.name not in needed or node.op != "Placeholder":
            continue
        shape = node.attr["shape"].shape if "shape" in node.attr else None
        if shape is None or shape.unknown_rank:
            raise NotTimed(f"input {node.name} has an unknown rank")
        dims = [d.size for d in shape.dim]
        if dims and dims[0] < 0 and batch:
            dims[0] = batch
        if any(d < 0 for d in dims):
            raise NotTimed(f"input {node.name} has shape {[d.size for d in shape.dim]}: a "
                           "size other than the batch is unknown")
        dtype = dtypes.as_dtype(node.attr["dtype"].type)
        if dtype.is_floating:
            value = rng.standard_normal(dims).astype(dtype.as_numpy_dtype)
        elif dtype.is_integer or dtype.is_bool:
            value = np.zeros(dims, dtype.as_numpy_dtype)
        else:
            raise NotTimed(f"input {node.name} is {dtype.name}: no made-up value for it")
        total += value.nbytes
        if total > _step_timing.MAX_COPY_BYTES:
            raise NotTimed(f"its made-up inputs would take over "
                           f"{_step_timing.MAX_COPY_BYTES >> 20} MiB")
        values[node.name] = value
    return values


class _Sandbox:
    """One candidate's Session: its GraphDef imported with the made-up inputs in variables and
    its own variables given random values."""

    def __init__(self, graph_def, inputs, fetches, needed):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        self.graph = tf.Graph()
        with self.graph.as_default():
            made, input_map = [], {}
            for name, value in inputs.items():
                variable = tf.Variable(value, trainable=False, name="tf_mpt_timing_input")
                made.append(variable.initializer)
                input_map[f"{name}:0"] = variable.value()
            try:
                tf.graph_util.import_graph_def(graph_def, input_map=input_map, name="")
            except (ValueError, TypeError, tf.errors.OpError) as error:
                raise NotTimed(f"a candidate did not import ({error})") from None
            rng = np.random.RandomState(1)
            for node in graph_def.node:
                if node.name in needed and node.op in ("VariableV2", "Variable",
                                                       "VarHandleOp"):
                    made.append(_initializer(self.graph, node, rng))
            self.init = tf.group(*made)
            # (a fetched placeholder, a signature's input, is fed: nothing to run)
            self.targets = [self.graph.get_operation_by_name(name) for name in fetches
                            if name not in inputs]
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.options = tf.compat.v1.RunOptions(
            timeout_in_ms=_step_timing._RUN_TIMEOUT_MS)  # pylint: disable=protected-access
        self.session.run(self.init, options=self.options)

    def run(self):
        self.session.run(self.targets, options=self.options)

    def peak(self):
        """Bytes: the step peak of one traced run (step_peak_bytes)."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        metadata = tf.compat.v1.RunMetadata()
        self.session.run(self.targets, options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
            timeout_in_ms=self.options.timeout_in_ms), run_metadata=metadata)
        return step_peak_bytes(metadata)

    def profile(self, runs):
        """{node name: seconds}: the fastest of `runs` traced runs, per node."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        options = tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
            timeout_in_ms=self.options.timeout_in_ms)
        metadatas = []
        for _ in range(runs):
            metadatas.append(tf.compat.v1.RunMetadata())
            self.session.run(self.targets, options=options, run_metadata=metadatas[-1])
        return _step_timing.fastest_node_seconds(metadatas)

    def close(self):
        self.session.close()


def _variable_bytes(graph_def, needed):
    """Bytes of the variables among `needed` (their static shapes; 0 for a shape not known:
    such a variable is refused when its sandbox is made)."""
    from tensorflow.python.framework import dtypes  # pylint: disable=import-outside-toplevel
    total = 0
    for node in graph_def.node:
        if node.name in needed and node.op in _graph_view.VARIABLE_OPS and "shape" in node.attr:
            dims = [d.size for d in node.attr["shape"].shape.dim]
            if all(d >= 0 for d in dims) and not node.attr["shape"].shape.unknown_rank:
                try:
                    size = dtypes.as_dtype(node.attr["dtype"].type).size
                except (TypeError, ValueError):
                    continue
                total += int(np.prod(dims, dtype=np.int64)) * size
    return total


def _initializer(graph, node, rng):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    dtype = tf.as_dtype(node.attr["dtype"].type)
    shape = node.attr["shape"].shape
    dims = [d.size for d in shape.dim]
    if shape.unknown_rank or any(d < 0 for d in dims):
        raise NotTimed(f"variable {node.name} has no static shape")
    if dtype.is_floating:
        value = (0.05 * rng.standard_normal(dims)).astype(dtype.as_numpy_dtype)
    elif dtype.is_integer or dtype.is_bool:
        value = np.zeros(dims, dtype.as_numpy_dtype)
    else:
        raise NotTimed(f"variable {node.name} is {dtype.name}: no made-up value for it")
    handle = graph.get_tensor_by_name(f"{node.name}:0")
    if node.op == "VarHandleOp":
        return tf.raw_ops.AssignVariableOp(resource=handle, value=value)
    return tf.compat.v1.assign(handle, value).op


# What the timing loop reads (tests put an injected clock and sandbox here: a verdict never
# comes from the test machine's clock).
_clock = time.perf_counter


def time_candidates(graph_defs, fetches, batch, budget_seconds, peaks=None, runs=None):
    """Times each of {candidate: GraphDef} (one graph's colourings: the same inputs and
    fetches) on this CPU. Returns {candidate: (seconds per run, ...)}; raises NotTimed where
    that cannot be done safely. `peaks`, a dict: filled with {candidate: the step peak in
    bytes of one traced run after the rounds} (step_peak_bytes) and peaks[RESIDENT]. `runs`:
    what runs them in place of `rounds` (first_runs: for their peaks alone)."""
    clock = _clock
    runs = runs or rounds

    def use(boxes, resident):
        times = runs({name: box.run for name, box in boxes.items()}, budget_seconds, clock)
        if peaks is not None:
            peaks.update((name, box.peak()) for name, box in boxes.items())
            peaks[RESIDENT] = resident
        return times
    return _in_sandboxes(graph_defs, fetches, batch, use)


step_peak_bytes = _step_timing.step_peak_bytes


def profile_candidates(graph_defs, fetches, batch):
    """{candidate: {node name: seconds}}: per node of each of {candidate: GraphDef}, the
    fastest of PROFILE_RUNS traced runs after a warm-up run (the node names Grappler's graph
    runs: a fused kernel is named as the last node it fuses)."""
    def profile(boxes, _):
        for box in boxes.values():
            box.run()
        return {name: box.profile(PROFILE_RUNS) for name, box in boxes.items()}
    return _in_sandboxes(graph_defs, fetches, batch, profile)


def _in_sandboxes(graph_defs, fetches, batch, use):
    """use({candidate: sandbox}, resident bytes: its variables' and inputs') with a sandbox of
    each of {candidate: GraphDef} (closed after); NotTimed where they cannot be made or run
    safely."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    sandbox_type = _Sandbox
    first = next(iter(graph_defs.values()))
    fetches, needed = runnable(first, fetches)
    for graph_def in graph_defs.values():
        if runnable(graph_def, fetches)[0] != fetches:
            raise NotTimed("a candidate's fetches need op(s) the float32 graph's do not")
    inputs = made_up_inputs(first, needed, batch)
    resident = _variable_bytes(first, needed) + sum(value.nbytes for value in inputs.values())
    copies = len(graph_defs) * resident
    if copies > _step_timing.MAX_COPY_BYTES:
        raise NotTimed(f"the {len(graph_defs)} candidates' copies of its variables and inputs "
                       f"would take {copies / 2**20:.0f} MiB, over "
                       f"{_step_timing.MAX_COPY_BYTES >> 20} MiB")
    sandboxes = {}
    try:
        with _state.bypass():  # the automatic path leaves these Sessions as they are
            try:
                for name, graph_def in graph_defs.items():
                    sandboxes[name] = sandbox_type(graph_def, inputs, fetches, needed)
                return use(sandboxes, resident)
            except tf.errors.OpError as error:
                raise NotTimed(f"a run on made-up inputs failed ({_first_line(error)})") \
                    from None
    finally:
        for sandbox in sandboxes.values():
            sandbox.close()


def slower_ops(half_profile, float32_profile, half_nodes):
    """{op type: (half seconds, float32 seconds, node names)} for the op types whose half
    nodes (`half_nodes`: {node name: op type}, the converted nodes of a candidate) took more
    than (1 + SLOWER) times their float32 time in the profiles ({node name: seconds}), by at
    least FLOOR_SECONDS. Nodes absent from either profile (fused into another kernel) are
    not counted."""
    sums = {}
    for name, op in half_nodes.items():
        if name in half_profile and name in float32_profile:
            half, single, names = sums.get(op, (0.0, 0.0, ()))
            sums[op] = (half + half_profile[name], single + float32_profile[name],
                        names + (name,))
    return {op: (half, single, tuple(sorted(names)))
            for op, (half, single, names) in sorted(sums.items())
            if half > single * (1.0 + SLOWER) and half - single >= FLOOR_SECONDS}


def rounds(runners, budget_seconds, clock=None):
    """Times {candidate: run()}: one warm-up run each (Grappler, kernel set-up), then rounds
    of one run each, the order rotating, until the budget is spent, MAX_ROUNDS, or a clear
    winner. Where MIN_ROUNDS rounds would not fit in the budget, the candidates over
    DROP_SLOWER slower than the fastest in every round so far run no more (their times stay,
    fewer); TooSlow (a NotTimed) where the others' still would not fit. Returns {candidate:
    (seconds per run, ...)}; NotTimed where a run fails."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    clock = clock or _clock
    try:
        first_runs(runners, clock=clock)  # (the warm-up)
        times = {name: [] for name in runners}
        order, start = list(runners), clock()
        for index in range(MAX_ROUNDS):
            for name in order:
                began = clock()
                runners[name]()
                times[name].append(clock() - began)
            order = order[1:] + order[:1]
            spent = clock() - start
            left = MIN_ROUNDS - index - 1
            if left > 0 and spent + left * _round_seconds(times, order) > budget_seconds:
                racing = _racing(times, order)
                if len(racing) == len(order) or \
                        spent + left * _round_seconds(times, racing) > budget_seconds:
                    raise TooSlow(f"one round of the {len(order)} candidates takes "
                                  f"{_round_seconds(times, order):.1f} s: {MIN_ROUNDS} rounds "
                                  f"do not fit in the {budget_seconds:.3g} s the rounds may "
                                  "spend of the budget (TF_MPT_TIMING_BUDGET)")
                _log.debug("graph timing: %s over %.0f%% slower than the fastest, run no more "
                           "rounds", ", ".join(n for n in order if n not in racing),
                           DROP_SLOWER * 100)
                order = racing
            if spent > budget_seconds or clear_winner({name: times[name] for name in order}):
                break
            if _state.STATE.deferred_signals:  # (a rewrite inside Session.run defers them)
                raise NotTimed("a signal arrived: it is handled when the run returns, and the "
                               "timing stops")
    except tf.errors.OpError as error:
        raise NotTimed(f"a run on made-up inputs failed ({_first_line(error)})") from None
    return {name: tuple(t) for name, t in times.items()}


def first_runs(runners, budget_seconds=0.0, clock=None):
    """Runs each of {candidate: run()} once (its first run: Grappler, kernel set-up) and
    returns {candidate: (its seconds,)}: no timing (a first run says little of the speed);
    `rounds`' warm-up, and what a traced run's peak needs before it (decision's memory check
    of a graph too slow to time). NotTimed where a run fails."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    del budget_seconds  # (one run each, whatever the budget)
    clock = clock or _clock
    found = {}
    try:
        for name, run in runners.items():
            began = clock()
            run()
            found[name] = (clock() - began,)
            _log.debug("graph timing: %s's warm-up run took %.2f s", name, found[name][0])
    except tf.errors.OpError as error:
        raise NotTimed(f"a run on made-up inputs failed ({_first_line(error)})") from None
    return found


def _round_seconds(times, order):
    """The seconds a round of the candidates `order` takes: the sum of their mean runs."""
    return sum(statistics.mean(times[name]) for name in order)


def _racing(times, order):
    """The candidates of `order` not slower than the fastest by over DROP_SLOWER in every
    round so far (their order kept)."""
    rounds_run = min(len(times[name]) for name in order)
    fastest = [min(times[name][k] for name in order) for k in range(rounds_run)]
    return [name for name in order
            if not all(times[name][k] > fastest[k] * (1.0 + DROP_SLOWER)
                       for k in range(rounds_run))]


def _first_line(error):
    """'<error type>: <the first line of its message that says what failed>'."""
    lines = [line for line in error.message.splitlines()
             if line.strip() and not line.startswith(
                 ("Graph execution error", "Detected at node", "  "))]
    return f"{type(error).__name__}: {(lines or [''])[0][:200]}"
