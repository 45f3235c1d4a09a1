"""decide: the decision for one graph, a short loop over the stages on one Choice.

    1. the prediction: the rewrite's colouring for the target, the cost model's where the
       target has a table (`here`, a FILE), else the op lists' (`rules`)
    2. the candidates (recipes.make_base): float32, the op lists', the cost model's,
       contractions only, and where the checks flagged an op type, rules checked; each a
       full rewrite of the same GraphDef, those whose graphs are equal timed once
    3. a stored verdict (cache.py: this CPU's, or a cost table file's), replayed where its
       pick's recipe makes the graph that was timed (GRAPH, RECIPE)
    4. else the stages (stages.STAGES, each where it applies), measuring with the Timer into
       the ledger, deciding by the Policy; a graph too slow to time has its peaks measured
       instead (stages/untimed.py)
    5. the verdict stored with its pick's recipe and graph hash, said in one INFO line, and
       in the report of the graph kept (RewriteResult.report.verdict)

A graph that cannot be timed keeps the prediction, and its verdict says why. What each stage
does, and the Policy's part in it, is in stages/__init__.py.
"""

import dataclasses
import logging

from tf_mpt._process import state as _state
from tf_mpt.choose import cache as _verdicts
from tf_mpt.choose import candidates as _candidates
from tf_mpt.choose import choice as _choice
from tf_mpt.choose import ledger as _ledger
from tf_mpt.choose import policy as _policy
from tf_mpt.choose import recipes as _recipes
from tf_mpt.choose import stages as _stages
from tf_mpt.choose import verdict as _verdict
from tf_mpt.choose.stages import untimed as _untimed
from tf_mpt.choose.timers import graphs as _graph_sandbox
from tf_mpt.choose.timers import safety as _safety
from tf_mpt.rewrite import graph_view as _graph_view
from tf_mpt.rewrite import inputs as _inputs

_log = logging.getLogger("tf_mpt.rewrite")


class _ShapeTable:
    """{node name: output shapes} read from `shapes` (a callable, called once, when first
    read)."""

    def __init__(self, shapes):
        self._shapes, self._table = shapes, None

    def get(self, name, default=None):
        if self._table is None:
            self._table = self._shapes() or {}
        return self._table.get(name, default)


# The key beside a stored verdict of a graph too slow to time (its peaks measured instead):
# the budget it was too slow for. Read again only under that budget (another is timed again).
CHECKED_BUDGET = "checked_budget"
_FLOAT32_HELD_LESS = ("graph timing: too slow to time; its half colouring and their lean "
                      "versions measured over float32's peak (TF_MPT_MEMORY)")


def _close(timer):
    """Ends a timer's sandbox where it keeps one open across stages (a traced function's)."""
    try:
        timer.close()
    except Exception as error:  # pylint: disable=broad-except
        _log.info("graph timing could not close its sandbox (%s: %s)",
                  type(error).__name__, error)


# The key beside a stored verdict that holds the hash of the graph its pick runs: a replay
# (a cached verdict's pick made again from its recipe) that makes another graph is refused,
# and the graph is timed again
GRAPH = "graph"
# The key beside it that holds how the pick's graph is made (recipes.Recipe.to_dict)
RECIPE = "recipe"


def _made(choice):
    """{RECIPE: how the verdict's pick is made, GRAPH: the hash of its graph}: what a stored
    record holds beside the verdict, for a replay to make and check."""
    pick = choice.verdict.pick
    return {RECIPE: choice.candidates[pick].recipe.to_dict(), GRAPH: _hash_of(choice, pick)}


def _hash_of(choice, pick):
    """The graph hash of candidate `pick` (hashed once: candidates.Candidate.hash), or of
    `_kept`'s graph where it is none of the candidates made."""
    if pick in choice.candidates:
        return choice.candidates[pick].hash
    return _candidates.graph_hash(_kept(choice).graph_def)


def _kept(choice):
    """The RewriteResult of the verdict's pick: the prediction's (whatever equals it),
    float32's (the graph as given), or the candidate's in `choice.candidates`."""
    verdict = choice.verdict
    if verdict.pick in (verdict.predicted, verdict.same_as.get(verdict.predicted)):
        return choice.predicted  # (the prediction's graph, whatever else equals it)
    if verdict.pick == _candidates.FLOAT32:
        return _candidates.float32_result(
            choice.graph_def, choice.predicted,
            _FLOAT32_HELD_LESS if not verdict.timed else _candidates.FLOAT32_FASTER)
    return choice.candidates[verdict.pick].result


