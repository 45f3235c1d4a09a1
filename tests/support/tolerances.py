"""Named tolerances: a half-precision run against float32 on the same inputs. Loose enough
for rounding of inputs and weights to the half type, tight enough to catch a wrong dtype
decision (a deny op in half, a dropped Cast)."""

import numpy as np

# float16 has a 10-bit mantissa (unit roundoff 4.9e-4), bfloat16 a 7-bit one (3.9e-3).
TOLERANCES = {
    "float16": dict(rtol=2e-2, atol=2e-2),
    "bfloat16": dict(rtol=6e-2, atol=6e-2),
}
# Loss after a few training steps, relative to float32.
LOSS_RTOL = {"float16": 1e-2, "bfloat16": 3e-2}

# After a few training steps rounding differences compound (gradients through batch norm in
# half precision, summed in Momentum accumulators): tensors are compared by their largest
# difference relative to the float32 tensor's largest magnitude.
TRAINED_SCALE_TOL = {"float16": 0.1, "bfloat16": 0.2}

# Final training loss, half vs float32, relative: a script's own model trained for a few
# epochs / a dozen steps (the TF2 patterns, Keras fit); bfloat16 rounds more.
FINAL_LOSS_RTOL = {"float16": 0.03, "bfloat16": 0.08}

HALF_DTYPES = ("float16", "bfloat16")


def assert_close_to_scale(actual, expected, dtype, what=""):
    """max|actual - expected| <= TRAINED_SCALE_TOL[dtype] * max|expected|."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = max(np.abs(expected).max(), 1e-6)
    error = np.abs(actual - expected).max()
    assert error <= TRAINED_SCALE_TOL[dtype] * scale, (
        f"{what}: max error {error:.3g} > {TRAINED_SCALE_TOL[dtype]} * scale {scale:.3g}")


def assert_close(actual, expected, dtype, **overrides):
    tol = dict(TOLERANCES[dtype], **overrides)
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               **tol)
