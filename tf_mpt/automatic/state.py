"""The automatic path's Settings, its view of the one process-wide state (tf_mpt._process.state:
the Settings in force, the bypass, warn_once), and the helpers that patch a method or function
(recorded in tf_mpt._process.patches, undone by disable()).
"""

import dataclasses
import functools

from tf_mpt._process import patches as _patches
from tf_mpt._process.state import (STATE, bypass, bypassing, current_fed_batch,  # noqa: F401
                            fed_batch, warn_once)  # (the one of each)

__all__ = ["Settings", "STATE", "is_enabled", "enabled_settings", "patch", "patch_function",
           "tf_api_modules", "bypass", "bypassing", "warn_once", "fed_batch",
           "current_fed_batch"]


def is_enabled():
    """True while the automatic path is on in this process."""
    return STATE.settings is not None


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the automatic path resolved when it was enabled."""
    config: object  # the tf_mpt.Config it was enabled with
    dtype: str  # 'float16' | 'bfloat16'
    rewrite: bool  # graphs are rewritten (TF_MPT_GRAPH_REWRITE)
    loss_scaling: bool  # TF1 optimizers get loss scaling (TF_MPT_LOSS_SCALING)
    loss_scale: object  # 'dynamic' or a number (TF_MPT_LOSS_SCALE)
    session_rewrite: object = None  # 'grappler' | 'copy' (TF1 Sessions), None without rewrite

    @property
    def keras_policy(self):
        """tf_mpt sets the mixed Keras / tf_keras dtype policy (TF_MPT_KERAS=policy)."""
        return self.rewrite and self.config.keras == "policy"

    @property
    def keras_rewrite(self):
        """tf_mpt rewrites the step functions Keras traces (TF_MPT_KERAS=rewrite)."""
        return self.rewrite and self.config.keras == "rewrite"


def enabled_settings():
    """The Settings of the automatic path, or None when it is off."""
    return STATE.settings


def tf_api_modules():
    """tf, tf.compat.v1 and tf.compat.v2, each once: a script reaches tf.function or
    tf.gradients through any of them (tf_keras: `import tensorflow.compat.v2 as tf`)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return list({id(m): m for m in (tf, tf.compat.v1, tf.compat.v2)}.values())


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
