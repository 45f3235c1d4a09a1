"""CI: the suite must see tf_mpt break, in each piece of machinery a claim rests on.

First an unfaulted copy of this checkout (its git-tracked files) runs every claim's tests, in
one pytest run: they must pass, or a failure under a fault would prove nothing. Then, for
each planted fault, a fresh copy gets the fault and the tests of the claims that must see it
run against that copy (its own tf_mpt first on the path: PYTHONPATH and the working
directory, in this venv). Each of those claims' tests must fail; the step prints the test
that failed first. A fault that no claim's tests see makes this script exit 1.

    empty_allow_list        the op lists allow nothing (tf_mpt converts nothing, on every
                            target)
    cost_model_float32      the cost model keeps every region it weighs float32 (a table or
                            `here` target converts nothing it weighs)
    timer_picks_slowest     graph timing's verdict keeps the slowest candidate it timed
    lean_reads_half_copy    a lean version's forward pass reads the value's half copy (cast
                            back at once) instead of the float32 original
    dispatch_times_nothing  the dispatch check's patterns fetch a constant: each run times
                            nothing of the pattern (every ratio ~1, no slow kernel found)
    verdict_of_another_graph  a cached verdict's key ignores the graph: a verdict timed for
                            one graph is replayed onto another with the same fetches

Usage: python .ci/planted_faults.py [--claims NAME,...] [--faults NAME,...] [--no-unfaulted]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUN_TIMEOUT_SECONDS = 1800

# A fault: (file, text appended to it). Appending redefines a module-level name that the
# rest of tf_mpt reads at call time (through the module, or a class: `Policy.pick`).
FAULTS = {
    "empty_allow_list": ("tf_mpt/lists.py", """
# --- planted fault (.ci/planted_faults.py): the allow lists are empty
FLOAT16_LISTS = OpLists(allow=frozenset(), infer=FLOAT16_LISTS.infer,
                        deny=FLOAT16_LISTS.deny, clear=FLOAT16_LISTS.clear)
BFLOAT16_LISTS = OpLists(allow=frozenset(), infer=BFLOAT16_LISTS.infer,
                         deny=BFLOAT16_LISTS.deny, clear=BFLOAT16_LISTS.clear)
"""),
    "cost_model_float32": ("tf_mpt/rewrite/paint/cost.py", """
# --- planted fault (.ci/planted_faults.py): every weighed region stays float32
def choose_colouring(over_rules, over_float32, rules_slower, least):
    return "float32"
"""),
    "timer_picks_slowest": ("tf_mpt/choose/policy.py", """
# --- planted fault (.ci/planted_faults.py): the verdict keeps the slowest candidate timed
def _planted_pick(self, times, predicted, peaks=None):
    return max(times, key=lambda name: statistics.median(times[name]))


Policy.pick = _planted_pick
"""),
    "lean_reads_half_copy": ("tf_mpt/choose/transforms/saving.py", """
# --- planted fault (.ci/planted_faults.py): the value's early (forward) readers read its
# half copy too, cast back at once
_planted_saving_plan = _saving_plan


def _saving_plan(view, i, port, readers, half, level, lists):
    plan = _planted_saving_plan(view, i, port, readers, half, level, lists)
    if plan is None:
        return None
    source, late = plan
    moved = {(reader, reader_port) for reader, reader_port, _ in late}
    early = [(reader, reader_port, i) for reader, reader_port in readers
             if (reader, reader_port) not in moved and view.nodes[reader].name != source
             and not (source is None and _casts.is_our_cast(
                 view.nodes[reader], types_pb2.DT_FLOAT, half))]
    return source, late + early
"""),
    "dispatch_times_nothing": ("tf_mpt/costs/dispatch.py", """
# --- planted fault (.ci/planted_faults.py): each pattern's run fetches a constant
_planted_pattern_graph = pattern_graph


