"""Choosing which colouring of a graph runs: candidates, their measurement, the verdict.

    decision.py       decide: the decision for one graph, a short loop over the stages on
                      one Choice (choice.py), the cache read and written
    choice.py         the Choice: one graph's decision in progress, as the stages pass it on
    when.py           which graphs and traced steps have their candidates timed
    candidates.py     the candidates: float32, the op lists', the cost model's, contractions
                      only, refined, lean; each made by the painter or a transform
    policy.py         the Policy: every threshold and the user's settings, built once from
                      the Config; the rules that read them (pick, over_float32, slower_ops)
    recipes.py        how each candidate's graph is made (a Recipe: a base colouring, nodes
                      kept float32, a lean version), made again on a replay
    ledger.py         the Ledger: every measurement, append-only (measure() records what a
                      Timer measured); the budget
    verdict.py        the Verdict: every time and peak, the pick, one line that says them
    stages/           STAGES, in order: the first rounds (first.py), lean versions
                      (lean.py), smaller ones (smaller.py), the refinement (refinement.py);
                      the peaks of a graph too slow to time (untimed.py)
    timers/           measuring only: the Timer protocol (protocol.py) and its two kinds,
                      a GraphDef's Session sandboxes (graphs.py: GraphTimer) and a traced
                      step's copies of its variables (step_timer.py: StepTimer, steps.py, or
                      as XLA compiles it, compiled.py); the rounds (rounds.py); what a
                      sandbox may run (safety.py)
    transforms/       a candidate's graph rearranged to hold fewer bytes at its peak (lean
                      versions: late casts, ordered products, saved in half, ...)
    cache.py          verdicts kept per machine, or in a cost table file

The painter (tf_mpt.rewrite) makes each candidate's graph; nothing here paints.
"""
