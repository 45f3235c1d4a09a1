"""Colouring by minimum cut, two passes on one max-flow: Cast placement (below), and the
cost model (`choose_precision_by_measured_cost`: the same cut weighed in measured time).

Cast placement: where the clear ops between fixed float32 and fixed half ends may take
either colour, choose the colouring whose Casts move the fewest bytes.

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
Cast per tensor and dtype cast to, shared by its consumers); each costs the tensor's
elements (1 each when a shape in the region is not static). Both are cut costs of a two-terminal
graph with one auxiliary node per tensor and direction:

    producer -w-> a -inf-> each consumer     (cut iff producer half and a consumer float32)
    each consumer -inf-> b -w-> producer     (cut iff producer float32 and a consumer half)

so a maximum flow gives the cheapest colouring of each connected region of free vertices.
A region is recoloured only if that strictly lowers its cost (ties keep the rules' colours,
which match Grappler's), and among the cheapest colourings the one with the most half.
"""

import collections
import dataclasses
import math

from tf_mpt.costs import contractions as _contractions
from tf_mpt.rewrite.paint import cost as _cost
from tf_mpt.rewrite.paint import shapes as _shapes

_INF = float("inf")
_EPSILON = 1e-12
# Times (seconds) closer than this are equal: a femtosecond, far under any kernel's.
_TIME_EPSILON = 1e-15
# A region larger than this keeps the rules' colours (a bound on the flow's time; the clear
# regions between allow/infer ops are a handful of ops, a model's half region thousands).
MAX_REGION = 50000
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
    """A max-flow graph (Dinic's algorithm: level graph by BFS, blocking flow by DFS; fast
    on these sparse graphs of thousands of vertices)."""

    def __init__(self, epsilon):
        self.epsilon = epsilon  # a residual capacity at or under this is none
        self.index = {}
        self.heads, self.caps, self.edges_of = [], [], []

    def _node(self, a):
        k = self.index.get(a)
        if k is None:
            k = self.index[a] = len(self.edges_of)
            self.edges_of.append([])
        return k

    def edge(self, a, b, capacity):
        if a == b or capacity <= 0:
            return
        ka, kb = self._node(a), self._node(b)
        self.edges_of[ka].append(len(self.heads))
        self.heads.append(kb)
        self.caps.append(capacity)
        self.edges_of[kb].append(len(self.heads))
        self.heads.append(ka)
        self.caps.append(0.0)

    def _levels(self, s, t):
        level = [-1] * len(self.edges_of)
        level[s] = 0
        queue = collections.deque([s])
        while queue:
            a = queue.popleft()
            for e in self.edges_of[a]:
                b = self.heads[e]
                if level[b] < 0 and self.caps[e] > self.epsilon:
                    level[b] = level[a] + 1
                    queue.append(b)
        return level if level[t] >= 0 else None

    def _push(self, s, t, level, next_edge):
        """One augmenting path of the level graph (iterative DFS); the flow pushed or 0."""
        path, a = [], s
        while True:
            if a == t:
                pushed = min(self.caps[e] for e in path)
                for e in path:
                    self.caps[e] -= pushed
                    self.caps[e ^ 1] += pushed
                return pushed
            edges = self.edges_of[a]
            while next_edge[a] < len(edges):
                e = edges[next_edge[a]]
                b = self.heads[e]
                if self.caps[e] > self.epsilon and level[b] == level[a] + 1:
                    break
                next_edge[a] += 1
            else:
                if not path:
                    return 0.0
                level[a] = -1  # a dead end: never again in this phase
                e = path.pop()
                a = self.heads[e ^ 1]
                next_edge[a] += 1
                continue
            path.append(edges[next_edge[a]])
            a = self.heads[edges[next_edge[a]]]

    def max_flow(self, source, sink):
        if source not in self.index or sink not in self.index:
            return 0.0
        s, t = self.index[source], self.index[sink]
        total = 0.0
        while True:
            level = self._levels(s, t)
            if level is None:
                return total
            next_edge = [0] * len(self.edges_of)
            while True:
                pushed = self._push(s, t, level, next_edge)
                if pushed <= 0:
                    break
                if pushed == _INF:
                    return _INF
                total += pushed

    def reaches(self, target):
        """Nodes with a residual path to `target`."""
        if target not in self.index:
            return {target}
        t = self.index[target]
        found, stack = {t}, [t]
        while stack:
            b = stack.pop()
            for e in self.edges_of[b]:
                a = self.heads[e]
                if a not in found and self.caps[e ^ 1] > self.epsilon:
                    found.add(a)
                    stack.append(a)
        names = {k: a for a, k in self.index.items()}
        return {names[k] for k in found}


