"""Saved models `tf-mpt convert` and `tf-mpt inspect` work on.

    model_io.py               reading, checking and writing frozen graphs and SavedModels
    convert.py                the model classes: convert, run, validate against float32
    saved_model_variables.py  `--variables half`: a SavedModel's variables stored in half
    inspection.py             what `tf-mpt inspect` shows
    progress.py               a progress bar on stderr
"""
