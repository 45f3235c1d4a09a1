"""Config: the only reader of TF_MPT_* environment variables.

`Config.from_env(environ)` parses a mapping once (tests pass a plain dict) into an immutable
Config. Bad values raise ValueError naming the variable, the value and what is accepted.

Example:
    >>> cfg = Config.from_env({"TF_MPT_DENYLIST_ADD": "Tanh"})
    >>> "Tanh" in cfg.lists_for("float16").deny
    True
"""

import dataclasses
import re

from tf_mpt import lists as _lists

TF_MPT_ALLOWLIST_ADD = "TF_MPT_ALLOWLIST_ADD"
TF_MPT_ALLOWLIST_REMOVE = "TF_MPT_ALLOWLIST_REMOVE"
TF_MPT_INFERLIST_ADD = "TF_MPT_INFERLIST_ADD"
TF_MPT_INFERLIST_REMOVE = "TF_MPT_INFERLIST_REMOVE"
TF_MPT_DENYLIST_ADD = "TF_MPT_DENYLIST_ADD"
TF_MPT_DENYLIST_REMOVE = "TF_MPT_DENYLIST_REMOVE"
TF_MPT_CLEARLIST_ADD = "TF_MPT_CLEARLIST_ADD"
TF_MPT_CLEARLIST_REMOVE = "TF_MPT_CLEARLIST_REMOVE"
TF_MPT_DUMP_DIR = "TF_MPT_DUMP_DIR"

# (variable, default, meaning): the README's env-var table is checked against this by a test.
ENV_VARS = (
    (TF_MPT_ALLOWLIST_ADD, "", "Comma-separated op names to put on the allow list "
     "(taken off any other list, so one ADD moves an op)."),
    (TF_MPT_ALLOWLIST_REMOVE, "", "Comma-separated op names to take off the allow list."),
    (TF_MPT_INFERLIST_ADD, "", "Comma-separated op names to put on the infer list."),
    (TF_MPT_INFERLIST_REMOVE, "", "Comma-separated op names to take off the infer list."),
    (TF_MPT_DENYLIST_ADD, "", "Comma-separated op names to put on the deny list."),
    (TF_MPT_DENYLIST_REMOVE, "", "Comma-separated op names to take off the deny list."),
    (TF_MPT_CLEARLIST_ADD, "", "Comma-separated op names to put on the clear list."),
    (TF_MPT_CLEARLIST_REMOVE, "", "Comma-separated op names to take off the clear list."),
    (TF_MPT_DUMP_DIR, "", "Directory; every rewrite writes the graph before and after "
     "(.pb and .pbtxt), the effective op lists and the report (JSON) there."),
)

_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_>]*$")


def _parse_op_names(variable, value):
    names = [part.strip() for part in value.split(",") if part.strip()]
    for name in names:
        if not _OP_NAME.match(name):
            raise ValueError(
                f"{variable} must be a comma-separated list of op type names such as "
                f"'MatMul,Tanh'. Received: {variable}={value!r} (bad entry {name!r})")
    return frozenset(names)


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything tf_mpt reads from the environment, parsed once.

    Attributes:
        list_add: tuple of (list name, frozenset of op names) from TF_MPT_*LIST_ADD.
        list_remove: tuple of (list name, frozenset of op names) from TF_MPT_*LIST_REMOVE.
        dump_dir: directory for TF_MPT_DUMP_DIR dumps, or None.
    """
    list_add: tuple = ()
    list_remove: tuple = ()
    dump_dir: str = None

    @classmethod
    def from_env(cls, environ):
        """Parses a mapping of environment variables (e.g. os.environ or a dict)."""
        add, remove = [], []
        for list_name in _lists.LIST_NAMES:
            for suffix, target in (("ADD", add), ("REMOVE", remove)):
                variable = f"TF_MPT_{list_name.upper()}LIST_{suffix}"
                value = environ.get(variable, "")
                ops = _parse_op_names(variable, value)
                if ops:
                    target.append((list_name, ops))
        dump_dir = environ.get(TF_MPT_DUMP_DIR, "").strip() or None
        return cls(list_add=tuple(add), list_remove=tuple(remove), dump_dir=dump_dir)

    def lists_for(self, dtype):
        """Returns the default lists for `dtype` with this config's ADD/REMOVE edits applied."""
        base = _lists.default_lists(dtype)
        if not self.list_add and not self.list_remove:
            return base
        return base.edited(add=dict(self.list_add), remove=dict(self.list_remove))


def env_var_table_markdown():
    """The README's env-var table, generated from ENV_VARS (a test keeps README in step)."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {default or '(unset)'} | {meaning} |"
             for name, default, meaning in ENV_VARS]
    return "\n".join(rows)
