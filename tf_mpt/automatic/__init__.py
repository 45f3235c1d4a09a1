"""The automatic path: what TF_MPT_ENABLE=1 and `python -m tf_mpt` switch on.

    state.py            enable / disable / is_enabled and every process-wide patch
    session_rewrite.py  TF1 Sessions rewrite their graph in their own Grappler pass
    native_library.py   builds and loads that Grappler optimizer (native/session_rewrite.cc)
"""