def _replayed(verdict, known, choice):
    """`verdict` (a stored record, `known`) where its pick, made again from its recipe
    (RECIPE; a refined or lean version is added to `choice`), is the graph that was
    timed (its hash stored beside it, GRAPH); else None (the graph is timed again), said in
    one INFO line."""
    recipe = _recipes.Recipe.from_dict(known.get(RECIPE, {}))
    made = "no recipe recorded"
    if recipe is not None:
        known_candidate = choice.candidates.get(verdict.pick)
        try:
            if known_candidate is not None and known_candidate.recipe == recipe:
                candidate = known_candidate  # (a base candidate: made and hashed already)
            else:
                candidate = _candidates.Candidate.of(verdict.pick, recipe, recipe.make(choice))
            made = candidate.hash
        except Exception as error:  # pylint: disable=broad-except
            made = f"not made ({type(error).__name__}: {error})"
    if made == known.get(GRAPH):
        if verdict.pick in (_candidates.REFINED, _candidates.LEAN):
            choice.add(candidate)
        return verdict
    _log.info("graph timing: a %s verdict's pick (%s) made again is not the graph that was "
              "timed (%s); it is not replayed", verdict.source, verdict.pick,
              "no graph recorded" if GRAPH not in known else
              made if made.startswith(("not", "no ")) else "another graph")
    return None


def decide(graph_def, predicted, rewrite, config, fetches, lists, target, timer=None,
           label=None, shapes=None):
    """The verdict for one graph: `predicted` (a RewriteResult) unless timing its candidates
    on this CPU (or a verdict cached here, or one a cost table file holds) finds another
    faster. `rewrite(target, lists, graph)` returns a candidate's RewriteResult (target
    'rules', or None: the prediction's; lists None: `lists`, the prediction's; graph None:
    `graph_def`). The stages (stages.STAGES) run in turn on one Choice, each where it
    applies. Returns the RewriteResult kept, its report's `verdict` set (for a table without
    this graph's verdict: `predicted` as it is).

    timer: None, graph timing's sandboxes (timers.graphs.GraphTimer), its verdicts cached;
    or another timers.protocol.Timer (a traced tf.function's, on copies of its variables:
    timers.step_timer.StepTimer), its verdicts cached where its key_graph gives a graph
    (the graph the cache keys it by: a trace's names are its process's; raising NotTimed
    where it would not be timed); refined where it profiles.
    label: what the INFO line names (a tf.function). shapes: None, or a callable returning
    {node name: output shapes} of `graph_def` (a tf.function's carry its variables' shapes):
    what the lean versions size values by (None: saving.saved_in_half infers them from the
    GraphDef)."""
    dtype = predicted.report.dtype
    policy = _policy.Policy.from_config(config)
    predicted_name = _candidates.COST if predicted.report.weighed_nodes is not None \
        else _candidates.RULES
    known, source, key = None, "timed", None
    if timer is None:
        view = _graph_view.GraphView(graph_def)
        names = sorted(_inputs.fetch_node_names(fetches, view) or
                       _inputs.fetch_node_names(None, view))
        key = _verdicts.fingerprint(graph_def, names, dtype, lists, policy.batch,
                                    policy.memory_key())
        timer = _graph_sandbox.GraphTimer(names)
        if target.kind == "table" and not _verdicts.measuring_for_a_table():
            known, source = _verdicts.in_table(target.table, dtype).get(key), "table"
            if known is None:
                return predicted
        elif target.kind != "table":
            known, source = _verdicts.cached(config, dtype).get(key), "cached"
    else:
        try:  # (a traced function's, its names made the same in every process; timed on
            # this CPU, so this CPU's cache, whatever table stands in for its kernels)
            keyed = timer.key_graph(graph_def)
            key = None if keyed is None else _verdicts.fingerprint(
                keyed, ["(a traced function)"], dtype, lists, policy.batch,
                policy.memory_key())
        except Exception:  # pylint: disable=broad-except
            key = None  # (NotTimed: it is not timed either; else timed, not cached)
        if key is not None:
            known, source = _verdicts.cached(config, dtype).get(key), "cached"
    # (the lean transforms' lists and shapes: which readers may read a value rounded to half,
    # and the sizes of the values; a tf.function's shapes carry its variables')
    lean_inputs = (lists, _ShapeTable(shapes) if shapes is not None else None)
    choice = _choice.Choice(graph_def, predicted, predicted_name, rewrite, lists, policy,
                            timer, lean_inputs)
    try:
        _recipes.make_base(choice)
        if known is not None:
            choice.verdict = _from_record(choice, known, source)
            if choice.verdict is None and source == "table":
                return predicted  # (a table's pick is not timed here again)
        if choice.verdict is None:
            for stage in _stages.STAGES:
                if stage.applies(choice):
                    choice.verdict = _run(stage, choice)
            choice.verdict = _with_ledger(choice)
            if key is not None:
                _verdicts.store(config, dtype, key, {**choice.verdict.to_dict(),
                                                     **_made(choice)})
    except _safety.NotTimed as error:
        choice.verdict = _verdict.Verdict(predicted_name, predicted_name, str(error),
                                          policy=policy)
        if isinstance(error, _safety.TooSlow) and policy.bounded:
            choice.verdict = _with_ledger(choice, _untimed.within_float32_untimed(choice))
            if key is not None and choice.verdict.peaks:
                _verdicts.store(config, dtype, key,
                                {**choice.verdict.to_dict(), CHECKED_BUDGET: policy.budget,
                                 **_made(choice)})
    except Exception as error:  # pylint: disable=broad-except
        _state.warn_once(("graph_timing", type(error).__name__),
                         "tf_mpt could not time a graph's candidate colourings (%s: %s); it "
                         "keeps the predicted one", type(error).__name__, error)
        choice.verdict = _verdict.Verdict(predicted_name, predicted_name,
                                          f"timing failed: {type(error).__name__}: {error}",
                                          policy=policy)
    finally:
        _close(timer)
    verdict = choice.verdict
    if label is None:
        _log.info("%s", verdict.describe())
    elif verdict.timed:
        _log.info("tf_mpt timed %s on copies of its variables: %s", label, verdict.describe())
    else:
        _log.info("tf_mpt did not time %s: %s", label, verdict.describe())
    kept = _kept(choice)
    # the target decided for, and what its prediction weighed, whichever candidate is kept
    report = dataclasses.replace(kept.report, verdict=verdict, target=predicted.report.target,
                                 weighed_nodes=predicted.report.weighed_nodes,
                                 unweighed_nodes=predicted.report.unweighed_nodes,
                                 unweighed_why=predicted.report.unweighed_why)
    return type(kept)(kept.graph_def, report, kept.modified)


