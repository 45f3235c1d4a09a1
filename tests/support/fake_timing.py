"""The tests' Timer for graph timing: a timers.graphs.GraphTimer whose sandbox and clock are
the test's (FakeTimer), installed as the one decide makes. Each run advances the clock by what
the test's cost function says of the candidate's GraphDef, so every verdict is the test's,
never this CPU's; every rule above the sandbox (the rounds, the budget, the copies' bound,
the fetches each candidate needs) runs as it does for a real graph."""

import functools

from tf_mpt.choose.timers import graphs as _graph_sandbox


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Fakes:
    """What the fake sandboxes read and record.

    cost(GraphDef, run index) -> seconds per run; profile(GraphDef) -> {node name: seconds}
    (the refinement's per-node profile; none by default); peak(GraphDef) -> step peak bytes;
    setup(GraphDef) -> seconds making its sandbox takes (its import, its copies: 0 by default).
    runs: the GraphDef of every run; made: (GraphDef, inputs, fetches) of every sandbox."""

    def __init__(self):
        self.clock, self.runs, self.made = Clock(), [], []
        self.cost = lambda graph_def, index: 1e-3
        self.profile = lambda graph_def: {}
        self.peak = lambda graph_def: 0
        self.setup = lambda graph_def: 0.0


def timer_type(fakes, check=None):
    """A GraphTimer type whose sandbox is the fakes' (`check(inputs, fetches)` called for each
    sandbox made) and whose rounds read fakes.clock: a timers.protocol.Timer."""

    class FakeSandbox:
        def __init__(self, graph_def, inputs, fetches, needed, timeout_ms):
            assert timeout_ms > 0
            if check is not None:
                check(inputs, fetches)
            self.graph_def, self.index = graph_def, 0
            fakes.clock.now += fakes.setup(graph_def)
            fakes.made.append((graph_def, dict(inputs), list(fetches)))

        def run(self):
            fakes.clock.now += fakes.cost(self.graph_def, self.index)
            self.index += 1
            fakes.runs.append(self.graph_def)

        def close(self):
            pass

        def profile(self, runs):
            return fakes.profile(self.graph_def)

        def peak(self):
            return fakes.peak(self.graph_def)

    return functools.partial(_graph_sandbox.GraphTimer, sandbox=FakeSandbox, clock=fakes.clock)


def install(monkeypatch, check=None):
    """Makes the Timer decide uses for a graph (timers.graphs.GraphTimer) the fakes' one
    (timer_type); `check(inputs, fetches)` is called for each sandbox. Returns the Fakes."""
    fakes = Fakes()
    monkeypatch.setattr(_graph_sandbox, "GraphTimer", timer_type(fakes, check))
    return fakes


class StepCalls:
    """What a fake step timer was asked: `times` [(batch, budget, [candidate names],
    compiled)] per timing call, `profiles` [[candidate names]] per profile."""

    def __init__(self):
        self.times, self.profiles = [], []


def install_step_timer(monkeypatch, times, profile=None):
    """Makes the Timer a traced step is timed with (timers.step_timer.StepTimer) one whose
    measurements are the test's: `times({candidate: GraphDef})` -> {candidate: seconds per
    round}; `profile({candidate: GraphDef})` -> {candidate: {node name: seconds}} (None: no
    node timed, nothing to refine). Its rules (a step under a strategy is not timed, the
    candidates' functions named apart, XLA's steps not profiled, the cache's key graph) are
    the StepTimer's own. Returns the StepCalls it records."""
    from tf_mpt.choose.timers import step_timer as _step_timer  # pylint: disable=C0415
    calls = StepCalls()

    class FakeStepTimer(_step_timer.StepTimer):
        def measure_times(self, graphs, budget, policy):
            calls.times.append((policy.batch, budget, list(graphs), self.compiled))
            return times(graphs)

        def measure_profiles(self, graphs, policy):
            calls.profiles.append(list(graphs))
            return profile(graphs) if profile is not None else {name: {} for name in graphs}

        def measure_peaks(self, graphs, policy):
            return {}

    monkeypatch.setattr(_step_timer, "StepTimer", FakeStepTimer)
    return calls
