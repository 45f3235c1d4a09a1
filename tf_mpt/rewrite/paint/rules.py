"""Painting passes: decide which (node, type-attr) vertices become half precision.

Pure analysis: every pass reads the graph index and writes only the paint arrays of a
`Paint`. `rewrite/apply.py` turns the paint into GraphDef edits (through the editor).

Vocabulary: a *vertex* is a (node, type-attr) pair; *allow* paint means "runs in half",
*deny* paint means "must stay float32"; a vertex already of the half dtype counts as allow.
A vertex is a *candidate* when its node may be changed (not fetched, not opted out, a known
op), the attr is float32, not tied to a reference port, and the OpDef and a registered kernel
on the node's device accept the half dtype.
"""

import numpy as np
from tensorflow.python.framework import tensor_util

from tf_mpt.rewrite.paint import shapes as _shapes
from tf_mpt.rewrite import type_attrs as ta

FETCHED = "fetched: its outputs keep their dtype"
_LOOP_BACK_EDGE_OPS = ("NextIteration", "RefNextIteration")
_MERGE_OPS = ("Merge", "RefMerge")


class Paint:
    """Vertices, their type graph, and the paint.

    Attributes:
        allow, deny: per vertex paint.
        reason: per vertex, why it has its paint (None until a rule decides).
        converted: per vertex, True when the rewrite changes its dtype to half.
    """

    def __init__(self, view, types, half, lists, node_skip_reason, default_device):
        self.view = view
        self.types = types
        self.half_enum = half.enum
        self.half_name = half.name
        self.lists = lists
        self.node_skip_reason = node_skip_reason
        self.default_device = default_device
        nodes = view.nodes
        self.v_node, self.v_key, self.node_vertex = [], [], []
        for i, nt in enumerate(types):
            keys = {}
            for key in nt.dtypes:
                keys[key] = len(self.v_node)
                self.v_node.append(i)
                self.v_key.append(key)
            self.node_vertex.append(keys)
        n = len(self.v_node)
        # an op listed by its own name wins over the newer version it is analysed as
        self.v_list = [lists.list_of(nodes[i].op) or lists.list_of(types[i].op)
                       for i in self.v_node]
        self.v_dtype = [types[i].dtypes[k] for i, k in zip(self.v_node, self.v_key)]
        # A float32 constant whose value the half type cannot hold is a deny op: pass 2 keeps
        # float32 the clear/infer ops it feeds (x * 1e7, x + 1e-10 stay float32).
        self.out_of_range = {}
        for v, i in enumerate(self.v_node):
            if nodes[i].op == "Const" and self.v_dtype[v] == ta.DT_FLOAT:
                why = half_range_problem(nodes[i], half.name)
                if why is not None:
                    self.out_of_range[v] = why
                    self.v_list[v] = "deny"
        self.fanin = [[] for _ in range(n)]
        self.fanout = [[] for _ in range(n)]
        self.reads_ref = [False] * n
        for i, ports in enumerate(view.fanin):
            in_keys = types[i].in_keys
            dst_vertices = self.node_vertex[i]
            for port, (src, src_port) in enumerate(ports):
                key = in_keys[port]
                if key is None:
                    continue
                src_types = types[src]
                if not src_types.known:
                    continue
                if src_port >= len(src_types.out_keys):
                    raise ta.GraphDefError(
                        f"Node {nodes[i].name!r} reads output {src_port} of node "
                        f"{nodes[src].name!r} (op {nodes[src].op}), which has only "
                        f"{len(src_types.out_keys)} output(s). Fix the input name.")
                src_key = src_types.out_keys[src_port]
                if src_key is None:
                    continue
                sv = self.node_vertex[src][src_key]
                dv = dst_vertices[key]
                self.fanout[sv].append(dv)
                self.fanin[dv].append(sv)
                if src_port in src_types.ref_out_ports:
                    self.reads_ref[dv] = True
        self.allow = [d == self.half_enum for d in self.v_dtype]
        self.deny = [False] * n
        self.converted = [False] * n
        self.reason = [f"already {self.half_name}" if a else None for a in self.allow]
        self._candidate = [None] * n
        self._why_not = [None] * n
        self.cost = None  # (bound Target, {node name: output shapes}, noise floor) when on
        # the cost model's prediction for the colouring it leaves: (seconds per run saved
        # over all float32, seconds per run of kernel savings and Casts that prediction sums,
        # seconds of it from half kernels other than contractions': cuts.RegionChoice)
        self.cost_prediction = (0.0, 0.0, 0.0)
        self.shape_source = dict  # callable -> {node name: [shape or None per output]}
        self._shapes = None
        self.tensor_list_groups = []  # _list_paint.ListGroup per list made in this graph

    # --- vertex facts ----------------------------------------------------------------------

    def node_name(self, v):
        return self.view.nodes[self.v_node[v]].name

    def op(self, v):
        return self.view.nodes[self.v_node[v]].op

    def candidate(self, v):
        """True if v may be painted half; the reason it may not is kept for the report."""
        result = self._candidate[v]
        if result is None:
            why = self._why_not_candidate(v)
            self._why_not[v] = why
            result = self._candidate[v] = why is None
        return result

    def why_not(self, v):
        self.candidate(v)
        return self._why_not[v]

    def _why_not_candidate(self, v):
        i, key = self.v_node[v], self.v_key[v]
        skip = self.node_skip_reason[i]
        nt = self.types[i]
        # A fetched node keeps the dtypes of its outputs; an attr that types only inputs
        # (ShapeN's T, Cast's SrcT, ArgMax's T) may still go half.
        if skip is not None and not (skip == FETCHED and key not in nt.out_keys):
            return skip
        if self.v_dtype[v] != ta.DT_FLOAT:
            return "not float32"
        attr = key[0] if isinstance(key, tuple) else key
        if key in nt.ref_keys:
            return f"attr {attr} types a reference port (variables are never cast in place)"
        node = self.view.nodes[i]
        if self.reads_ref[v] and self.v_list[v] != "allow":
            return "reads a reference variable directly (the Cast goes after the read)"
        if not ta.op_def_allows(nt.op_def, key, self.half_enum):
            return f"the OpDef of {nt.op} does not allow {self.half_name} for attr {attr}"
        device = ta.device_type_of(node.device, self.default_device)
        if not ta.kernel_allows(nt.op, device, attr, self.half_enum):
            return f"no {self.half_name} kernel for {nt.op} on {device}"
        return None

    def static_shapes(self):
        """{node name: [static shape (tuple, -1 for unknown dims) or None per output]}."""
        if self._shapes is None:
            self._shapes = self.shape_source()
        return self._shapes

    def paint_allow(self, v, reason):
        self.allow[v] = True
        self.converted[v] = True
        self.reason[v] = reason

    def unpaint(self, v, reason):
        self.allow[v] = False
        self.converted[v] = False
        self.reason[v] = reason

    def consumers_of_output(self, i, port):
        """Consumer vertices (None for a fixed-type or unknown port) of one output port."""
        out = []
        for dst, dst_port in self.view.fanout_of(i).get(port, ()):
            key = self.types[dst].in_keys[dst_port]
            out.append(None if key is None else self.node_vertex[dst][key])
        return out


