"""The Timer: what the choosing step asks of whatever measures its candidates.

Two implement it: a GraphDef's Session sandboxes (graphs.GraphTimer) and a traced step's
copies of its variables (steps.StepTimer, as XLA compiles it where the step is
jit_compile); a test's fake implements it too. A timer only measures: what it measured is
returned (times) or kept in `peaks`; every decision is the Policy's.
"""

from tf_mpt.choose.timers import safety as _safety


class Timer:
    """Measures candidate graphs ({candidate name: GraphDef}) on this CPU.

    Attributes:
        peaks: {candidate: step peak bytes of one traced run} of the candidates timed (and
            peaks[RESIDENT]: the bytes every candidate holds alike), filled as they are
            timed; {} where none can be measured (XLA keeps no allocation records).
        compiled: the candidates are timed as XLA compiles them (a jit_compile step).
        calls_compiled: the graph calls a function XLA compiles (timed whatever the cost
            model predicts: when.step_reason).
        profiles: whether `profile` gives per-node times (XLA fuses the nodes: no).
    """
    compiled = False
    calls_compiled = False
    profiles = True

    def __init__(self):
        self.peaks = {}

    def time(self, graphs, budget, policy):
        """{candidate: (seconds per run, one per round)}: a warm-up run each, then rounds
        within `budget` seconds (policy: a tf_mpt.choose.policy.Policy); step peaks into
        `peaks`. NotTimed where they cannot be run safely, TooSlow where the rounds do not
        fit."""
        raise NotImplementedError

    def peaks_only(self, graphs, policy):
        """One first run and one traced run of each: their peaks into `peaks`, no timing
        (a graph too slow to time)."""
        raise _safety.NotTimed("this timer measures no peaks alone")

    def profile(self, graphs, policy):
        """{candidate: {node name: seconds}}, the fastest of policy.profile_runs traced
        runs per node."""
        raise _safety.NotTimed("this timer gives no per-node profile")

    def key_graph(self, graph_def):
        """The GraphDef a verdict of `graph_def` is cached by, or None (not cached here);
        NotTimed where it would not be timed."""
        return None

    def close(self):
        """Ends what the timer keeps open across the stages (a sandbox)."""
