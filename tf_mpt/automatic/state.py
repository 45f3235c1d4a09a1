"""The automatic path's process-wide state: the Settings in force (None while off), whether
'auto' left the process in float32, the thread-local bypass the patched methods honour while
tf_mpt itself calls TensorFlow, and the helpers that patch a method or function (recorded in
tf_mpt._patches, undone by disable()).
"""

import contextlib
import dataclasses
import functools
import logging
import threading

from tf_mpt import _patches

stays_float32 = False  # 'auto' found no fast half type (warned once)
enabled = None  # None, or the Settings in force
_local = threading.local()
_warned = set()  # keys of the warnings given once (forgotten by forget_warnings())
_log = logging.getLogger("tf_mpt")


def is_enabled():
    """True while the automatic path is on in this process."""
    return enabled is not None


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the automatic path resolved when it was enabled."""
    config: object  # the tf_mpt.Config it was enabled with
    dtype: str  # 'float16' | 'bfloat16'
    rewrite: bool  # graphs are rewritten (TF_MPT_GRAPH_REWRITE)
    loss_scaling: bool  # TF1 optimizers get loss scaling (TF_MPT_LOSS_SCALING)
    loss_scale: object  # 'dynamic' or a number (TF_MPT_LOSS_SCALE)
    session_rewrite: object = None  # 'grappler' | 'copy' (TF1 Sessions), None without rewrite


def enabled_settings():
    """The Settings of the automatic path, or None when it is off."""
    return enabled


def patch_function(module, name, replacement):
    """module.name(...) becomes replacement(original, ...) until disable()."""
    original = getattr(module, name)

    def function(*args, **kwargs):
        return replacement(original, *args, **kwargs)

    functools.update_wrapper(function, original)
    _patches.replace(module, name, function)


def patch(owner, name, replacement):
    """owner.name(self, ...) becomes replacement(original, self, ...) until disable()."""
    original = getattr(owner, name)

    def method(self, *args, **kwargs):
        return replacement(original, self, *args, **kwargs)

    functools.update_wrapper(method, original)
    _patches.replace(owner, name, method)


@contextlib.contextmanager
def bypass():
    previous = getattr(_local, "bypass", False)
    _local.bypass = True
    try:
        yield
    finally:
        _local.bypass = previous


def bypassing():
    return getattr(_local, "bypass", False)


def warn_once(key, message, *args):
    """Logs WARNING `message % args` the first time `key` is seen (until disable())."""
    if key in _warned:
        return
    _warned.add(key)
    _log.warning(message, *args)


def forget_warnings():
    _warned.clear()
