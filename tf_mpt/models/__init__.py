"""Saved models `tf-mpt convert` and `tf-mpt inspect` work on.

    model_io.py               reading, checking and writing frozen graphs and SavedModels
    sources.py                the model classes (frozen graph, SavedModel): convert, run, write
    validation.py             sample inputs, errors against float32, the --validate table
    auto_deny.py              --auto-deny: the converted nodes to keep float32, by bisection
    saved_model_variables.py  `--variables half`: a SavedModel's variables stored in half
    inspection.py             what `tf-mpt inspect` shows
    progress.py               a progress bar on stderr
"""
