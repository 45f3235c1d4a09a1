"""The process machinery, apart from what it serves (no TensorFlow import):

    state.py          the one process-wide state (STATE): settings, patches, caches, the
                      bypass of the automatic path
    patches.py        every process-wide patch in one registry, undone by tf_mpt.disable()
    import_hooks.py   run a function right after a module (tensorflow, keras) is imported
    startup.py        the start-up hook tf_mpt-startup.pth calls (TF_MPT_ENABLE=1)
    autograph.py      what AutoGraph must not convert of tf_mpt's
"""