# float16's largest finite value, and the magnitude below which a value rounds to 0
_FLOAT16_MAX = 65504.0
_FLOAT16_ZERO = 2.0 ** -25


def half_range_problem(node, half_name):
    """Why a float32 Const's value does not fit `half_name`, or None.

    float16 only (bfloat16 has float32's range): a finite value above 65504 would become inf;
    a constant whose nonzero values all round to 0 (an epsilon such as 1e-10) would become
    0. Weights with a few tiny entries among normal ones are fine.
    """
    if half_name != "float16":
        return None
    try:
        values = np.abs(tensor_util.MakeNdarray(node.attr["value"].tensor)).ravel()
    except (TypeError, ValueError):
        return None
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    largest = float(values.max())
    if largest > _FLOAT16_MAX:
        return f"constant {largest:g} overflows float16 (largest finite 65504)"
    if 0 < largest < _FLOAT16_ZERO:
        return f"constant {largest:g} rounds to 0 in float16"
    return None


def _dfs(roots, neighbours, enter):
    """Iterative DFS; yields (vertex, root) for each vertex entered from a root."""
    seen = set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        stack = [root]
        while stack:
            v = stack.pop()
            yield v, root
            for w in neighbours[v]:
                if w not in seen and enter(w):
                    seen.add(w)
                    stack.append(w)


