"""The handwritten digits the examples train on: 1797 images of 8x8 pixels (values 0-16) and
their labels 0-9. They are the UCI "Optical Recognition of Handwritten Digits" test set
(E. Alpaydin, C. Kaynak, 1998; CC BY 4.0), the same arrays scikit-learn's `load_digits`
returns, stored beside this file (digits.npz) so that the examples need only TensorFlow and
NumPy.
"""

import os
import types

import numpy as np

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.npz")


def load_digits():
    """images [1797, 8, 8] and data [1797, 64] (float64, 0-16), target [1797] (int64)."""
    with np.load(PATH) as stored:
        images = stored["images"].astype(np.float64)
        target = stored["target"].astype(np.int64)
    return types.SimpleNamespace(images=images, data=images.reshape(len(images), -1),
                                 target=target)
