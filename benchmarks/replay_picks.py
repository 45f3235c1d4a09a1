"""The same measurements, two checkouts' picks: whether a change of the choosing step changed
what it picks, free of run-to-run noise.

    python benchmarks/replay_picks.py record --out picks.json [--models MobileNetV2 ...]
    python benchmarks/replay_picks.py replay picks.json      # this checkout's picks

`record` rewrites each model's inference and training graph (benchmarks/real_models.py's, in
bfloat16, target here) as real_models.py does, timing the candidates on this CPU, and writes
every call the choosing step made of its Timer (timers.graphs.GraphTimer: the candidates
asked for, the times and peaks it returned) with the pick, and the cache directory it used
(this CPU's kernel times: the prediction). `replay` rewrites the same graphs with a Timer
that hands back the recorded measurements in order (nothing is timed) and the recorded
kernel times (the same prediction), and prints each graph's recorded pick beside its own:
run it in another checkout (PYTHONPATH=that checkout) to compare two versions on one set of
measurements. Where a version asks its Timer for other candidates than were recorded, the
replay says so (its choosing step took another path) and stops that graph.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import real_models  # noqa: E402  (benchmarks/real_models.py: its models, built the same way)

PHASES = ("inference", "training")


class Diverged(Exception):
    """The choosing step asked its Timer for other candidates than the recording holds."""


def _timer_types(calls, replay, made):
    """A GraphTimer subclass recording into `calls` (a list, one [call, ...] per timer), or
    replaying them in order where `replay`; each timer made is appended to `made`. A
    replaying timer keeps what it found different in `diverged` (the choosing step catches
    what a Timer raises: a stage that fails leaves the pick as it was), and what it was
    given and not asked for stays in `recorded`."""
    from tf_mpt.choose.timers import graphs as _graphs  # pylint: disable=C0415
    base = _graphs.GraphTimer

    class Recording(base):
        def __init__(self, fetches, *args, **kwargs):
            super().__init__(fetches, *args, **kwargs)
            self.recorded = []
            calls.append(self.recorded)

        def _record(self, kind, graphs, found):
            self.recorded.append({"kind": kind, "candidates": sorted(graphs),
                                  "result": found, "peaks": dict(self.peaks)})
            return found

        def time(self, graphs, budget, policy):
            found = super().time(graphs, budget, policy)
            return self._record("time", graphs, {k: list(v) for k, v in found.items()})

        def peaks_only(self, graphs, policy):
            found = super().peaks_only(graphs, policy)
            return self._record("peaks_only", graphs, {k: list(v) for k, v in found.items()})

        def profile(self, graphs, policy):
            return self._record("profile", graphs, super().profile(graphs, policy))

    class Replaying(base):
        def __init__(self, fetches, *args, **kwargs):
            super().__init__(fetches, *args, **kwargs)
            self.recorded = list(calls.pop(0)) if calls else []
            self.diverged = []
            made.append(self)

        def _next(self, kind, graphs):
            if not self.recorded:
                self.diverged.append(f"a {kind} call of {sorted(graphs)} beyond the recording")
                raise Diverged(self.diverged[-1])
            call = self.recorded.pop(0)
            if call["kind"] != kind or call["candidates"] != sorted(graphs):
                self.diverged.append(f"asked {kind} of {sorted(graphs)}, recorded "
                                     f"{call['kind']} of {call['candidates']}")
                raise Diverged(self.diverged[-1])
            self.peaks.update(call["peaks"])
            return call["result"]

        def time(self, graphs, budget, policy):
            return {k: tuple(v) for k, v in self._next("time", graphs).items()}

        def peaks_only(self, graphs, policy):
            return {k: tuple(v) for k, v in self._next("peaks_only", graphs).items()}

        def profile(self, graphs, policy):
            return self._next("profile", graphs)

    return Replaying if replay else Recording


def _rewrite(graphs, phase):
    """The verdict of one rewrite of `graphs`' `phase` graph, as real_models.py makes it."""
    import tf_mpt  # pylint: disable=import-outside-toplevel
    if phase == "inference":
        graph, keep = graphs.infer_graph, [f.split(":")[0] for f in graphs.infer_fetches]
    else:
        graph, keep = graphs.train_graph, ["loss", "train", graphs.init]
    return tf_mpt.rewrite_graph_def(graph.as_graph_def(), dtype="bfloat16",
                                    fetches=keep).report.verdict


