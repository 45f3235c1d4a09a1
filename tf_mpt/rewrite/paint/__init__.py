"""Deciding which (node, type-attr) vertices go half: analysis only, no graph edits.

    rules.py          Grappler's painting passes over the allow / infer / deny / clear lists
    tensor_lists.py   paint flows through a TensorList from its writers to its readers
    tensor_arrays.py  TensorArrays and Stacks go half as a whole where that saves Casts
    cost.py           the cost model: un-paints clusters whose Casts cost more than they save
    flops.py          floating-point operations of the ops that dominate a model's time
"""
