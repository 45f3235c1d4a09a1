"""What ops cost on a machine: measured once, kept in a table, read by every decision.

    op_costs.py       the kernel-time table (OpCosts): this CPU's (measured at first use and
                      cached in TF_MPT_CACHE_DIR, by a child process: ProbeServer) or a file's
                      (TF_MPT_OP_COSTS, a target FILE); per-node times (NodeTimes)
    probes.py         the probes that measure it, run in that child process
                      (`python -m tf_mpt.costs.probes`)
    probe_ops.py      the op types the probes time, by name
    flops.py          floating-point operations of the ops that dominate a model's time (the
                      table's unit for matrix products and convolutions)
    contractions.py   the matrix products and convolutions, named once

The painter (tf_mpt.rewrite.paint) only reads a table; nothing here paints or edits a graph.
"""