def _decide_all(models, timer_type, made):
    """{model/phase: (pick, its line, or why it took another path)} with `timer_type` as
    decide's graph timer (`made`: the timers it makes)."""
    from tf_mpt.choose.timers import graphs as _graphs  # pylint: disable=C0415
    _graphs.GraphTimer = timer_type
    found = {}
    for name in models:
        graphs = real_models.Graphs(name, quick=False)
        for phase in PHASES:
            del made[:]
            try:
                verdict = _rewrite(graphs, phase)
                found[f"{name} {phase}"] = (verdict.pick if verdict else "(no verdict)",
                                            verdict.describe() if verdict else "")
            except Diverged as error:
                found[f"{name} {phase}"] = ("(diverged)", str(error))
            other = [d for timer in made for d in getattr(timer, "diverged", ())] + [
                f"{len(timer.recorded)} recorded call(s) not asked for" for timer in made
                if getattr(timer, "diverged", None) is not None and timer.recorded]
            if other:
                found[f"{name} {phase}"] = ("(diverged)", "; ".join(other))
    return found


def _cpu_line():
    from tf_mpt import _cpu  # pylint: disable=import-outside-toplevel
    flags = sorted(f for f in _cpu.real_cpu_flags() if f.startswith(("avx512", "amx")))
    return f"{_cpu.cpu_model()} ({' '.join(flags) or 'no AVX-512'})"


def record(args):
    print(f"CPU: {_cpu_line()}")
    cache = tempfile.mkdtemp(prefix="tf_mpt_replay_")
    os.environ["TF_MPT_CACHE_DIR"] = cache
    calls = []
    picks = _decide_all(args.models, _timer_types(calls, False, []), [])
    for name in os.listdir(cache):  # (a replay reads the kernel times, not the verdicts)
        if name.startswith("verdicts-"):
            os.remove(os.path.join(cache, name))
    tables = {}
    for name in os.listdir(cache):
        if name.endswith(".json"):
            with open(os.path.join(cache, name)) as f:
                tables[name] = f.read()
    with open(args.out, "w") as f:
        json.dump({"models": args.models, "picks": {k: v[0] for k, v in picks.items()},
                   "lines": {k: v[1] for k, v in picks.items()}, "calls": calls,
                   "tables": tables, "cpu": _cpu_line()}, f, indent=1)
    shutil.rmtree(cache, ignore_errors=True)
    for key, (pick, _) in picks.items():
        print(f"{key}: {pick}")
    print(f"wrote {args.out}: {sum(len(c) for c in calls)} timer call(s) of {len(calls)} "
          "decision(s)")


def replay(args):
    with open(args.recording) as f:
        recorded = json.load(f)
    cache = tempfile.mkdtemp(prefix="tf_mpt_replay_")
    os.environ["TF_MPT_CACHE_DIR"] = cache
    for name, text in recorded["tables"].items():
        with open(os.path.join(cache, name), "w") as f:
            f.write(text)
    calls = [list(c) for c in recorded["calls"]]
    print(f"recorded on: {recorded['cpu']}; replayed on: {_cpu_line()}")
    made = []
    picks = _decide_all(recorded["models"], _timer_types(calls, True, made), made)
    shutil.rmtree(cache, ignore_errors=True)
    same = 0
    print("| graph | recorded pick | this checkout's pick |\n|---|---|---|")
    for key, (pick, line) in picks.items():
        was = recorded["picks"].get(key, "(not recorded)")
        same += pick == was
        print(f"| {key} | {was} | {pick}{'' if pick == was else ' (differs)'} |")
        if pick == "(diverged)":
            print(f"  {line}", file=sys.stderr)
    print(f"{same} of {len(picks)} picks the same on the same measurements")
    return 0 if same == len(picks) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record")
    rec.add_argument("--out", required=True)
    rec.add_argument("--models", nargs="+", default=["MobileNetV2", "Transformer", "LSTM"])
    rep = commands.add_parser("replay")
    rep.add_argument("recording")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args)
        return 0
    return replay(args)


if __name__ == "__main__":
    sys.exit(main())
