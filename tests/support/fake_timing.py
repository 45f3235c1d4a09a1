"""An injected clock and sandbox for graph timing (timers.rounds._clock, timers.graphs._Sandbox):
each run advances the clock by what the test's cost function says of the candidate's GraphDef,
so every verdict is the test's, never this CPU's."""

from tf_mpt.choose.timers import graphs as _graph_sandbox


from tf_mpt.choose.timers import rounds as _rounds


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


def install(monkeypatch, check=None):
    """Puts the fakes in graph_timing; `check(inputs, fetches)` is called for each sandbox.
    Returns the Fakes."""
    fakes = Fakes()

    class FakeSandbox:
        def __init__(self, graph_def, inputs, fetches, needed):
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

    monkeypatch.setattr(_rounds, "_clock", fakes.clock)
    monkeypatch.setattr(_graph_sandbox, "_Sandbox", FakeSandbox)
    return fakes
