"""AutoGraph leaves tf_mpt's own code as written, as it leaves TensorFlow's and Keras's.

A user's tf.function that calls into tf_mpt (a nested `tf_mpt.function`, a patched
`tape.gradient` or optimizer method, a LossScaleOptimizer) would otherwise have AutoGraph
transpile every tf_mpt function on that call path: the whole rewrite, ~200 functions, ~9 s
of a TF1 script that calls one tf.function from another, and tf_mpt's Python `if`/`for`
turned into graph control flow wherever a tensor meets them. TensorFlow keeps the libraries
AutoGraph must not convert (tensorflow, keras, tf_keras, numpy, ...) in one tuple of rules;
tf_mpt adds itself there once per process, when its rewrite or training package is first
imported. What tf_mpt calls back is still converted as without tf_mpt: tf.function converts
the Python function it traces, whoever calls it.
"""

PACKAGE = "tf_mpt"


def leave_tf_mpt_unconverted():
    """Adds AutoGraph's DoNotConvert rule for tf_mpt (idempotent); True if it is in force.
    Where a TensorFlow keeps its rules elsewhere, nothing changes (AutoGraph then converts
    tf_mpt's code as before: slower, and still correct for the graphs tf_mpt builds)."""
    try:
        from tensorflow.python.autograph.core import config  # pylint: disable=g-import-not-at-top
        rules = tuple(config.CONVERSION_RULES)
        if not any(isinstance(rule, config.DoNotConvert) and rule.matches(PACKAGE)
                   for rule in rules):
            config.CONVERSION_RULES = (config.DoNotConvert(PACKAGE),) + rules
    except (ImportError, AttributeError, TypeError):
        return False
    return True
