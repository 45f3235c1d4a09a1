"""The target: the machine a rewrite's precision decisions are made for (no TensorFlow import).

A model is often converted on one machine and run on another (a CI runner without native
bfloat16 preparing a model for a Zen 4 or Sapphire Rapids server; a build box without a GPU
preparing a float16 model for a GPU). So every decision names the machine it is for:

    rules   the op lists alone (Grappler's decisions): right for a GPU and for any machine
            nobody has measured; nothing is measured, the output is the same everywhere
    here    this CPU, measured at first use (the cost model keeps float32 what its half
            kernels, Casts included, would make slower here)
    FILE    a table of kernel times measured on the target machine (`tf-mpt measure --out
            FILE` run there); nothing is measured, the output is the same everywhere
    auto    `here` where this CPU runs the half type natively and no GPU will run the graph,
            otherwise `rules` (float16's speed target is the GPU: always `rules`)

Resolution, for a requested target and half dtype:

    requested rules / here / FILE          -> that target
    auto, TF_MPT_COST_MODEL=0               -> rules      (the older switch, an alias)
    auto, TF_MPT_COST_MODEL=1               -> here       (for float16 too)
    auto, float16                           -> rules
    auto, bfloat16, TF_MPT_OP_COSTS=FILE    -> FILE       (a table standing in for this CPU)
    auto, bfloat16, a GPU visible           -> rules
    auto, bfloat16, native bfloat16 CPU     -> here
    auto, bfloat16, otherwise               -> rules, with the reason said once

A resolved Target is one value a rewrite makes once (`tf_mpt.rewrite.target_for`) and
passes down: what it is (kind, label), the kernel-time table its decisions read (`costs`:
read-only, measured before any decision), the machine that table stands for, the remapper
fusions it has and its threads.

Example:
    >>> resolve(Config(target="rules"), "bfloat16").label
    'rules'
"""

import dataclasses
import logging
import os
import typing

from tf_mpt import _cpu

_log = logging.getLogger("tf_mpt")

AUTO, HERE, RULES = "auto", "here", "rules"
NAMES = (AUTO, HERE, RULES)
_said = set()  # the auto reasons already logged in this process


@dataclasses.dataclass(frozen=True)
class Target:
    """A resolved target.

    Attributes:
        kind: 'rules', 'here' or 'table'.
        table: the cost table file to read: the target's ('table'), or the one standing in for
            this CPU's measurements ('here' with TF_MPT_OP_COSTS set); None otherwise.
        why: why `auto` chose this target, or '' when it was asked for.
        notice: True where `auto` chose `rules` although this CPU could be measured (no
            native half type, or a GPU): `say_why_once` logs `why`.
        stands_in: a 'table' that stands in for this CPU (`auto` with TF_MPT_OP_COSTS), not
            a table of another machine.
        costs: the kernel-time table decisions read (an op_costs.OpCosts), None for `rules`
            (set by op_costs.bind).
        machine: the machine `costs` stands for (this CPU's identity, or the table's source).
        fusions: the remapper fusions the target has (_cpu.REMAPPER_FUSIONS names).
        threads: the CPU threads the table was measured with (0: not recorded).
        slow_ops: where the graph runs on this machine, {op type: (ratio, pattern)} of the
            op types whose half kernel TensorFlow runs here more than
            costs.dispatch.SLOW times slower than float32 (the dispatch check): they stay
            float32 (set by rewrite.measuring.check_dispatch).
        inaccurate_ops: likewise, {op type: (error ratio, pattern)} of the op types whose
            half kernel TensorFlow runs here with more than costs.dispatch.INACCURATE times
            the error of rounding float32's result to the half type (the numerics check):
            they stay float32.
    """
    kind: str
    table: typing.Optional[str] = None
    why: str = ""
    notice: bool = False  # `auto` set aside what the user may expect: said once (INFO)
    stands_in: bool = False
    costs: typing.Any = dataclasses.field(default=None, compare=False, repr=False)
    machine: str = ""
    fusions: frozenset = _cpu.REMAPPER_FUSIONS
    threads: int = 0
    slow_ops: typing.Mapping = dataclasses.field(default_factory=dict, compare=False)
    inaccurate_ops: typing.Mapping = dataclasses.field(default_factory=dict, compare=False)

    @property
    def label(self):
        """'rules', 'here', or the table's file name: what the summary line names."""
        if self.kind == "table":
            return os.path.basename(self.table)
        return self.kind

    @property
    def where(self):
        """Where its kernel times were measured, for a decision's reason: 'here' (this CPU,
        or the table standing in for it) or 'in <table file>'."""
        return "here" if self.kind == HERE else f"in {self.label}"

    @property
    def for_this_cpu(self):
        """True if the decisions are made for the CPU running them: `here`, or a table
        standing in for it; False for `rules` and a table of another machine."""
        return self.kind == HERE or (self.kind == "table" and self.stands_in)

    @property
    def measures(self):
        """True if decisions for this target may time kernels on this machine."""
        return self.kind == HERE and self.table is None