def _cost_of(tensors, weights, half, vertex_weights=None):
    """The cost of a colouring: the weights of the Casts it needs, plus each vertex's
    (half cost, float32 cost) from `vertex_weights` {v: (if half, if float32)}."""
    total = 0.0
    for (u, consumers, _, _), w in zip(tensors, weights):
        colours = {half(c) for c in consumers}
        if half(u) and False in colours or not half(u) and True in colours:
            total += w
    for v, (if_half, if_float32) in (vertex_weights or {}).items():
        total += if_half if half(v) else if_float32
    return total


def _minimum_cut(region, tensors, weights, fixed_half, vertex_weights=None, ties=(),
                 epsilon=_EPSILON):
    """(cheapest cost, the set of region vertices that are half in it); each pair of `ties`
    takes one colour. `epsilon`: the weights' resolution (elements: _EPSILON; seconds:
    _TIME_EPSILON / 1000)."""
    in_region = set(region)
    flow, source, sink = _Flow(epsilon), "half", "float32"

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
    for v, (if_half, if_float32) in (vertex_weights or {}).items():
        flow.edge(source, v, if_float32)  # cut when v is float32
        flow.edge(v, sink, if_half)  # cut when v is half
    for v, w in ties:
        flow.edge(node(v), node(w), _INF)
        flow.edge(node(w), node(v), _INF)
    best = flow.max_flow(source, sink)
    stays_float32 = flow.reaches(sink)
    return best, {v for v in region if v not in stays_float32}


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
        tensors = _tensors(p, region)
        if not tensors or not _cost_of(tensors, [1.0] * len(tensors), fixed_half):
            continue  # no Cast around it: nothing to save
        shapes = shapes or _shapes.Shapes(p.view, p.static_shapes())
        elements = [shapes.elements(i, port) for _, _, i, port in tensors]
        known = all(e is not None for e in elements)
        weights = [float(e) for e in elements] if known else [1.0] * len(tensors)
        current = _cost_of(tensors, weights, fixed_half)
        best, half = _minimum_cut(region, tensors, weights, fixed_half)
        if not best < current - 1e-9:
            continue
        saving = (f"its Casts move {best:g} instead of {current:g} elements" if known
                  else f"{best:g} Cast(s) instead of {current:g} (shapes not static)")
        for v in region:
            if v in half and not p.allow[v]:
                p.paint_allow(v, f"minimum cut: half here, the region of {len(region)} "
                                 f"clear op(s) then needs the fewest Casts: {saving}")
            elif v not in half and p.allow[v]:
                p.unpaint(v, f"minimum cut: float32 here, the region of {len(region)} "
                             f"clear op(s) then needs the fewest Casts: {saving}")


def _movable(p, v):
    """A vertex the measured-cost cut may colour: half now (it may go float32), or a free
    clear op (either way); never a loop or tensor-list op."""
    op = p.op(v)
    if op in _FIXED_OPS or op.startswith("Tensor"):
        return False
    return p.converted[v] or _free(p, v)