# --- pass 1 ----------------------------------------------------------------------------------

def add_allowlist_ops(p):
    """Allow ops go half.

    x -> MatMul -> y   becomes   x -> [MatMul] -> y   ([ ] = half).

    Kind: paint. Needs: the index (OpDefs and kernels per vertex).
    """
    for v, lst in enumerate(p.v_list):
        if lst == "allow" and not p.allow[v] and p.candidate(v):
            p.paint_allow(v, f"op {p.op(v)} is on the allow list")


# --- pass 2 ----------------------------------------------------------------------------------

def propagate_deny_forward_through_clear_and_infer(p):
    """Deny flows forward from a deny op through clear/infer ops that lead to a deny/infer op.

    Exp -> Relu -> Tanh -> Relu -> MatMul   becomes   Exp* -> Relu* -> Tanh* -> Relu -> MatMul
    (* = deny): the last Relu leads to no deny/infer op, so it stays free.

    Kind: paint (deny). Needs: add_allowlist_ops.
    """
    lists = p.v_list
    roots = [v for v, lst in enumerate(lists) if lst in ("deny", "infer")]
    upstream_of_deny_or_infer = {v for v, _ in _dfs(roots, p.fanin, lambda w: lists[w] == "clear")}
    for v, lst in enumerate(lists):
        if lst == "deny" and not p.allow[v]:
            p.deny[v] = True
            p.reason[v] = p.out_of_range.get(v) or f"op {p.op(v)} is on the deny list"
    deny_roots = [v for v, lst in enumerate(lists) if lst == "deny"]

    def enter(w):
        return w in upstream_of_deny_or_infer and not p.deny[w] and not p.allow[w]

    for v, root in _dfs(deny_roots, p.fanout, enter):
        if v != root and not p.deny[v]:
            p.deny[v] = True
            p.reason[v] = (f"downstream of deny op {p.node_name(root)!r} through "
                           "clear/infer ops")


# --- pass 3 ----------------------------------------------------------------------------------

def add_clear_and_infer_to_allow_if_between_allow(p):
    """Clear and infer ops with an allow op both upstream and downstream go half.

    MatMul -> Add -> Relu -> MatMul   becomes   [MatMul] -> [Add] -> [Relu] -> [MatMul].

    Kind: paint. Needs: allow and deny painted.
    """
    allow_roots = [v for v in range(len(p.allow))
                   if p.allow[v] and (p.v_list[v] == "allow" or not p.converted[v])]

    def enter_downstream(w):
        return (p.v_list[w] in ("clear", "infer") and not p.deny[w] and not p.allow[w]
                and p.candidate(w))

    downstream_of = {}
    for v, root in _dfs(allow_roots, p.fanout, enter_downstream):
        if v != root:
            downstream_of[v] = root
    for v, root in _dfs(allow_roots, p.fanin, lambda w: w in downstream_of):
        if v != root and not p.allow[v]:
            p.paint_allow(v, f"{p.v_list[v]} op between allow ops "
                             f"{p.node_name(downstream_of[v])!r} and {p.node_name(root)!r}")


# --- pass 4 ----------------------------------------------------------------------------------