def parse(value, variable="target"):
    """'auto', 'here', 'rules', or the absolute path of an existing file; ValueError otherwise.

    `variable` names the setting in the message ('target' for the API, TF_MPT_TARGET, --target).
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{variable} must be auto, here, rules or the path of a cost table "
                         f"written by `tf-mpt measure --out FILE`. Received: {variable}="
                         f"{value!r}" + ("" if isinstance(value, str) else
                                         f" (of type {type(value).__name__})"))
    text = value.strip()
    if text.lower() in NAMES:
        return text.lower()
    if not os.path.isfile(text):
        raise ValueError(f"{variable} must be auto, here, rules or the path of a cost table "
                         f"written by `tf-mpt measure --out FILE`; {text!r} is none of these "
                         f"(no such file). Received: {variable}={value!r}")
    return os.path.abspath(text)


def resolve(config, dtype, gpu_visible=False):
    """The Target for `config` (its target, cost-model switch, table and CPU flags) and the
    half `dtype` name ('float16' or 'bfloat16')."""
    requested = config.target
    if requested == RULES:
        return Target(RULES)
    if requested == HERE:
        return Target(HERE, config.op_costs)
    if requested != AUTO:
        return Target("table", requested)
    if config.cost_model == "0":
        return Target(RULES, why="TF_MPT_COST_MODEL=0")
    if config.cost_model == "1":
        return Target(HERE, config.op_costs, why="TF_MPT_COST_MODEL=1")
    if dtype != "bfloat16":
        return Target(RULES, why=f"{dtype}'s speed target is the GPU: decisions follow the "
                      "op lists")
    if config.op_costs:
        return Target("table", config.op_costs, why="TF_MPT_OP_COSTS names a cost table",
                      stands_in=True)
    if gpu_visible:
        return Target(RULES, why="a GPU will run the graph: this CPU's timings say nothing "
                      "about it; decisions follow the op lists", notice=True)
    flags = _cpu.cpu_flags(config)
    if _cpu.has_native_bfloat16(flags):
        return Target(HERE, why="this CPU has native bfloat16 "
                      f"({', '.join(f for f in _cpu.NATIVE_BFLOAT16_FLAGS if f in flags)})")
    return Target(RULES, why=f"this CPU has no native {dtype}: its timings say nothing about "
                  "the machine that will run the model; decisions follow the op lists; "
                  "--target FILE (TF_MPT_TARGET=FILE) for a measured target", notice=True)


def say_why_once(target, dtype):
    """Logs, once per process, why `auto` chose `rules` where the user may expect `here`."""
    if target.notice and (dtype, target.why) not in _said:
        _said.add((dtype, target.why))
        _log.info("target for %s: %s (%s)", dtype, target.label, target.why)
