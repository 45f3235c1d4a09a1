"""Cast placement by minimum cut: where the clear ops between fixed float32 and fixed half
ends may take either colour, choose the colouring whose Casts move the fewest bytes.

The painting rules colour clear ops greedily (a clear op next to a half op goes half), as
Grappler does. That can cost a Cast it did not need:

    x -> Relu(clr1) -> [MatMul]        x a float32 input, fetch1/fetch2 float32 outputs,
    x -> Relu(clr2) -> Relu(clr4) -> fetch2          ShapeN ties clr1 and clr2 to one dtype
    ShapeN(clr1, clr2)

Greedy: clr1, clr2, clr4 half: Casts x->half, MatMul->float32, clr4->float32 (3). The
cheapest: clr1 float32, Cast clr1->half before the MatMul, MatMul->float32 (2).

Model. Each *free* vertex (a clear-list candidate, not deny, not a loop or tensor-list op)
is half (source side) or float32 (sink side); every other vertex is fixed at its paint. A
tensor (one output of a vertex) needs a Cast to float32 if its producer is half and some
consumer float32, and one to half if the producer is float32 and some consumer half (one
Cast per tensor and target dtype, shared by its consumers); each costs the tensor's elements
(1 each when a shape in the region is not static). Both are cut costs of a two-terminal
graph with one auxiliary node per tensor and direction:

    producer -w-> a -inf-> each consumer     (cut iff producer half and a consumer float32)
    each consumer -inf-> b -w-> producer     (cut iff producer float32 and a consumer half)

so a maximum flow gives the cheapest colouring of each connected region of free vertices.
A region is recoloured only if that strictly lowers its cost (ties keep the rules' colours,
which match Grappler's), and among the cheapest colourings the one with the most half.
"""

import collections

from tf_mpt.rewrite.paint import cost as _cost

_INF = float("inf")
# A region larger than this keeps the rules' colours (the flow is quadratic at worst; real
# regions between allow/infer ops are a handful of clear ops).
MAX_REGION = 2000
# Ops the rules colour by their own constraints (loops, tensor lists): never free here.
_FIXED_OPS = ("Enter", "RefEnter", "Exit", "RefExit", "Merge", "RefMerge", "Switch",
              "RefSwitch", "NextIteration", "RefNextIteration", "LoopCond")


def _free(p, v):
    op = p.op(v)
    return (p.v_list[v] == "clear" and not p.deny[v] and op not in _FIXED_OPS
            and not op.startswith("Tensor") and (p.converted[v] or not p.allow[v])
            and p.candidate(v))


def _tensors(p, region):
    """(producer vertex, [consumer vertex or None], node index, port) of every tensor
    produced in `region` or read by it."""
    in_region = set(region)
    producers = set(region)
    for v in region:
        producers.update(p.fanin[v])
    out = []
    for u in sorted(producers):
        i = p.v_node[u]
        out_keys = p.types[i].out_keys
        for port, key in enumerate(out_keys):
            if key is None or p.node_vertex[i].get(key) != u:
                continue
            consumers = p.consumers_of_output(i, port)
            if u in in_region or any(c in in_region for c in consumers):
                out.append((u, consumers, i, port))
    return out


class _Flow:
    """A small max-flow graph (Edmonds-Karp: regions are tens of vertices)."""

    def __init__(self):
        self.capacity = collections.defaultdict(float)
        self.adjacent = collections.defaultdict(set)

    def edge(self, a, b, capacity):
        if a == b or capacity <= 0:
            return
        self.capacity[a, b] += capacity
        self.adjacent[a].add(b)
        self.adjacent[b].add(a)

    def max_flow(self, source, sink):
        total = 0.0
        while True:
            parent = {source: None}
            queue = collections.deque([source])
            while queue and sink not in parent:
                a = queue.popleft()
                for b in self.adjacent[a]:
                    if b not in parent and self.capacity[a, b] > 1e-12:
                        parent[b] = a
                        queue.append(b)
            if sink not in parent:
                return total
            path, b = [], sink
            while parent[b] is not None:
                path.append((parent[b], b))
                b = parent[b]
            pushed = min(self.capacity[e] for e in path)
            if pushed == _INF:
                return _INF
            for a, b in path:
                self.capacity[a, b] -= pushed
                self.capacity[b, a] += pushed
            total += pushed

    def reaches(self, target):
        """Nodes with a residual path to `target`."""
        found, stack = {target}, [target]
        while stack:
            b = stack.pop()
            for a in self.adjacent[b]:
                if a not in found and self.capacity[a, b] > 1e-12:
                    found.add(a)
                    stack.append(a)
        return found


def _cost_of(tensors, weights, half):
    total = 0.0
    for (u, consumers, _, _), w in zip(tensors, weights):
        colours = {half(c) for c in consumers}
        if half(u) and False in colours or not half(u) and True in colours:
            total += w
    return total


def place_clear_casts_by_minimum_cut(p):
    """Recolour regions of clear ops where fewer Cast bytes suffice (see module docstring).

    x -> Relu -> [MatMul], x -> Relu -> Relu -> fetch, ShapeN(both Relus)   becomes
    x -> Relu -> Cast -> [MatMul] ... : 2 Casts instead of 3.

    Kind: paint and un-paint (clear ops). Needs: every rule that paints half; static shapes
    (for Cast bytes; Cast counts without them).
    """
    free = {v for v in range(len(p.allow)) if _free(p, v)}
    if not free:
        return

    def fixed_half(c):
        return c is not None and p.allow[c]

    shapes = None  # built at the first region that needs a Cast: shapes cost a graph walk
    for region in (sorted(r) for r in _cost.connected_components(p, free)):
        if len(region) > MAX_REGION:
            continue
        in_region = set(region)
        tensors = _tensors(p, region)
        if not tensors or not _cost_of(tensors, [1.0] * len(tensors), fixed_half):
            continue  # no Cast around it: nothing to save
        shapes = shapes or _cost.Shapes(p.view, p.static_shapes())
        elements = [shapes.elements(i, port) for _, _, i, port in tensors]
        known = all(e is not None for e in elements)
        weights = [float(e) for e in elements] if known else [1.0] * len(tensors)
        current = _cost_of(tensors, weights, fixed_half)
        flow, source, sink = _Flow(), "half", "float32"

        def node(c):
            if c is not None and c in in_region:
                return c
            return source if fixed_half(c) else sink

        for k, ((u, consumers, _, _), w) in enumerate(zip(tensors, weights)):
            a, b = ("a", k), ("b", k)
            flow.edge(node(u), a, w)
            for c in consumers:
                flow.edge(a, node(c), _INF)
                flow.edge(node(c), b, _INF)
            flow.edge(b, node(u), w)
        best = flow.max_flow(source, sink)
        if not best < current - 1e-9:
            continue
        stays_float32 = flow.reaches(sink)
        saving = (f"its Casts move {best:g} instead of {current:g} elements" if known
                  else f"{best:g} Cast(s) instead of {current:g} (shapes not static)")
        for v in region:
            half = v not in stays_float32
            if half and not p.allow[v]:
                p.paint_allow(v, f"minimum cut: half here, the region of {len(region)} "
                                 f"clear op(s) then needs the fewest Casts: {saving}")
            elif not half and p.allow[v]:
                p.unpaint(v, f"minimum cut: float32 here, the region of {len(region)} "
                             f"clear op(s) then needs the fewest Casts: {saving}")
