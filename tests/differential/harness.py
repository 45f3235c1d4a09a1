"""Differential harness: run one program in float32 and under TF_MPT_ENABLE=1, judge the pair.

`run_pair(source, dtype, timeout)` runs `python -c source` twice, each in a subprocess with a
timeout: once with no TF_MPT_* switch (the float32 reference; base_env: the dispatch check off
and a cache of the test run's own, as for every child script) and once with
TF_MPT_ENABLE=1 TF_MPT_DTYPE=<dtype>, plus the caller's TF_MPT_OP_COSTS, TF_MPT_STEP_TIMING
and TF_MPT_CACHE_DIR (KEPT_VARIABLES: under pytest, the suite's injected cost table and no
step timing, so the mixed run's decisions are the same on every CPU). Both get
PYTHONPATH=<repo root> (the tf_mpt under test is this checkout's) and TF_CPP_MIN_LOG_LEVEL=2;
TF_USE_LEGACY_KERAS=1 only when asked (the tf_keras RNN cells). A program prints one JSON
line last: {"names": [...], "values": [...]}.

Each run is observed (tests/support/half_ops.py, through a sitecustomize on PYTHONPATH), which
counts the half-precision ops TensorFlow executed (the partition graphs of every Session.run
and function call): Run.half_ops. A pair whose
mixed run executed no half op compared float32 with float32 and proves nothing
(Verdict.real_half is False; the tests fail on it, the command line counts it).

The mixed run is *worse* (Verdict.kind) when, in this order of precedence:
    "timeout"    it did not finish within `timeout` s while the reference did (a hang);
    "error"      it exited non-zero (an exception) or printed no JSON while the reference
                 did;
    "nonfinite"  a value is NaN/inf where the reference's is finite;
    "mismatch"   the values differ in number, or one is beyond the dtype's tolerance:
                 |mixed - fp32| > rtol * |fp32| + atol with TOLERANCES[dtype].
Otherwise "ok". When the reference itself fails the program is not valid ("invalid": a
generator bug, not a tf_mpt one). tf_mpt's log lines in the mixed run other than the routine
ones (ROUTINE_LOG) are kept in Verdict.warnings (a rewrite that fell back to float32 is not
"worse" by the definition above, but worth seeing); the CLI counts them.

float16 and loss scaling: by default the automatic path scales float16 losses dynamically,
starting at 2**15, and skips a step whose gradients overflow (by design: the first steps of a
run may be skipped). A skipped step changes the training trajectory, which a value-by-value
comparison after a few steps would call a mismatch. So the numeric comparison in float16 runs
with a static scale, TF_MPT_LOSS_SCALE=FLOAT16_NUMERIC_LOSS_SCALE (1024: scaled gradients of
these tiny models stay far below float16's 65504, so no step is skipped). The default dynamic
scale is still exercised: `run_pair(..., loss_scale="dynamic")` (and the "float16-dynamic"
variant of the thorough profile) runs the program with the default loss scaling and checks
only what must hold regardless: no exception, no hang, no non-finite value
(`compare_values=False`).

Command line: `python -m tests.differential.harness --profile thorough [--programs N]`
draws programs, runs each against one float32 reference in the variants of the profile and
prints counts: programs run, pairs run, differing pairs by kind, known differences
(programs.KNOWN_DIFFERENCES), and every differing program's source.
"""

import argparse
import dataclasses
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

try:  # imported as tests.differential.harness (python -m) or differential.harness (pytest)
    from . import programs
except ImportError:  # run as a plain script
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import programs
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import half_ops  # noqa: E402  pylint: disable=wrong-import-position

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The caller's variables the mixed run keeps: what its decisions read (a cost table standing
# in for this CPU, step timing on or off) and the compiled optimizer's cache.
KEPT_VARIABLES = ("TF_MPT_OP_COSTS", "TF_MPT_STEP_TIMING", "TF_MPT_CACHE_DIR")