def add_infer_to_allow_if_following_allow(p):
    """An infer op whose inputs include an allow op and no deny op goes half.

    MatMul -> Tanh -> Sigmoid   becomes   [MatMul] -> [Tanh] -> [Sigmoid].
    Computed as a fixpoint, so the result does not depend on node order.

    Kind: paint. Needs: add_clear_and_infer_to_allow_if_between_allow.
    """
    def ready(w):
        if p.allow[w] or p.deny[w] or p.v_list[w] != "infer" or not p.candidate(w):
            return None
        source = None
        for u in p.fanin[w]:
            if p.deny[u]:
                return None
            if p.allow[u] and source is None:
                source = u
        return source

    work = [w for v in range(len(p.allow)) if p.allow[v] for w in p.fanout[v]]
    while work:
        w = work.pop()
        source = ready(w)
        if source is not None:
            p.paint_allow(w, f"infer op follows allow op {p.node_name(source)!r}")
            work.extend(p.fanout[w])


# --- pass 5 ----------------------------------------------------------------------------------

def propagate_allow_through_clear(p):
    """Clear ops touching an allow op, upstream or downstream, go half (transitively).

    x -> Reshape -> MatMul -> Relu -> MaxPool   becomes   x -> [Reshape] -> [MatMul] -> [Relu]
    -> [MaxPool].

    Kind: paint. Needs: add_infer_to_allow_if_following_allow.
    """
    roots = [v for v in range(len(p.allow)) if p.allow[v]]
    neighbours = [p.fanin[v] + p.fanout[v] for v in range(len(p.allow))]

    def enter(w):
        return (p.v_list[w] == "clear" and not p.allow[w] and not p.deny[w]
                and p.candidate(w))

    for v, root in _dfs(roots, neighbours, enter):
        if v != root:
            p.paint_allow(v, f"clear op next to allow op {p.node_name(root)!r}")


# --- passes 4 and 5 again --------------------------------------------------------------------

def repeat_infer_and_clear_until_stable(p):
    """Passes 4 and 5 again until nothing changes: an infer op fed by a clear op that pass 5
    painted half goes half too (Grappler runs each pass once, so it stays float32 there).

    MatMul -> Split -> Sigmoid   becomes   [MatMul] -> [Split] -> [Sigmoid]
    (an LSTM's gates: once pass 5 paints the Split, the Sigmoids follow it).

    Kind: paint. Needs: add_infer_to_allow_if_following_allow and propagate_allow_through_clear
    ran once.
    """
    while True:
        before = sum(p.allow)
        add_infer_to_allow_if_following_allow(p)
        propagate_allow_through_clear(p)
        if sum(p.allow) == before:
            return


# --- the small side of a selection ----------------------------------------------------------

# Clear ops that pick part of their first input: op -> the attr typing that input and output 0.
SELECTORS = {"Gather": "Tparams", "GatherV2": "Tparams", "GatherNd": "Tparams",
             "Slice": "T", "StridedSlice": "T"}


def cast_the_selected_part_not_the_whole(p):
    """Un-paint: a selector painted half whose float32 input would be cast whole just for it
    stays float32 when its output has fewer elements; the Cast moves to the smaller side.

    table(9008x200) -> Cast -> [GatherV2](128x200) -> [MatMul]   becomes
    table(9008x200) -> GatherV2(128x200) -> Cast -> [MatMul].
    Needs static shapes of both sides (none known: nothing changes).

    Kind: un-paint. Needs: every paint pass of the rules; static shapes.
    """
    shapes = None  # built at the first candidate: shapes cost a walk of the graph
    for i, node in enumerate(p.view.nodes):
        attr = SELECTORS.get(node.op)
        v = None if attr is None else p.node_vertex[i].get(attr)
        if v is None or not p.converted[v] or not p.view.fanin[i]:
            continue
        src, src_port = p.view.fanin[i][0]
        if any(p.allow[u] for u in p.fanin[v]):
            continue  # the input is half already: no Cast to move
        readers = p.consumers_of_output(src, src_port)
        if any(c is not None and c != v and p.allow[c] for c in readers):
            continue  # another half reader needs the whole input cast anyway
        shapes = shapes or _shapes.Shapes(p.view, p.static_shapes())
        whole, part = shapes.elements(src, src_port), shapes.elements(i, 0)
        if whole is None or part is None or part >= whole:
            continue
        p.unpaint(v, f"selects {part} of {whole} elements: the Cast goes after it")


