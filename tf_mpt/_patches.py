"""Every process-wide patch tf_mpt makes, recorded in one place that `tf_mpt.disable()` undoes.

A patch either replaces an attribute of a TensorFlow class or module (`replace`: Session
methods, Optimizer methods, tf.function, Saver.restore) or changes a setting by other means
(`record`: the Keras dtype policy) with a function that restores it. `undo_all()` restores
every one, newest first; `undo(owner, attribute)` one. No TensorFlow import.
"""

_applied = []  # (owner, attribute, original); owner None: a label and its restore function


def replace(owner, attribute, new):
    """Sets owner.attribute to `new`, remembering the original; returns the original."""
    original = getattr(owner, attribute)
    setattr(owner, attribute, new)
    _applied.append((owner, attribute, original))
    return original


def record(label, restore):
    """Records a change made by other means; `restore()` undoes it."""
    _applied.append((None, label, restore))


def is_applied(owner, attribute):
    """True if `owner.attribute` (or, with owner None, the label) is patched now."""
    return any(o is owner and a == attribute for o, a, _ in _applied)


def originals(owner):
    """{attribute: original} of the patches applied to `owner`."""
    return {a: original for o, a, original in _applied if o is owner}


def undo(owner, attribute):
    """Undoes the patches of one attribute (or label), newest first."""
    for index in range(len(_applied) - 1, -1, -1):
        if _applied[index][0] is owner and _applied[index][1] == attribute:
            _restore(*_applied.pop(index))


def undo_all():
    """Undoes every patch, newest first."""
    while _applied:
        _restore(*_applied.pop())


def _restore(owner, attribute, original):
    if owner is None:
        original()
    else:
        setattr(owner, attribute, original)
