"""float32 master weights: a custom getter and a scope that installs it.

A trainable variable requested in float16 or bfloat16 is created in float32 under the same
name (so checkpoints interchange with a float32 model) and read through a Cast to the
requested dtype. Gradients reaching the variable are float32. Non-trainable and non-half
variables are created as requested.

Example:
    >>> with tf_mpt.mixed_precision_scope("float16"):
    ...     w = tf.compat.v1.get_variable("w", [784, 10], dtype=tf.float16)  # fp32 storage
    >>> w.dtype
    tf.float16
"""

import contextlib

import tensorflow as tf

from tf_mpt import _dtypes

tf1 = tf.compat.v1

_HALF = (tf.float16, tf.bfloat16)


def float32_storage_getter(getter, name, shape=None, dtype=None, *args, **kwargs):
    """Custom getter for tf.compat.v1.variable_scope(custom_getter=...).

    TensorFlow passes everything after `getter` as keywords; positional extras are forwarded.
    """
    requested = tf.as_dtype(dtype) if dtype is not None else None
    trainable = kwargs.get("trainable")
    if trainable is None:
        trainable = True
    if requested not in _HALF or not trainable:
        return getter(name, *args, shape=shape, dtype=dtype, **kwargs)
    variable = getter(name, *args, shape=shape, dtype=tf.float32, **kwargs)
    tag = _dtypes.parse(requested).tag
    return tf.cast(variable, requested, name=f"{variable.op.name}/CastTo{tag}")


@contextlib.contextmanager
def mixed_precision_scope(dtype="float16", name_or_scope=None):
    """A variable scope whose trainable half variables are stored in float32.

    Args:
        dtype: the half dtype the model computes in ('float16' or 'bfloat16'); checked, and
            available to the body as the scope's value.
        name_or_scope: variable scope to open (default: the current scope, reopened).

    Yields:
        the tf.DType of `dtype`.
    """
    half = tf.as_dtype(_dtypes.parse(dtype).name)
    scope = name_or_scope if name_or_scope is not None else tf1.get_variable_scope()
    # TensorFlow nests custom getters: a getter of an enclosing scope still runs (inside ours).
    with tf1.variable_scope(scope, custom_getter=float32_storage_getter,
                            auxiliary_name_scope=False):
        yield half
