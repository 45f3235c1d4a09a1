"""CI: the suite must see a tf_mpt that converts nothing.

For each planted fault, a copy of this checkout (its git-tracked files) gets the fault, and
the tests of each central claim run against that copy (its own tf_mpt first on the path:
PYTHONPATH and the working directory, in this venv). Every claim's tests must fail under
every fault; a claim whose tests all pass did not see tf_mpt break, and this script exits 1.

    empty_allow_list     the op lists allow nothing (tf_mpt converts nothing, on every target)
    cost_model_float32   the cost model keeps every region it weighs float32 (a table or
                         `here` target converts nothing it weighs)

Usage: python .ci/planted_faults.py [--claims NAME,...] [--faults NAME,...]
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

# A fault: (file, text appended to it). Appending redefines a module-level name that the
# rest of tf_mpt reads at call time.
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
}
# What proves the fault is in the tf_mpt the copy's tests import.
FAULT_CHECKS = {
    "empty_allow_list": "from tf_mpt import lists; assert not lists.default_lists('bfloat16')"
                        ".allow and not lists.default_lists('float16').allow",
    "cost_model_float32": "from tf_mpt.rewrite.paint import cost; "
                          "assert cost.choose_colouring(1.0, 1.0, False, 0.0) == 'float32'",
}
# The central claims and their tests; FAULTS_SEEN: the faults a claim's tests must see (the
# main job's tests pin the rules target: what the example decides by default is this
# machine's measurement, which a test cannot check the same way on every CPU).
CLAIMS = {
    "zero_code_scripts": ["tests/integration/test_autoenable.py"],
    "tf2_patterns": ["tests/integration/test_tf2_patterns.py"],
    "differential": ["tests/differential/test_differential.py"],
    "main_job": ["tests/integration/test_main_job.py"],
    "conversion": ["tests/integration/test_cli.py", "tests/integration/test_convert_targets.py"],
}
FAULTS_SEEN = {"main_job": ("empty_allow_list",)}


def _copy_with_fault(fault, into):
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        target = os.path.join(into, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), target)
    path, text = FAULTS[fault]
    with open(os.path.join(into, path), "a") as f:
        f.write(text)


def _env(copy):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_MPT_")}
    env["PYTHONPATH"] = copy
    return env


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", default=",".join(CLAIMS))
    parser.add_argument("--faults", default=",".join(FAULTS))
    args = parser.parse_args(argv)
    unseen = []
    for fault in args.faults.split(","):
        with tempfile.TemporaryDirectory(prefix=f"tf_mpt-fault-{fault}-") as copy:
            _copy_with_fault(fault, copy)
            check = subprocess.run([sys.executable, "-c", FAULT_CHECKS[fault]], cwd=copy,
                                   env=_env(copy), capture_output=True, text=True)
            if check.returncode != 0:
                print(f"{fault}: the fault is not in the copy's tf_mpt:\n{check.stderr[-2000:]}")
                return 1
            for claim in args.claims.split(","):
                if fault not in FAULTS_SEEN.get(claim, FAULTS):
                    continue
                began = time.monotonic()
                # -x: the first failing test is enough
                proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "2",
                                       "-p", "no:cacheprovider", *CLAIMS[claim]], cwd=copy,
                                      env=_env(copy), capture_output=True, text=True)
                summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
                # a test failed (with -x under xdist pytest exits 2, "interrupted"); an error
                # (collection, fixture set-up) is not the claim seen broken
                seen = (proc.returncode != 0 and re.search(r"\b\d+ failed\b", summary)
                        and " error" not in summary)
                print(f"{fault:20} {claim:18} {'failed, as it must' if seen else 'NOT SEEN'}"
                      f" ({time.monotonic() - began:.0f} s): {summary}", flush=True)
                if not seen:
                    unseen.append((fault, claim))
                    print(proc.stdout[-3000:])
    if unseen:
        print("claims whose tests did not see tf_mpt break: "
              + ", ".join(f"{claim} under {fault}" for fault, claim in unseen))
        return 1
    print("every claim's tests failed under every planted fault")
    return 0


if __name__ == "__main__":
    sys.exit(main())
