"""Every process-wide patch tf_mpt makes, recorded in one place that `tf_mpt.disable()` undoes.

A patch either replaces an attribute of a TensorFlow class or module (`replace`: Session
methods, Optimizer methods, tf.function, Saver.restore) or changes a setting by other means
(`record`: the Keras dtype policy) with a function that restores it. `undo_all()` restores
every one, newest first; `undo(owner, attribute)` one. No TensorFlow import.
"""

from tf_mpt._process.state import STATE


def replace(owner, attribute, new):
    """Sets owner.attribute to `new`, remembering the original; returns the original."""
    original = getattr(owner, attribute)
    setattr(owner, attribute, new)
    STATE.patches.append((owner, attribute, original))
    return original


def record(label, restore):
    """Records a change made by other means; `restore()` undoes it."""
    STATE.patches.append((None, label, restore))


def is_applied(owner, attribute):
    """True if `owner.attribute` (or, with owner None, the label) is patched now."""
    return any(o is owner and a == attribute for o, a, _ in STATE.patches)


def originals(owner):
    """{attribute: original} of the patches applied to `owner`."""
    return {a: original for o, a, original in STATE.patches if o is owner}


def undo(owner, attribute):
    """Undoes the patches of one attribute (or label), newest first."""
    for index in range(len(STATE.patches) - 1, -1, -1):
        if STATE.patches[index][0] is owner and STATE.patches[index][1] == attribute:
            _restore(*STATE.patches.pop(index))


def undo_all():
    """Undoes every patch, newest first."""
    while STATE.patches:
        _restore(*STATE.patches.pop())


def _restore(owner, attribute, original):
    if owner is None:
        original()
    else:
        setattr(owner, attribute, original)
