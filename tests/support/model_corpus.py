"""Real model graphs for the corpus tests and benchmarks/corpus_compare.py.

Each builder returns a `Model`: a frozen float32 inference GraphDef (variables folded into
constants, as a deployed model is), its input and output tensor names and a sample batch.
Keras applications are built with weights=None at a small input size; their batch-norm
statistics are first calibrated on the sample batch (momentum 0, one forward pass in training
mode), else a random-weight deep net's activations grow or vanish layer by layer and the
float32-vs-half comparison measures noise.

    python -c "import model_corpus; print(model_corpus.build('mobilenet_v2').summary())"
"""

import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import convert_to_constants

BATCH = 4
SEED = 0


@dataclasses.dataclass
class Model:
    name: str
    graph_def: object
    inputs: dict  # tensor name -> sample array
    outputs: list  # tensor names

    @property
    def fetch_nodes(self):
        return [t.split(":")[0] for t in self.outputs]

    def summary(self):
        ops = {}
        for node in self.graph_def.node:
            ops[node.op] = ops.get(node.op, 0) + 1
        return f"{self.name}: {len(self.graph_def.node)} nodes, {ops.get('Conv2D', 0)} Conv2D"


def _calibrate_batch_norm(model, batch):
    """Moving statistics = the statistics of `batch`, for every BatchNormalization layer."""
    layers = [layer for layer in model._flatten_layers()  # pylint: disable=protected-access
              if layer.__class__.__name__ == "BatchNormalization"]
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.momentum = 0.0
    model(batch, training=True)
    for layer, momentum in zip(layers, momenta):
        layer.momentum = momentum


def _freeze(name, fn, batch):
    """Model of a tf.function of one float32 input, frozen."""
    spec = tf.TensorSpec(batch.shape, tf.float32, name="input")
    concrete = tf.function(fn).get_concrete_function(spec)
    frozen = convert_to_constants.convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    inputs = [t.name for t in frozen.inputs if t.dtype != tf.resource]
    outputs = [t.name for t in frozen.outputs]
    return Model(name, graph_def, {inputs[0]: batch}, outputs)


def _keras_application(name, constructor, size, **kwargs):
    def build():
        tf.keras.utils.set_random_seed(SEED)
        model = constructor(weights=None, input_shape=(size, size, 3), classes=10, **kwargs)
        batch = np.random.RandomState(SEED).uniform(0, 1, (BATCH, size, size, 3)).astype(
            np.float32)
        _calibrate_batch_norm(model, batch)
        return _freeze(name, lambda x: model(x, training=False), batch)
    return build


def _transformer_block():
    """Multi-head self-attention + layer norm + feed-forward (Keras layers), 32 tokens."""
    import keras  # pylint: disable=g-import-not-at-top
    tf.keras.utils.set_random_seed(SEED)
    tokens, width, heads = 32, 128, 4
    inputs = keras.Input((tokens, width))
    attention = keras.layers.MultiHeadAttention(heads, width // heads)(inputs, inputs)
    x = keras.layers.LayerNormalization()(inputs + attention)
    ffn = keras.layers.Dense(4 * width, activation="gelu")(x)
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(width)(ffn))
    logits = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(inputs, logits)
    batch = np.random.RandomState(SEED).standard_normal((BATCH, tokens, width)).astype(
        np.float32)
    return _freeze("transformer_block", lambda x: model(x, training=False), batch)


def _lstm():
    """Two stacked Keras LSTMs (a TF2 While loop with TensorLists) and a dense head."""
    import keras  # pylint: disable=g-import-not-at-top
    tf.keras.utils.set_random_seed(SEED)
    model = keras.Sequential([keras.Input((16, 32)), keras.layers.LSTM(64, return_sequences=True),
                              keras.layers.LSTM(64), keras.layers.Dense(10)])
    batch = np.random.RandomState(SEED).standard_normal((BATCH, 16, 32)).astype(np.float32)
    return _freeze("lstm", lambda x: model(x, training=False), batch)


_apps = tf.keras.applications
BUILDERS = {
    "mobilenet_v2": _keras_application("mobilenet_v2", _apps.MobileNetV2, 96, alpha=0.35),
    "transformer_block": _transformer_block,
    "lstm": _lstm,
    "resnet50": _keras_application("resnet50", _apps.ResNet50, 64),
    "efficientnet_b0": _keras_application("efficientnet_b0", _apps.EfficientNetB0, 64),
    "densenet121": _keras_application("densenet121", _apps.DenseNet121, 64),
    "inception_v3": _keras_application("inception_v3", _apps.InceptionV3, 75),
    "convnext_tiny": _keras_application("convnext_tiny", _apps.ConvNeXtTiny, 64),
}
# What the default test run covers (under its 3-minute budget); the rest is marked slow.
DEFAULT = ("mobilenet_v2", "transformer_block", "lstm")


def build(name):
    return BUILDERS[name]()
