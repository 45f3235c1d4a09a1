"""Checkpoints written by a float32 run restore into a mixed-precision graph.

A fallback in tf.compat.v1.train.Saver.restore: a checkpoint without tf_mpt's loss-scale
variables (written by a float32 run) restores into a mixed-precision graph, the loss scale
starting from its initial value. Installed the first time a DynamicLossScale creates graph
variables; `tf_mpt.disable()` removes it (tf_mpt/_process/patches.py), and the next
DynamicLossScale that creates graph variables installs it again.
"""

import functools
import logging
import re

import tensorflow as tf

from tf_mpt._process import patches as _patches

_log = logging.getLogger(__name__)

_LOSS_SCALE_VARIABLE = re.compile(r"^tf_mpt(_\d+)?/(current_loss_scale|good_steps|skipped_steps)$")


def install_saver_restore_fallback():
    """Makes Saver.restore tolerate checkpoints lacking only tf_mpt loss-scale variables."""
    saver_class = tf.compat.v1.train.Saver
    if _patches.is_applied(saver_class, "restore"):
        return
    original = saver_class.restore

    @functools.wraps(original)
    def restore(self, sess, save_path):
        try:
            return original(self, sess, save_path)
        except tf.errors.NotFoundError:
            if not _restore_without_loss_scale_state(self, sess, save_path):
                raise
            return None

    _patches.replace(saver_class, "restore", restore)


def _restore_without_loss_scale_state(saver, sess, save_path):
    """Restores what the checkpoint has; initialises missing loss-scale variables.

    Returns False (the caller re-raises) if anything other than loss-scale state is missing.
    """
    if save_path is None:
        return False
    var_list = saver._var_list  # pylint: disable=protected-access
    if isinstance(var_list, dict):
        names_to_vars = dict(var_list)
    else:
        names_to_vars = {getattr(v, "op", None) and v.op.name: v for v in var_list or ()}
    if None in names_to_vars or not names_to_vars:
        return False
    try:
        reader = tf.train.load_checkpoint(save_path)
    except Exception:  # pylint: disable=broad-except
        return False
    in_checkpoint = reader.get_variable_to_shape_map()
    missing = [name for name in names_to_vars if name not in in_checkpoint]
    if not missing or not all(_LOSS_SCALE_VARIABLE.match(name) for name in missing):
        return False
    for name, variable in names_to_vars.items():
        if not isinstance(variable, tf.Variable):
            return False
        if name in in_checkpoint:
            # What Variable.load does: feed the value into the initializer (no new ops, so
            # this also works on a finalized graph).
            initializer = variable.initializer
            sess.run(initializer, {initializer.inputs[1]: reader.get_tensor(name)})
        else:
            sess.run(variable.initializer)
    _log.info("Checkpoint %s has no tf_mpt loss-scale state (%s); restored the rest, the loss "
              "scale starts from its initial value.", save_path, ", ".join(sorted(missing)))
    return True
