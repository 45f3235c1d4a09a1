"""The orchestrator reads like its algorithm: its docstring lists the phases and passes in the
order the code runs them, and every pass says whether it paints or un-paints and what it needs."""

import inspect
import re

from tf_mpt import rewrite as rewrite_module
from tf_mpt.rewrite import painting


def _doc_passes():
    doc = rewrite_module.__doc__
    block = doc.split("2. paint", 1)[1].split("3. casts", 1)[0]
    return re.findall(r"^        (\w+) +(.*)$", block, re.M)


def test_the_docstring_lists_the_passes_of_PASSES_in_their_order():
    names = [name for name, _ in painting.PASSES]
    assert [name for name, _ in _doc_passes()] == names
    assert all(run.__name__ == name for name, run in painting.PASSES)
    assert names and len(set(names)) == len(names)  # every pass listed once


def test_every_pass_says_its_kind_and_what_it_needs():
    for name, run in painting.PASSES:
        doc = inspect.getdoc(run)
        kind = re.search(r"^Kind: (link|paint|un-paint)\b.*Needs:\s+\S", doc, re.M | re.S)
        assert kind, f"{name}: no 'Kind: ... Needs: ...' line"
        listed = dict(_doc_passes())[name]
        # the orchestrator's one-line rule marks exactly the un-paint passes
        assert listed.startswith("un-paint:") == (kind.group(1) == "un-paint"), name


def test_the_code_runs_the_listed_phases_in_order():
    phases = re.findall(r"^    (\d)\. (\w+)", rewrite_module.__doc__, re.M)
    assert [name for _, name in phases] == ["index", "paint", "casts", "functions",
                                            "boundaries", "report", "verdict"]
    seen = []
    for function in (rewrite_module._rewrite_graph_def, painting.rewrite_one,
                     rewrite_module.rewrite_with_library):
        marks = re.findall(r"# (\d)\. (\w+)", inspect.getsource(function))
        numbers = [int(number) for number, _ in marks]
        assert numbers == sorted(numbers), function.__name__
        seen += marks
    assert sorted(set(seen)) == phases
