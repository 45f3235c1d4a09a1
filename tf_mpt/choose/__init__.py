"""Choosing which colouring of a graph runs: candidates, their measurement, the verdict.

    decision.py       the decision for one graph (decide): candidates, the budget, the
                      stages (first rounds, lean versions, smaller ones, the refinement),
                      the verdict; when a traced step is timed (step_reason)
    graph_timing.py   a GraphDef's candidates run in Session sandboxes on made-up inputs;
                      the rounds, the pick and the Verdict
    step_timing.py    a traced tf.function's candidates run on copies of its variables (as
                      XLA compiles them where the step is jit_compile)
    lean.py           a candidate's graph rearranged to hold fewer bytes at its peak
    cache.py          verdicts kept per machine, or in a cost table file

The painter (tf_mpt.rewrite) makes each candidate's graph; nothing here paints.
"""
