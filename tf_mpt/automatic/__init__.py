"""The automatic path: what TF_MPT_ENABLE=1 and `python -m tf_mpt` switch on.

    switch.py       enable() / disable(): installs and removes every patch below
    state.py        the process-wide state: Settings in force, bypass, patch helpers
    sessions.py     TF1 Sessions: the in-Session rewrite, or a rewritten shadow copy
    native/         the Grappler optimizer TF1 Sessions rewrite with (build, cache, callback)
    keras.py        tf.function -> tf_mpt.function, Keras / tf_keras dtype policies, import hook
    gradients.py    tf.gradients and GradientTape.gradient start from the loss scale
    optimizers.py   which optimizer's loss scale applies them (TF1, Keras, tf_keras, distributed)
"""
