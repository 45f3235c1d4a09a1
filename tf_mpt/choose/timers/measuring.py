"""What both sandboxes' runs are measured by, once: the rounds' times and each candidate's
peak (time_each), the per-node profile (profile_each), and what a traced run's RunMetadata
says (step_peak_bytes, fastest_node_seconds).

A sandbox (a GraphDef's: graphs.py, one Session per candidate; a traced step's: steps.py,
one Session holding copies of its variables) gives {candidate: run()}, `peak(candidate)`
(bytes of one traced run) and `profile(candidate, runs)` ({node name: seconds}); what it
copies, and how, is its own.
"""

from tf_mpt.choose import ledger as _ledger


def time_each(runners, peak, resident, rounds, budget_seconds, peaks=None):
    """{candidate: (seconds per run, ...)}: `rounds(runners, budget_seconds)` (timers.rounds:
    rounds, first_runs); then, where `peaks` (a dict) is given, {candidate: peak(candidate)}
    into it and peaks[RESIDENT] = `resident` (the bytes every candidate holds alike)."""
    times = rounds(runners, budget_seconds)
    if peaks is not None:
        for name in runners:
            peaks[name] = peak(name)
        peaks[_ledger.RESIDENT] = resident
    return times


def profile_each(runners, profile, runs):
    """{candidate: {node name: seconds}}: each candidate run once (a warm-up), then
    profile(candidate, runs) (the fastest of `runs` traced runs, per node)."""
    found = {}
    for name, run in runners.items():
        run()
        found[name] = profile(name, runs)
    return found


def step_peak_bytes(metadata):
    """The highest sum of bytes TensorFlow's allocators handed out and had not yet taken
    back during one traced run (RunMetadata with FULL_TRACE: its allocation records): what
    a step adds on top of what lives across steps (variables, inputs held in variables)."""
    events = []
    for device in metadata.step_stats.dev_stats:
        for stats in device.node_stats:
            for memory in stats.memory:
                events.extend((record.alloc_micros, record.alloc_bytes)
                              for record in memory.allocation_records)
    events.sort(key=lambda event: (event[0], -event[1]))  # at one instant, allocations first
    total = peak = 0
    for _, size in events:
        total += size
        peak = max(peak, total)
    return peak


def fastest_node_seconds(metadatas, prefix=""):
    """{node name: seconds}: per node whose name starts with `prefix` (taken off), the
    fastest over the traced runs `metadatas` (RunMetadata) of its kernels' summed times."""
    best = {}
    for metadata in metadatas:
        seconds = {}
        for device in metadata.step_stats.dev_stats:
            for stats in device.node_stats:
                node = stats.node_name.partition(":")[0]
                if node.startswith(prefix):
                    node = node[len(prefix):]
                    seconds[node] = seconds.get(node, 0.0) + 1e-6 * max(
                        stats.op_end_rel_micros - stats.op_start_rel_micros, 0)
        for node, value in seconds.items():
            best[node] = min(best.get(node, value), value)
    return best
