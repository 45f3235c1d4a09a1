"""Transforms of a candidate's graph: lean versions, rearranged to hold fewer bytes at its peak.

Nine changes, each leaving every op's dtype what the candidate decided except where said:

    late casts       a half Cast of a value that lives across the step anyway (a variable's
                     read, a constant, a fed input, a stack of a loop's forward values: see
                     HELD_SOURCES, through Identity / Enter) gets one Cast per consumer, each
                     run only once the consumer's other input is ready (a control input from
                     its producer). The half copy of a weight is then made where it is used
                     instead of being held from the forward pass to the backward pass, and a
                     loop's iterations do not cast ahead of the ones that use the copy.
    ordered products a half matrix product read only as float32 (a weight's gradient on its
                     way to a float32 optimizer) runs after the products that read its
                     inputs and after the previous such product's Casts, and its Casts run
                     after those products' readers: a weight gradient is held in both
                     dtypes only while it is cast, not beside the next, nor beside an
                     activation that the input gradient's ReluGrad is about to free.
    float32 products (the leaner version) such a product computes in float32: its result is
                     never held in both dtypes; its inputs (activations, the incoming
                     gradient) are cast to float32 instead.
    saved in half    a float32 value that a late reader (one that waits for an input at least
                     late_levels ops deeper: the backward pass's reader of a forward
                     activation) keeps alive is held in half instead: each late reader reads a
                     Cast to float32 of the value's half copy, made once its deepest other
                     input is ready. The half copy is the value's own source where the value
                     is a Cast up from half (the same numbers, bit for bit); else the
                     candidate's Cast of it to half, or a new one, and then only readers on
                     the lists' allow, infer or clear lists (ops the lists would run in half)
                     are moved, and they read the value rounded to half.

    weights' lists   a half TensorList whose every entry is tf_mpt's Cast of a variable's
      in float32     read (a while_v2 gradient's accumulator of a weight the forward body
                     reads) goes float32: its entries are then the variable's own buffer,
                     not a copy per loop step; the gradient loop casts each read it pops.
    late casts in    the same in a functional While's bodies (while_v2: a Keras LSTM and its
      loops        gradient loop), where what lives across an iteration's work is a
                     variable's read or a value popped from a list (LOOP_HELD_SOURCES), not
                     the body's arguments: a weight's half Cast waits for the recurrent
                     state's, and iterations running side by side do not each hold a copy.
    accumulated      in the same bodies, a product summed into a loop variable (a gradient
      in order       loop's per-step weight gradient) waits for that variable, the previous
                     iteration's sum: per-step gradients are not computed ahead of the sum.
    reduced first    a reduction of a large value to a small one (a loss: the Mean of a
                     Square's Cast to float32) runs before the other readers of the value its
                     chain of element-wise ops starts from (the Square's gradient): the
                     chain's transients are not held beside the backward pass's first
                     gradients.
    anchored waits   a control input from an element-wise arithmetic op (a Cast up waiting
                     for its reader's other input; TensorFlow's own gradients of Erfc, Exp,
                     Sqrt, ... wait for their incoming gradient this way) gets a second one
                     from the op that starts the arithmetic chain (its deepest input, past
                     ops of ARITHMETIC). At run time Grappler's constant folding may rewrite
                     such an op in place (a product by a constant pushed down its chain), so
                     the name waited for becomes a constant, ready at the step's start: a
                     Keras Gelu's backward computed exp(-u^2) in the forward pass and held it
                     there (16 MiB per Gelu in a Transformer's fit step), and Casts up of
                     values saved in half ran as soon as they were made. The chain's start is
                     already waited for through the op (no new order, same values).

Their cost is speed (a Cast per use, less running side by side, float32 products), so a lean
graph is only a candidate: graph timing times it and measures its peak (tf_mpt.choose). Its
cheapest version is ordered products alone (`lean(..., only_ordered=True)`), tried first
where the fastest candidate holds more than float32.

    lean.py          lean(): the changes in order, as a version asks for them
    late_casts.py    late casts
    ordering.py      ordered products, float32 products, anchored waits
    saving.py        saved in half
    loops.py         late casts and accumulation in order inside a While's bodies
    reduce.py        reduced first
    graph_order.py   the graph's order: edges, reachability, levels, pass-through ops
"""
