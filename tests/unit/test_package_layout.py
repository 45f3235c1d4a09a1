"""The package's shape: no import circle, every module imports only downward.

Layers, lowest first (a module may import its own layer or a lower one, never in a circle):
    facts      _dtypes, _cpu, lists, report, _opt_out, _process/ (state, patches,
               import_hooks, autograph, xla)
    config     config (reads TF_MPT_*)
    costs      costs/ (kernel-time tables, their cache and the probes that measure them)
    rewrite    rewrite/'s passes (painting, Casts, boundaries, the graph editor)
    choose     choose/ (which colouring runs: candidates timed, the verdict, its cache)
    orchestrate  rewrite/__init__ and tf_functions (rewrite_graph_def, rewrite_function:
               the passes, then the choosing step)
    training   training/ (storage getter, loss scales, optimizer, checkpoints)
    uses       automatic/, models/ (built on rewrite and training)
    entries    cli, __main__, _process.startup, the public alias loss_scale
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tf_mpt"

LAYERS = (
    ("facts", ("tf_mpt._dtypes", "tf_mpt._cpu", "tf_mpt.lists", "tf_mpt.report",
               "tf_mpt._opt_out", "tf_mpt._process.patches", "tf_mpt._process.import_hooks",
               "tf_mpt._process.state", "tf_mpt._process.autograph",
               "tf_mpt._process.xla")),
    ("config", ("tf_mpt.config", "tf_mpt.targets")),
    ("costs", ("tf_mpt.costs",)),
    ("rewrite", ("tf_mpt.rewrite",)),
    ("choose", ("tf_mpt.choose",)),
    # (exact modules, '=': the orchestrator is rewrite/'s __init__, above its passes)
    ("orchestrate", ("=tf_mpt.rewrite", "=tf_mpt.rewrite.tf_functions")),
    ("training", ("tf_mpt.training",)),
    ("uses", ("tf_mpt.automatic", "tf_mpt.models")),
    ("entries", ("tf_mpt.cli", "tf_mpt.__main__", "tf_mpt._process.startup", "tf_mpt._process",
                 "tf_mpt.loss_scale", "tf_mpt")),
)


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path, modules):
    """The tf_mpt modules `path` imports anywhere in its body (function-level too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                     else node.module for alias in node.names]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def _graph():
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _layer(module):
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p[1:] for p in prefixes if p.startswith("=")):
            return index
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes
               if p != "tf_mpt" and not p.startswith("=")):
            return index
    assert module == "tf_mpt", f"{module} is in no layer: add it to LAYERS"
    return len(LAYERS) - 1


def longest_chain(graph):
    """The longest import chain (module, a module it imports, ...) of an acyclic graph."""
    memo = {}

    def chain(module):
        if module not in memo:
            best = max((chain(m) for m in graph[module]), key=len, default=())
            memo[module] = (module,) + best
        return memo[module]

    return max((chain(m) for m in graph), key=len)


def find_circle(graph):
    """An import circle [a, b, ..., a] in `graph` ({module: imported modules}), or None."""
    state = {}

    def visit(module, path):
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state:
                circle = visit(imported, path + [imported])
                if circle:
                    return circle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            circle = visit(module, [module])
            if circle:
                return circle
    return None


def upward_imports(graph):
    return [f"{module} ({LAYERS[_layer(module)][0]}) imports {imported} "
            f"({LAYERS[_layer(imported)][0]})"
            for module, imported_set in sorted(graph.items()) for imported in sorted(imported_set)
            if _layer(imported) > _layer(module)]


def test_there_is_no_import_circle():
    graph = _graph()
    assert len(graph) > 40 and "tf_mpt.rewrite.apply" in graph["tf_mpt.rewrite.painting"]
    assert find_circle(graph) is None


def test_every_module_imports_only_its_own_layer_or_lower():
    assert upward_imports(_graph()) == []


def test_the_checks_find_circles_and_upward_imports():
    assert find_circle({"x.a": {"x.b"}, "x.b": {"x.c"}, "x.c": {"x.a"}}) == [
        "x.a", "x.b", "x.c", "x.a"]
    assert upward_imports({"tf_mpt.rewrite.casts": {"tf_mpt.cli"}, "tf_mpt.cli": set()}) == [
        "tf_mpt.rewrite.casts (rewrite) imports tf_mpt.cli (entries)"]
    # (the orchestrator is rewrite/'s __init__ alone: a pass importing the choosing step,
    # or the choosing step importing the orchestrator, runs upward)
    assert upward_imports({"tf_mpt.rewrite.apply": {"tf_mpt.choose.decision"},
                           "tf_mpt.choose.decision": {"tf_mpt.rewrite"},
                           "tf_mpt.rewrite": {"tf_mpt.choose.decision"}}) == [
        "tf_mpt.choose.decision (choose) imports tf_mpt.rewrite (orchestrate)",
        "tf_mpt.rewrite.apply (rewrite) imports tf_mpt.choose.decision (choose)"]
    assert longest_chain({"a": {"b"}, "b": {"c"}, "c": set()}) == ("a", "b", "c")
