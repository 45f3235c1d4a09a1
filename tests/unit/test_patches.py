"""tf_mpt/_process/patches.py: every process-wide patch in one registry that disable() empties."""

import os
import subprocess
import sys

from tf_mpt._process import patches as _patches
from support.helpers import child_env


class _Owner:
    def method(self):
        return "original"


def test_replace_record_and_undo_restore_everything_newest_first():
    original = _Owner.method
    restored = []
    assert _patches.replace(_Owner, "method", lambda self: "patched") is original
    _patches.record("<a setting>", lambda: restored.append("setting"))
    assert _Owner().method() == "patched"
    assert _patches.is_applied(_Owner, "method") and _patches.is_applied(None, "<a setting>")
    assert _patches.originals(_Owner) == {"method": original}
    _patches.undo(_Owner, "method")
    assert _Owner.method is original and not _patches.is_applied(_Owner, "method")
    assert _patches.is_applied(None, "<a setting>")  # undo() touched one patch only
    _patches.undo_all()
    assert restored == ["setting"] and not _patches.is_applied(None, "<a setting>")


def test_disable_removes_the_start_up_import_hook():
    # a fresh process: the hook waits for `import tensorflow`, which has not happened
    code = ("import sys; from tf_mpt._process import startup as _startup, patches as _patches\n"
            "hooks = lambda: [m for m in sys.meta_path\n"
            "                 if type(m).__name__ == 'AfterImport']\n"
            "assert _startup.install_from_env({'TF_MPT_ENABLE': '1'}, at_startup=False)\n"
            "assert len(hooks()) == 1 and 'tensorflow' not in sys.modules\n"
            "_patches.undo_all()  # what tf_mpt.disable() runs\n"
            "assert hooks() == [] and 'tensorflow' not in sys.modules\n"
            "print('hook removed')\n")
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "hook removed"


def test_the_import_hook_runs_before_a_watched_import_starts_and_after_it_ends(tmp_path,
                                                                               monkeypatch):
    """What starts the dispatch check's child as the script starts `import tensorflow`
    (before), and enables tf_mpt once it is done (after): once each, in that order."""
    from tf_mpt._process import import_hooks  # pylint: disable=import-outside-toplevel
    (tmp_path / "watched_module_for_the_hook.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    name = "watched_module_for_the_hook"
    finder = import_hooks.AfterImport(
        [name], lambda n: seen.append(("after", n, n in sys.modules)),
        before=lambda n: seen.append(("before", n, n in sys.modules))).install()
    try:
        __import__(name)
        __import__(name)
    finally:
        finder.remove()
        sys.modules.pop(name, None)
    assert seen == [("before", name, False), ("after", name, True)]
