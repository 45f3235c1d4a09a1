"""tf_mpt's Grappler optimizer "TfMpt": the TF1 Session path's native part.

    session_rewrite.cc  the optimizer: hands each graph a Session optimises to tf_mpt's rewrite
    library.py          builds it at first use, caches and loads it
    rewriter.py         the Session's ConfigProto that lists it, and the rewrite callback
"""