# --- control-flow fix-up ---------------------------------------------------------------------

def force_colour_match_on_loop_back_edges(p):
    """A loop-carried value has one colour around the back edge (NextIteration -> Merge).

    If the NextIteration or any Merge it feeds is not half, none of them is.

    Kind: un-paint. Needs: every pass that paints half (it runs after them so a back edge ends
    with one colour).
    """
    nodes = p.view.nodes
    for i, node in enumerate(nodes):
        if node.op not in _LOOP_BACK_EDGE_OPS:
            continue
        group = [p.node_vertex[i].get("T")]
        ok = group[0] is not None and p.allow[group[0]]
        for dst_list in p.view.fanout_of(i).values():
            for dst, _ in dst_list:
                v = p.node_vertex[dst].get("T")
                group.append(v)
                if nodes[dst].op not in _MERGE_OPS or v is None or not p.allow[v]:
                    ok = False
        if ok:
            continue
        for v in group:
            if v is not None and p.converted[v]:
                p.unpaint(v, f"loop back edge at {node.name!r} must keep one colour and "
                             "a Merge or NextIteration on it stays float32")


# --- reuse of what the graph already has -----------------------------------------------------

def _all_consumers_half(p, i, port):
    consumers = p.consumers_of_output(i, port)
    return bool(consumers) and all(c is not None and p.allow[c] for c in consumers)


def let_existing_casts_read_and_emit_half(p):
    """Casts already in the graph take half inputs and emit half outputs where that saves a Cast.

    MatMul -> Cast(f32->i32)   becomes   [MatMul] -> Cast(half->i32)  (no Cast added), and
    Cast(i32->f32) -> MatMul   becomes   Cast(i32->half) -> [MatMul].

    Kind: paint (existing Casts). Needs: the final colours of the Casts' neighbours.
    """
    for i, node in enumerate(p.view.nodes):
        if node.op != "Cast" or p.node_skip_reason[i] not in (None, FETCHED):
            continue
        vertices = p.node_vertex[i]
        dst_v, src_v = vertices.get("DstT"), vertices.get("SrcT")
        if dst_v is not None and not p.allow[dst_v] and p.candidate(dst_v):
            if _all_consumers_half(p, i, 0):
                p.paint_allow(dst_v, "existing Cast emits half directly (all consumers are half)")
        if src_v is not None and not p.allow[src_v] and p.candidate(src_v):
            producers = p.fanin[src_v]
            if producers and all(p.allow[u] for u in producers):
                p.paint_allow(src_v, "existing Cast reads its half input directly")


def store_constants_in_half(p):
    """A float32 Const whose every consumer is half is stored in half: no Cast at run time.

    Const -> [MatMul]   becomes   [Const] -> [MatMul].

    Kind: paint (Consts). Needs: the final colours of every consumer; runs last.
    """
    for i, node in enumerate(p.view.nodes):
        if node.op != "Const" or p.node_skip_reason[i] is not None:
            continue
        v = p.node_vertex[i].get("dtype")
        if v is None or p.allow[v] or p.deny[v] or not p.candidate(v):
            continue
        if _all_consumers_half(p, i, 0):
            p.paint_allow(v, "constant stored in half (all consumers are half)")


def explain_unpainted(p, v):
    """The reason a vertex that no rule painted stays as it is."""
    if p.reason[v] is not None:
        return p.reason[v]
    why = p.why_not(v)
    if why is not None:
        return why
    lst = p.v_list[v]
    if lst is None:
        return f"op {p.op(v)} is on no list"
    if lst == "infer":
        if any(p.deny[u] for u in p.fanin[v]):
            return "infer op with a deny input"
        return "infer op not fed by an allow op"
    if lst == "clear":
        return "clear op not next to an allow op"
    return f"{lst} op left float32"
