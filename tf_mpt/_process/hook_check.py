"""Whether tf_mpt's start-up hook is installed: `tf_mpt-startup.pth` in a directory Python
reads .pth files from at start-up (site-packages, the user's site-packages). Without it
`TF_MPT_ENABLE=1 python script.py` runs nothing of tf_mpt: an editable install
(`pip install -e`) does not put it there. `tf-mpt run script.py` and
`python -m tf_mpt script.py` work without it.

No TensorFlow import; a few path checks.
"""

import os
import site
import sys

PTH = "tf_mpt-startup.pth"
_SWITCHES = ("TF_MPT_ENABLE", "TF_MPT_GRAPH_REWRITE", "TF_MPT_LOSS_SCALING")
_FALSE = ("", "0", "false", "no", "off")


def site_directories():
    """The directories Python reads .pth files from at start-up, in its order."""
    found = []
    try:
        found += list(site.getsitepackages())
    except AttributeError:  # (an old virtualenv's site module)
        pass
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(found) if d]


def hook_path():
    """The path of the installed start-up hook, or None."""
    for directory in site_directories():
        path = os.path.join(directory, PTH)
        if os.path.isfile(path):
            return path
    return None


def switched_on(environ=None):
    """The switch variables set to something other than off (as the hook's line tests
    them, not parsed)."""
    environ = os.environ if environ is None else environ
    return [name for name in _SWITCHES
            if environ.get(name, "").strip().lower() not in _FALSE]


def missing_hook_warning(environ=None):
    """The one WARNING where a switch is on and no hook is installed, else None."""
    switches = switched_on(environ)
    if not switches or hook_path() is not None or sys.flags.no_site:
        return None
    return (f"{switches[0]} is set, but tf_mpt's start-up hook ({PTH}) is "
            f"not installed in this Python's site-packages (an editable install, pip "
            f"install -e, has none): `{switches[0]}=1 python script.py` converts nothing. "
            f"Install with `pip install .` (not -e), or run the script with `tf-mpt run "
            f"script.py` (python -m tf_mpt script.py), which needs no hook.")