def pattern_graph(tf, *args, **kwargs):
    made = list(_planted_pattern_graph(tf, *args, **kwargs))  # (graph, init, fetch, ...)
    with made[0].as_default():
        made[2] = tf.constant([0.0])
    return tuple(made)
"""),
    "verdict_of_another_graph": ("tf_mpt/choose/cache.py", """
# --- planted fault (.ci/planted_faults.py): a verdict's key ignores the graph
_planted_fingerprint = fingerprint


def fingerprint(graph_def, fetches, dtype, lists, cost_batch, memory="float32"):
    return _planted_fingerprint(type(graph_def)(), fetches, dtype, lists, cost_batch, memory)
"""),
}
# What proves the fault is in the tf_mpt the copy's tests import.
FAULT_CHECKS = {
    "empty_allow_list": "from tf_mpt import lists; assert not lists.default_lists('bfloat16')"
                        ".allow and not lists.default_lists('float16').allow",
    "cost_model_float32": "from tf_mpt.rewrite.paint import cost; "
                          "assert cost.choose_colouring(1.0, 1.0, False, 0.0) == 'float32'",
    "timer_picks_slowest": "from tf_mpt.choose import policy as t; "
                           "assert t.DEFAULT.pick({'a': (1.0,), 'b': (2.0,)}, 'a') == 'b'",
    "lean_reads_half_copy": "from tf_mpt.choose.transforms import saving; "
                            "assert saving._saving_plan is not saving._planted_saving_plan",
    "dispatch_times_nothing": "import tensorflow as tf; from tf_mpt.costs import dispatch as d;"
                              " patterns, f32 = d._patterns(tf, 'bfloat16'); "
                              "t = d.pattern_graph(tf, patterns['MatMul'], f32, tf.bfloat16)[2];"
                              " assert t.op.type == 'Const'",
    "verdict_of_another_graph": "from tensorflow.core.framework import graph_pb2; "
                                "from tf_mpt.choose import cache as v; "
                                "from tf_mpt import lists; "
                                "b = graph_pb2.GraphDef(); b.node.add(name='x', op='NoOp'); "
                                "k = lambda g: v.fingerprint(g, ['y'], 'bfloat16', "
                                "lists.default_lists('bfloat16'), 32); "
                                "assert k(graph_pb2.GraphDef()) == k(b)",
}
# The central claims and their tests.
CLAIMS = {
    "zero_code_scripts": ["tests/integration/test_autoenable.py"],
    "tf2_patterns": ["tests/integration/test_tf2_patterns.py"],
    "differential": ["tests/differential/test_differential.py"],
    "main_job": ["tests/integration/test_main_job.py"],
    "conversion": ["tests/integration/test_cli.py", "tests/integration/test_convert_targets.py"],
    "measured_choice": ["tests/unit/test_graph_timing.py"],
    "lean_versions": ["tests/unit/test_lean.py"],
    "dispatch_check": ["tests/unit/test_dispatch_check.py",
                       "tests/unit/test_dispatch_patterns.py"],
}
# The claims whose tests must fail under each fault (the main job's tests pin the rules
# target: what the example decides by default is this machine's measurement, which a test
# cannot check the same way on every CPU; the machinery's faults are each seen by the tests
# of the machinery's claim).
CONVERTS = ("zero_code_scripts", "tf2_patterns", "differential", "conversion")
FAULTS_SEEN = {
    "empty_allow_list": CONVERTS + ("main_job",),
    "cost_model_float32": CONVERTS,
    "timer_picks_slowest": ("measured_choice",),
    "lean_reads_half_copy": ("lean_versions",),
    "dispatch_times_nothing": ("dispatch_check",),
    "verdict_of_another_graph": ("measured_choice",),
}


def _copy(into, fault=None):
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        target = os.path.join(into, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), target)
    if fault is not None:
        path, text = FAULTS[fault]
        with open(os.path.join(into, path), "a") as f:
            f.write(text)


def _env(copy):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_MPT_")}
    env["PYTHONPATH"] = copy
    return env


def _pytest(copy, tests, first_failure):
    """(exit code, the summary line, the failed tests' ids, stdout) of the tests in `copy`;
    with `first_failure`, stopped at the first failing test."""
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
               "-rf", *(["-x"] if first_failure else []), *tests]
    try:
        proc = subprocess.run(command, cwd=copy, env=_env(copy), capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as timeout:
        out = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else timeout.stdout
        return None, f"timed out after {RUN_TIMEOUT_SECONDS} s", [], out or ""
    summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
    return proc.returncode, summary, failed, proc.stdout


def _unfaulted(claims):
    """True if every claim's tests pass in an unfaulted copy: one run of them all (two
    workers, a file each at a time), the result said per claim."""
    with tempfile.TemporaryDirectory(prefix="tf_mpt-unfaulted-") as copy:
        _copy(copy)
        began = time.monotonic()
        tests = list(dict.fromkeys(test for claim in claims for test in CLAIMS[claim]))
        code, summary, failed, out = _pytest(copy, tests, first_failure=False)
    seconds = time.monotonic() - began
    for claim in claims:
        broken = [test for test in failed if test.split("::")[0] in CLAIMS[claim]]
        print(f"{'(no fault)':24} {claim:18} "
              f"{'FAILED: ' + ', '.join(broken) if broken else 'passed, as it must'}",
              flush=True)
    print(f"{'(no fault)':24} {'every claim':18} ({seconds:.0f} s): {summary}", flush=True)
    if code != 0:
        print(out[-3000:])
    return code == 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", default=",".join(CLAIMS))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--no-unfaulted", action="store_true",
                        help="skip the unfaulted copy's run (a local re-run of some faults)")
    args = parser.parse_args(argv)
    claims, faults = args.claims.split(","), args.faults.split(",")
    for name, given, known in (("claim", claims, CLAIMS), ("fault", faults, FAULTS)):
        unknown = [n for n in given if n not in known]
        if unknown:
            parser.error(f"unknown {name}(s) {unknown}; known: {', '.join(known)}")
    needed = [c for c in claims if any(c in FAULTS_SEEN[f] for f in faults)]
    if not args.no_unfaulted and not _unfaulted(needed):
        print("the claims' tests fail without a fault: a failure under a fault would prove "
              "nothing")
        return 1
    unseen = []
    for fault in faults:
        with tempfile.TemporaryDirectory(prefix=f"tf_mpt-fault-{fault}-") as copy:
            _copy(copy, fault)
            check = subprocess.run([sys.executable, "-c", FAULT_CHECKS[fault]], cwd=copy,
                                   env=_env(copy), capture_output=True, text=True)
            if check.returncode != 0:
                print(f"{fault}: the fault is not in the copy's tf_mpt:\n{check.stderr[-2000:]}")
                return 1
            for claim in (c for c in claims if c in FAULTS_SEEN[fault]):
                began = time.monotonic()
                # -x: the first failing test is enough
                code, summary, failed, out = _pytest(copy, CLAIMS[claim], first_failure=True)
                # a test failed (with -x under xdist pytest exits 2, "interrupted"); an error
                # (collection, fixture set-up) or a time-out is not the claim seen broken
                seen = (code not in (0, None) and failed
                        and re.search(r"\b\d+ failed\b", summary) and " error" not in summary)
                caught = f", caught by {failed[0]}" if seen else ""
                print(f"{fault:24} {claim:18} {'failed, as it must' if seen else 'NOT SEEN'}"
                      f" ({time.monotonic() - began:.0f} s{caught}): {summary}", flush=True)
                if not seen:
                    unseen.append((fault, claim))
                    print(out[-3000:])
    if unseen:
        print("claims whose tests did not see tf_mpt break: "
              + ", ".join(f"{claim} under {fault}" for fault, claim in unseen))
        return 1
    print(f"every planted fault ({len(faults)}) was caught by the tests of each claim that "
          "must see it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
