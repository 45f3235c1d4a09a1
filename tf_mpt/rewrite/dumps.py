"""TF_MPT_DUMP_DIR: every rewrite's graphs before and after, the op lists and the report."""

import itertools
import logging
import os

from tf_mpt import config as _config

_log = logging.getLogger("tf_mpt.rewrite")
_dump_counter = itertools.count()


def dump(directory, before, after, lists, report):
    """Writes the graphs before/after, the effective lists and the report to `directory`."""
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    stem = os.path.join(directory, f"tf_mpt_{os.getpid()}_{next(_dump_counter):04d}")
    try:
        os.makedirs(directory, exist_ok=True)
        for tag, graph_def in (("before", before), ("after", after)):
            with open(f"{stem}_{tag}.pb", "wb") as f:
                f.write(graph_def.SerializeToString())
            with open(f"{stem}_{tag}.pbtxt", "w") as f:
                f.write(text_format.MessageToString(graph_def))
        with open(f"{stem}_lists.txt", "w") as f:
            f.write(str(lists) + "\n")
        with open(f"{stem}_report.json", "w") as f:
            f.write(report.to_json(indent=1))
        _log.info("tf_mpt dump written to %s_*", stem)
    except OSError as error:
        _log.warning("tf_mpt could not write the dump to %r (%s); set %s to a writable "
                     "directory.", directory, error, _config.TF_MPT_DUMP_DIR)
