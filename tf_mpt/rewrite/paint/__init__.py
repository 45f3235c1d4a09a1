"""Deciding which (node, type-attr) vertices go half: analysis only, no graph edits.

    rules.py          Grappler's painting passes over the allow / infer / deny / clear lists
    tensor_lists.py   paint flows through a TensorList from its writers to its readers
    tensor_arrays.py  TensorArrays and Stacks go half as a whole where that saves Casts
    cuts.py           min-cut Cast placement, and the cost model's decisions
    cost.py           the cost model's facts: what a vertex and a Cast cost, fusions, floors
    shapes.py         static shapes (the graph's, a function body's, an assumed batch)
    updates.py        a variable's update (an optimizer's arithmetic) keeps float32: phase 0

The kernel-time tables the cost model reads are measured and kept by tf_mpt.costs: the
painter only reads a table.
"""