def _with_ledger(choice, verdict=None):
    """`verdict` (the choice's where None) with the choice's ledger, as the record keeps it."""
    return dataclasses.replace(verdict or choice.verdict, ledger=choice.ledger.snapshot())


def _run(stage, choice):
    """The verdict after `stage`: its own, or, where it fails and may (stage.fails_as), the
    verdict as it was, the failure said in one INFO line."""
    if not stage.fails_as:
        return stage.run(choice)
    try:
        return stage.run(choice)
    except Exception as error:  # pylint: disable=broad-except
        # (the pick so far stands; NotTimed: a run failed or was stopped)
        _log.info("%s (%s: %s)", stage.fails_as.format(pick=choice.verdict.pick),
                  type(error).__name__, error)
        return choice.verdict


def _from_record(choice, known, source):
    """The verdict a stored record (`known`, from `source`: 'cached' or 'table') gives
    `choice`, or None where it does not apply: a record this version cannot read; a timed
    one that did not time every candidate there is now (the prediction changed: a table
    measured since); an untimed one (a graph too slow to time, its peaks measured instead)
    for another budget or other candidates; one whose pick, made again, is another graph
    (_replayed)."""
    verdict = _verdict.Verdict.from_dict(known, source, choice.policy)
    if verdict is None:
        return None
    if not verdict.timed:
        if known.get(CHECKED_BUDGET) != choice.policy.budget or \
                verdict.predicted != choice.predicted_name or \
                not set(verdict.peaks) - {_ledger.RESIDENT, _candidates.LEAN} <= \
                set(choice.graphs) or \
                (verdict.lean_from and verdict.lean_from not in choice.graphs):
            return None
    elif not set(choice.graphs) <= set(verdict.times):
        return None
    return _replayed(dataclasses.replace(verdict, same_as=choice.same_as), known, choice)