# |mixed - fp32| <= rtol * |fp32| + atol for every value (losses after a few training steps,
# eval losses, predictions). bfloat16 has a 7-bit mantissa (unit roundoff 3.9e-3), float16 a
# 10-bit one (4.9e-4); the margins cover rounding of weights and activations compounded over
# <= 5 training steps of the tiny models in programs.py.
BFLOAT16_TOLERANCE = dict(rtol=0.05, atol=0.02)
FLOAT16_TOLERANCE = dict(rtol=0.02, atol=0.01)
TOLERANCES = {"bfloat16": BFLOAT16_TOLERANCE, "float16": FLOAT16_TOLERANCE}
# Static float16 loss scale for the numeric comparison (see the module docstring).
FLOAT16_NUMERIC_LOSS_SCALE = "1024"
DEFAULT_TIMEOUT_S = 120
STDERR_TAIL = 3000
ENABLED_LINE = "tf_mpt: enabled:"  # what the automatic path logs at start
# tf_mpt logs every line as "tf_mpt: <message>" whatever its level; these are the routine
# ones, any other is kept as a warning (Verdict.warnings).
ROUTINE_LOG = ("tf_mpt: enabled:", "tf_mpt: Converted ", "tf_mpt: Keras global dtype policy",
               "tf_mpt: tf_keras global dtype policy", "tf_mpt: float16 runs in ",
               "tf_mpt: bfloat16 runs in ")

OK, TIMEOUT, ERROR, NONFINITE, MISMATCH, INVALID = (
    "ok", "timeout", "error", "nonfinite", "mismatch", "invalid")
WORSE_KINDS = (TIMEOUT, ERROR, NONFINITE, MISMATCH)