@dataclasses.dataclass
class RegionChoice:
    """What the cost model found for one region (times in seconds per run).

    Attributes:
        region: its vertices, sorted.
        over_rules: what its cheapest colouring (B) saves over its current one (R).
        half: the vertices half in B.
        why: {vertex: the phrase saying what was measured}.
        over_float32: what B saves over all float32 (F).
        float32_time: its weighed kernels' time in float32.
        rules_over_float32: what R saves over F.
        casts: {'best', 'rules', 'float32'}: the time of the Casts each colouring needs.
        elementwise: {'best', 'rules'}: what the half kernels faster than float32 that
            each colouring runs save, among ops other than matrix products and
            convolutions (element-wise ops, reductions: each costed from its op's line, a
            kernel probed alone at a few sizes); the float32 colouring runs none.
    """
    region: list
    over_rules: float
    half: set
    why: dict
    over_float32: float
    float32_time: float
    rules_over_float32: float
    casts: dict
    elementwise: dict = dataclasses.field(default_factory=dict)

    def prediction(self, colouring):
        """(seconds saved over F, seconds of kernel savings and Casts in that sum, seconds of
        kernel savings in it from ops other than contractions: elementwise) when the region
        takes `colouring` ('best', 'rules' or 'float32'); (0, 0, 0) where that is unknown (an
        allow op pinned half because its size is: float32 would cost 'infinity')."""
        if colouring == "float32":
            return 0.0, 0.0, 0.0
        saved = self.over_float32 if colouring == "best" else self.rules_over_float32
        casts = self.casts[colouring] - self.casts["float32"]
        if not (math.isfinite(saved) and math.isfinite(casts)):
            return 0.0, 0.0, 0.0
        return saved, abs(saved + casts) + abs(casts), self.elementwise.get(colouring, 0.0)


def choose_precision_by_measured_cost(p):
    """The cost model: each region of ops that may change colour gets the colouring of least
    measured time, kernels and Casts together (see cost.py); half ops whose half kernels
    lose here go float32 when that is not paid back in Casts.

    In seconds per run: a half vertex pays its kernel's half-minus-float32 time (an allow op
    whose size is unknown is pinned half), each Cast its measured time. A region with a
    tensor of unknown size keeps its colours. Over the regions it can weigh, the model
    compares three colourings: the cheapest (B), the rules' (R) and all float32 (F), and
    cost.choose_colouring picks one by its floor.

    Reads only: the target's table holds every node time it asks for (measured before any
    decision, by the orchestrator's measuring step) or none (the op's line is used).

    Kind: paint and un-paint. Needs: the rules' final paint, the Cast-count cut before it,
    and p.cost (the bound Target, shapes, noise floor in seconds).
    """
    if p.cost is None:
        return
    target, shape_table, noise_floor = p.cost
    costs = target.costs
    shapes = _shapes.Shapes(p.view, shape_table)
    movable = {v for v in range(len(p.allow)) if _movable(p, v)}

    def fixed_half(c):
        return c is not None and p.allow[c]

    specs = {v: _cost.node_spec(p, shapes, v) for v in movable}
    measured = costs.node_seconds({s for s in specs.values() if s is not None})
    node_seconds = {v: measured[s] for v, s in specs.items() if s in measured}
    weighed = []  # a RegionChoice per region the model can weigh
    for region in (sorted(r) for r in _cost.connected_components(p, movable)):
        if len(region) > MAX_REGION:
            continue
        found = _measured_region(p, shapes, target, region, fixed_half, node_seconds)
        if found is not None:
            weighed.append(found)
    saved = sum(c.over_rules for c in weighed if c.over_rules > _TIME_EPSILON)  # B over R
    over_float32 = sum(c.over_float32 for c in weighed)  # B over F
    rules_slower = sum(c.over_rules for c in weighed) > over_float32 + _TIME_EPSILON  # R > F
    floor = _cost.floor(noise_floor, sum(c.float32_time for c in weighed))
    choice = _cost.choose_colouring(saved, over_float32, rules_slower, floor)
    colourings = [choice if choice != "best" or c.over_rules > _TIME_EPSILON else "rules"
                  for c in weighed]
    parts = [c.prediction(colouring) for c, colouring in zip(weighed, colourings)]
    p.cost_prediction = tuple(sum(part[k] for part in parts) for k in range(3))
    plan = [(c.region, c.over_rules - c.over_float32, set(), c.why) if colouring == "float32"
            else (c.region, c.over_rules, c.half, c.why)
            for c, colouring in zip(weighed, colourings) if colouring != "rules"]
    assumed = getattr(shape_table, "assumed", ())
    for region, gain, half, why in plan:
        summary = (f"the region of {len(region)} op(s) then runs ~{gain * 1e6:.1f} us faster "
                   "than with the rules' colours" if gain > _TIME_EPSILON else
                   f"float32 like the rest: half would save ~{over_float32 * 1e6:.1f} us per "
                   f"run over float32 in all, under the noise floor of {floor * 1e6:.0f} us")
        if any(p.view.nodes[p.v_node[v]].name in assumed for v in region):
            summary += (f"; its batch dimension, unknown in the graph, costed as "
                        f"{shape_table.batch} (TF_MPT_COST_BATCH)")
        for v in region:
            detail = f"{why[v]}; " if why.get(v) else ""
            if v in half and not p.allow[v]:
                p.paint_allow(v, f"cost model: half here ({detail}{summary})")
            elif v not in half and p.allow[v]:
                p.unpaint(v, f"cost model: float32 here ({detail}{summary})")


