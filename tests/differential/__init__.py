"""Differential tests: the same small program run in float32 and under TF_MPT_ENABLE=1.

programs.py draws the programs (hypothesis strategies over TF1 and TF2 components and renders
them as Python source), harness.py runs each twice in subprocesses and judges whether the
mixed-precision run is worse, test_differential.py runs a fast profile by default and a
thorough one under `-m slow`. `python -m tests.differential.harness --profile thorough`
runs the thorough profile from the command line.
"""