@dataclasses.dataclass
class Run:
    """One subprocess run of a program."""
    env: dict              # the TF_MPT_* / keras variables it had (not the whole environment)
    returncode: object     # int, or None after a timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def result(self):
        """The program's JSON line (the last stdout line starting with '{'), or None."""
        for line in reversed(self.stdout.strip().splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    return None
        return None

    @property
    def failed(self):
        return self.timed_out or self.returncode != 0 or self.result is None

    @functools.cached_property
    def observed(self):
        """What half_ops counted ({'half_ops', 'float_ops', 'half_types'}), or None (the
        program never imported TensorFlow, or died first); parsed once."""
        return half_ops.parse(self.stderr)

    @property
    def half_ops(self):
        """Distinct nodes TensorFlow executed with a half type attr T (0 if not counted)."""
        return (self.observed or {}).get("half_ops", 0)

    def stderr_tail(self, limit=STDERR_TAIL):
        return self.stderr[-limit:]


@dataclasses.dataclass
class Verdict:
    kind: str              # OK, or one of WORSE_KINDS, or INVALID
    dtype: str
    detail: str
    source: str
    reference: Run
    mixed: Run
    warnings: list = dataclasses.field(default_factory=list)
    label: str = ""        # what the program is (ProgramSpec.describe()), for reports
    known: object = None   # the programs.KNOWN_DIFFERENCES entry it matches, if any
    eager: bool = False    # an eager program (ProgramSpec.eager): no half op is expected

    @property
    def ok(self):
        return self.kind == OK

    @property
    def worse(self):
        return self.kind in WORSE_KINDS

    @property
    def mixed_enabled(self):
        """Whether the mixed run logged that tf_mpt's automatic path was on."""
        return ENABLED_LINE in self.mixed.stderr

    @property
    def real_half(self):
        """Whether the pair compared half compute with float32: the mixed run executed half
        ops and the reference none (else it compared float32 with float32)."""
        return self.mixed.half_ops > 0 and self.reference.half_ops == 0

    @property
    def half_as_expected(self):
        """Half compute where the program runs graphs; none where it runs eagerly."""
        if self.eager:
            return self.mixed.half_ops == 0 and self.reference.half_ops == 0
        return self.real_half

    def report(self):
        """Everything needed to reproduce and judge a differing run."""
        env = " ".join(f"{k}={v}" for k, v in sorted(self.mixed.env.items()))
        lines = [f"[{self.kind}] {self.dtype} {self.label}".rstrip(),
                 f"  detail: {self.detail}",
                 f"  half ops executed: mixed {self.mixed.half_ops} "
                 f"{(self.mixed.observed or {}).get('half_types', {})}, float32 "
                 f"{self.reference.half_ops}",
                 f"  mixed run: {env} (exit {self.mixed.returncode}, "
                 f"{self.mixed.seconds:.1f} s); float32 run: exit "
                 f"{self.reference.returncode}, {self.reference.seconds:.1f} s"]
        if self.known:
            lines.append(f"  known difference: {self.known['reason']}")
        if self.warnings:
            lines.append("  tf_mpt log (not routine):\n" + _indent("\n".join(self.warnings[:10])))
        failed = self.reference if self.kind == INVALID else self.mixed
        if self.kind != MISMATCH and self.kind != NONFINITE:
            lines.append("  stderr tail:\n" + _indent(failed.stderr_tail()))
        lines.append("  source (run with `python -c` / save and run, PYTHONPATH=<repo root>):\n"
                     + _indent(self.source))
        return "\n".join(lines)


def _indent(text, prefix="    | "):
    return "\n".join(prefix + line for line in text.rstrip("\n").splitlines())


def base_env(legacy_keras=False):
    """The environment of both runs: helpers.child_env() (no TF_MPT_* switch, the dispatch
    check off, the test run's own cache, as for every child script of the suite) with a
    private cache where no test run made one (the command line: never the user's
    ~/.cache/tf_mpt, whose verdicts an earlier script timed), no TF_USE_LEGACY_KERAS, plus
    the harness's variables."""
    import helpers  # pylint: disable=import-outside-toplevel  (tests/support: TensorFlow)
    env = helpers.child_env()
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.setdefault("TF_MPT_CACHE_DIR", _private_cache())
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


_CACHE = []  # the private cache directory made for this process (removed at its exit)


def _private_cache():
    if not _CACHE:
        import atexit  # pylint: disable=import-outside-toplevel
        import shutil  # pylint: disable=import-outside-toplevel
        import tempfile  # pylint: disable=import-outside-toplevel
        _CACHE.append(tempfile.mkdtemp(prefix="tf_mpt-differential-cache-"))
        atexit.register(shutil.rmtree, _CACHE[0], True)
    return _CACHE[0]


def mixed_env_vars(dtype, loss_scale=None, target=None):
    """The TF_MPT_* variables of the mixed run. loss_scale: None picks the harness default
    (FLOAT16_NUMERIC_LOSS_SCALE for float16, tf_mpt's default otherwise); "dynamic" leaves
    tf_mpt's default dynamic scaling; a number sets a static scale. target: TF_MPT_TARGET
    (None: tf_mpt's default, `auto`)."""
    extra = {k: os.environ[k] for k in KEPT_VARIABLES if os.environ.get(k)}
    extra.update(TF_MPT_ENABLE="1", TF_MPT_DTYPE=dtype)
    if target is not None:
        extra["TF_MPT_TARGET"] = target
    if loss_scale is None and dtype == "float16":
        loss_scale = FLOAT16_NUMERIC_LOSS_SCALE
    if loss_scale is not None and loss_scale != "dynamic":
        extra["TF_MPT_LOSS_SCALE"] = str(loss_scale)
    return extra


def run_source(source, extra_env, timeout, legacy_keras=False):
    """Runs `python -c source` with base_env() + extra_env, observed (half_ops counts the
    half ops it executes); never raises for the program."""
    env = base_env(legacy_keras)
    env.update(extra_env)
    env = half_ops.observed_env(env)
    shown = dict(extra_env)
    if legacy_keras:
        shown["TF_USE_LEGACY_KERAS"] = "1"
    began = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", source], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        def text(stream):  # bytes or str, depending on where the timeout struck
            return stream.decode(errors="replace") if isinstance(stream, bytes) else (stream or "")
        return Run(shown, None, text(expired.stdout), text(expired.stderr),
                   time.monotonic() - began, timed_out=True)
    return Run(shown, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - began)


def _finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def judge(source, dtype, reference, mixed, compare_values=True, tolerance=None):
    """The Verdict of a float32 run and a mixed run of `source`."""
    warnings = [line for line in mixed.stderr.splitlines()
                if line.startswith("tf_mpt: ") and not any(p in line for p in ROUTINE_LOG)]

    def verdict(kind, detail):
        return Verdict(kind, dtype, detail, source, reference, mixed, warnings)

    if reference.failed:
        what = ("timed out" if reference.timed_out else
                f"exit {reference.returncode}" if reference.returncode else "printed no JSON")
        return verdict(INVALID, f"the float32 reference run {what}: the program is not valid")
    if mixed.timed_out:
        return verdict(TIMEOUT, f"no exit within the timeout ({mixed.seconds:.0f} s); "
                                f"float32 took {reference.seconds:.1f} s")
    if mixed.returncode != 0:
        last = mixed.stderr.strip().splitlines()[-1:] or [""]
        return verdict(ERROR, f"exit {mixed.returncode}: {last[0][:500]}")
    if mixed.result is None:
        return verdict(ERROR, "exit 0 but no JSON result line on stdout")
    ref_values, mixed_values = reference.result["values"], mixed.result["values"]
    names = reference.result.get("names") or [f"v{i}" for i in range(len(ref_values))]
    if len(ref_values) != len(mixed_values):
        return verdict(MISMATCH, f"{len(mixed_values)} values, float32 printed "
                                 f"{len(ref_values)}")
    bad = [(n, r, m) for n, r, m in zip(names, ref_values, mixed_values)
           if _finite(r) and not _finite(m)]
    if bad:
        return verdict(NONFINITE, "non-finite where float32 is finite: "
                       + ", ".join(f"{n}={m} (float32 {r:.6g})" for n, r, m in bad[:8]))
    if compare_values:
        tol = tolerance or TOLERANCES[dtype]
        far = [(n, r, m) for n, r, m in zip(names, ref_values, mixed_values)
               if _finite(r) and abs(m - r) > tol["rtol"] * abs(r) + tol["atol"]]
        if far:
            return verdict(MISMATCH, f"beyond rtol={tol['rtol']} atol={tol['atol']}: "
                           + ", ".join(f"{n}: {m:.6g} vs float32 {r:.6g}"
                                       for n, r, m in far[:8])
                           + (f" (+{len(far) - 8} more)" if len(far) > 8 else ""))
    return verdict(OK, f"{len(ref_values)} values agree")


def run_pair(source, dtype, timeout=DEFAULT_TIMEOUT_S, *, legacy_keras=False, loss_scale=None,
             compare_values=True, tolerance=None, reference=None, parallel=True, target=None):
    """Runs `source` in float32 and with TF_MPT_ENABLE=1 TF_MPT_DTYPE=dtype; a Verdict.

    reference: a Run of the same source in float32 to reuse (one reference for several
    dtypes). parallel: run the two subprocesses at the same time (2 cores: about half the
    wall time). See mixed_env_vars for loss_scale, judge for the rest.
    """
    mixed_vars = mixed_env_vars(dtype, loss_scale, target)
    if reference is not None:
        mixed = run_source(source, mixed_vars, timeout, legacy_keras)
    elif parallel:
        with ThreadPoolExecutor(2) as pool:
            ref_future = pool.submit(run_source, source, {}, timeout, legacy_keras)
            mixed_future = pool.submit(run_source, source, mixed_vars, timeout, legacy_keras)
            reference, mixed = ref_future.result(), mixed_future.result()
    else:
        reference = run_source(source, {}, timeout, legacy_keras)
        mixed = run_source(source, mixed_vars, timeout, legacy_keras)
    return judge(source, dtype, reference, mixed, compare_values, tolerance)


# ---------------------------------------------------------------------------------------------
# profiles

# A variant is (name, dtype, loss_scale, compare_values).
VARIANTS = {
    "bfloat16": ("bfloat16", None, True),
    "float16": ("float16", None, True),  # static FLOAT16_NUMERIC_LOSS_SCALE
    "float16-dynamic": ("float16", "dynamic", False),  # default scaling: crash/hang/NaN only
}
# tf1/tf2 program counts and variants. From `candidates` derandomized hypothesis draws (per
# kind), the tf1 + tf2 programs that cover the most pairs of components (select_covering;
# hypothesis's first draws alone are mostly the simplest programs). "fast"
# (test_differential.py's default run): no known difference, each program in one dtype,
# alternating; "thorough": known differences included (they count as "known"), each program
# in every variant against one float32 reference.
PROFILES = {
    "fast": dict(tf1=5, tf2=3, candidates=200, exclude_known=True,
                 variants=("float16", "bfloat16"), alternate=True),
    "thorough": dict(tf1=24, tf2=16, candidates=400, exclude_known=False,
                     variants=("bfloat16", "float16", "float16-dynamic"), alternate=False),
}


def draw_specs(strategy, count, settings_=None, seed=None):
    """`count` distinct specs from a hypothesis strategy, drawn under `settings_` (default:
    derandomized, so every run draws the same programs; `seed` picks another fixed draw)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    settings_ = settings_ or settings(max_examples=count, derandomize=seed is None,
                                      deadline=None, database=None, phases=[Phase.generate],
                                      suppress_health_check=list(HealthCheck))
    drawn = []

    @settings_
    @given(strategy)
    def collect(spec):
        if spec not in drawn:
            drawn.append(spec)

    if seed is not None:
        collect = hypothesis_seed(seed)(collect)
    collect()
    return drawn[:count]


def select_covering(specs, count, exclude_known=True):
    """`count` of `specs` chosen greedily to cover the most pairs of component tags (ties:
    the earlier spec), so a handful of programs exercises most components and many of their
    combinations. exclude_known leaves out specs that match a KNOWN_DIFFERENCES entry in
    either dtype (test_differential.py runs one of each of those in its own test)."""
    pool = [s for s in specs if not exclude_known or not any(
        programs.known_difference(s, dtype) for dtype in TOLERANCES)]

    def pairs(spec):
        tags = sorted(spec.tags())
        return {(a, b) for i, a in enumerate(tags) for b in tags[i:]}

    chosen, covered = [], set()
    while pool and len(chosen) < count:
        best = max(pool, key=lambda s: len(pairs(s) - covered))  # max keeps the first tie
        chosen.append(best)
        covered |= pairs(best)
        pool.remove(best)
    return chosen


def run_spec(spec, variants, timeout=DEFAULT_TIMEOUT_S):
    """Runs one spec against one float32 reference in each variant (names of VARIANTS)."""
    source = spec.source()
    verdicts, reference = [], None
    for name in variants:
        dtype, loss_scale, compare = VARIANTS[name]
        verdict = run_pair(source, dtype, timeout, legacy_keras=spec.needs_legacy_keras,
                           loss_scale=loss_scale, compare_values=compare, reference=reference,
                           target=spec.target)
        reference = verdict.reference
        verdict.label = f"({name}) {spec.describe()}"
        verdict.eager = spec.eager
        verdict.known = programs.known_difference(spec, dtype) if verdict.worse else None
        verdicts.append(verdict)
    return verdicts


def run_profile(specs, variants, alternate=False, timeout=DEFAULT_TIMEOUT_S, log=None):
    """Runs the specs; alternate=True runs spec i in variants[i % len(variants)] only."""
    verdicts = []
    for i, spec in enumerate(specs):
        chosen = (variants[i % len(variants)],) if alternate else variants
        began = time.monotonic()
        results = run_spec(spec, chosen, timeout)
        verdicts += results
        if log:
            log(f"[{i + 1}/{len(specs)}] {time.monotonic() - began:5.1f} s "
                + " ".join(f"{v.dtype}{'(dyn)' if 'dynamic' in v.label else ''}="
                           f"{v.kind}{'(known)' if v.known else ''}[{v.mixed.half_ops} half ops]"
                           for v in results)
                + f"  {spec.describe()}")
    return verdicts


def counts(verdicts):
    """{'pairs': n, 'ok': n, 'known': n, kind: n for every worse/invalid kind seen,
    'real_half': pairs that compared half compute with float32, per dtype too}."""
    out = {"pairs": len(verdicts), OK: 0, "known": 0}
    for dtype in sorted({v.dtype for v in verdicts}):
        of_dtype = [v for v in verdicts if v.dtype == dtype]
        out[f"real_half_{dtype}"] = f"{sum(v.real_half for v in of_dtype)}/{len(of_dtype)}"
    for v in verdicts:
        if v.ok:
            out[OK] += 1
        elif v.known:
            out["known"] += 1
        else:
            out[v.kind] = out.get(v.kind, 0) + 1
    return out


def unexpected(verdicts):
    """Verdicts that are neither ok nor a known difference: what a test fails on."""
    return [v for v in verdicts if not v.ok and not v.known]


HAS_TF_KERAS = importlib.util.find_spec("tf_keras") is not None


def profile_specs(profile, tf1=None, tf2=None, seed=None, settings_=None):
    """The programs of a profile: tf1 + tf2 specs (counts default to the profile's)."""
    config = PROFILES[profile]
    specs = []
    for strategy, count in ((programs.tf1_specs(), config["tf1"] if tf1 is None else tf1),
                            (programs.tf2_specs(), config["tf2"] if tf2 is None else tf2)):
        if not count:
            continue
        drawn = draw_specs(strategy, config["candidates"], settings_, seed)
        # tf_keras comes with --no-deps (README): without it its programs cannot run
        drawn = [s for s in drawn if HAS_TF_KERAS or not s.needs_legacy_keras]
        specs += select_covering(drawn, count, config["exclude_known"])
    return specs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    parser.add_argument("--tf1", type=int, help="number of TF1 programs (profile's default)")
    parser.add_argument("--tf2", type=int, help="number of TF2 programs (profile's default)")
    parser.add_argument("--seed", type=int, help="draw other programs (default: derandomized)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--show-known", action="store_true",
                        help="print the source of known differences too")
    args = parser.parse_args(argv)
    config = PROFILES[args.profile]
    specs = profile_specs(args.profile, args.tf1, args.tf2, args.seed)
    began = time.monotonic()
    verdicts = run_profile(specs, config["variants"], config["alternate"], args.timeout,
                           log=lambda line: print(line, flush=True))
    elapsed = time.monotonic() - began
    for v in verdicts:
        if not v.ok and (not v.known or args.show_known):
            print("\n" + v.report())
    warned = sum(1 for v in verdicts if v.warnings)
    lines = sorted({line[:300] for v in verdicts for line in v.warnings})
    if lines:
        print("\ntf_mpt log lines (not routine) in mixed runs:\n" + _indent("\n".join(lines)))
    not_enabled = sum(1 for v in verdicts if not v.mixed_enabled)
    float32_only = [v for v in verdicts if not v.half_as_expected]
    for v in float32_only:
        print(f"\n{v.mixed.half_ops} half ops executed ({v.dtype}; "
              f"{'eager: 0 expected' if v.eager else 'graphs: some expected'}): {v.label}")
    summary = counts(verdicts)
    print(f"\nprofile {args.profile}: {len(specs)} programs, {summary.pop('pairs')} pairs "
          f"in {elapsed:.0f} s; " + ", ".join(f"{k}={n}" for k, n in summary.items())
          + f"; mixed runs with tf_mpt warnings: {warned}, without tf_mpt enabled: "
          f"{not_enabled}, with half ops not as expected: {len(float32_only)}")
    return 1 if unexpected(verdicts) or float32_only else 0


if __name__ == "__main__":
    sys.exit(main())