def _measured_region(p, shapes, target, region, fixed_half, node_seconds):
    """The RegionChoice of one region, or None when a size is unknown."""
    tensors = _tensors(p, region)
    weights = []
    for u, _, i, port in tensors:
        if p.view.nodes[i].op == "Const":
            weights.append(0.0)  # stored in half when its readers are half: no Cast
            continue
        elements = shapes.elements(i, port)
        if elements is None:
            return None
        weights.append(target.costs.cast_time(elements))
    vertex_weights, why, float32_time = {}, {}, 0.0
    elementwise_gains = {}  # {vertex: seconds its half kernel saves}, not a contraction's
    for v in region:
        found = _cost.vertex_cost(p, shapes, target, v, node_seconds.get(v))
        float32_time += found.float32 or 0.0
        if found.extra is None:
            if p.v_list[v] == "allow" and p.converted[v]:
                vertex_weights[v] = (0.0, _INF)  # its saving is unknown: stays half
            continue
        vertex_weights[v] = (max(found.extra, 0.0), max(-found.extra, 0.0))
        why[v] = found.what
        if found.extra < 0 and \
                p.view.nodes[p.v_node[v]].op not in _contractions.NODE_TIMED_OPS:
            elementwise_gains[v] = -found.extra
    ties = []  # x * sigmoid(x) runs as one Swish kernel only when both are one dtype
    for v in region if "swish" in target.fusions else ():
        parts = _cost.swish_parts(p.view, p.v_node[v])
        for part in parts or ():
            if part is not None:
                ties.extend((v, w) for w in p.node_vertex[part].values())
    current = _cost_of(tensors, weights, fixed_half, vertex_weights)
    best, half = _minimum_cut(region, tensors, weights, fixed_half, vertex_weights, ties,
                              _TIME_EPSILON / 1000)
    if current == _INF or best == _INF:
        return None
    members = set(region)

    def half_in_float32(c):
        return c not in members and fixed_half(c)

    def half_in_best(c):
        return c in half if c in members else fixed_half(c)

    float32 = _cost_of(tensors, weights, half_in_float32, vertex_weights)
    casts = {"best": _cost_of(tensors, weights, half_in_best),
             "rules": _cost_of(tensors, weights, fixed_half),
             "float32": _cost_of(tensors, weights, half_in_float32)}
    elementwise = {"best": sum(g for v, g in elementwise_gains.items() if v in half),
                   "rules": sum(g for v, g in elementwise_gains.items() if fixed_half(v))}
    return RegionChoice(region, current - best, half, why, float32 - best, float32_time,
                        float32 - current, casts, elementwise)
