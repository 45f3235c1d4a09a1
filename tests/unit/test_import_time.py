"""Every module of the choosing step imports on its own, whichever a script imports first.

The choosing step (tf_mpt/choose) imports rewrite/'s passes, and so runs rewrite/__init__:
were the orchestrator to import the choosing step with its package, a choose module imported
first would be read half-made by another (a default argument, a base class, a dataclass
field's default: "partially initialized module"). The orchestrator imports it where it is
used; one interpreter imports each choose module first, tf_mpt forgotten between them.
"""

import ast
import pathlib
import subprocess
import sys
import textwrap

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tf_mpt"


def _choose_modules():
    return sorted(".".join(("tf_mpt",) + p.relative_to(PACKAGE).with_suffix("").parts)
                  .removesuffix(".__init__")
                  for p in (PACKAGE / "choose").rglob("*.py"))


def test_each_choose_module_imports_first_on_its_own():
    script = textwrap.dedent("""
        import importlib, sys
        import tensorflow  # (not part of the circle: imported once)
        failed = []
        for name in sys.argv[1:]:
            for loaded in [m for m in sys.modules if m == "tf_mpt" or m.startswith("tf_mpt.")]:
                del sys.modules[loaded]
            try:
                importlib.import_module(name)
            except Exception as error:  # pylint: disable=broad-except
                failed.append(f"{name}: {type(error).__name__}: {error}")
        print(failed)
        sys.exit(1 if failed else 0)
    """)
    modules = _choose_modules()
    assert len(modules) > 30 and "tf_mpt.choose.timers.protocol" in modules
    done = subprocess.run([sys.executable, "-c", script, *modules], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_orchestrator_imports_the_choosing_step_where_it_is_used():
    tree = ast.parse((PACKAGE / "rewrite" / "__init__.py").read_text())
    top = [node.module for node in tree.body
           if isinstance(node, ast.ImportFrom) and node.module]
    assert not [m for m in top if m.startswith("tf_mpt.choose")], top
