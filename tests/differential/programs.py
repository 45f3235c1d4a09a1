"""Program generators for the differential harness.

A *spec* (`ProgramSpec`) is a combination of components that hypothesis draws (`tf1_specs()`,
`tf2_specs()`, `all_specs()`); `spec.source()` renders it as the source text of a small,
deterministic (seeded) Python program that trains a tiny model for a few steps and prints one
JSON line at the end: {"names": [...], "values": [...floats...]} (losses, eval losses,
predictions). The program never mentions tf_mpt: harness.py runs it once in float32 and once
under TF_MPT_ENABLE=1 and compares.

TF1 programs (kind "tf1"), one graph and one Session:
    base       "dense" (get_variable + matmul), "lstm" / "gru" (tf.compat.v1.nn.dynamic_rnn
               with BasicLSTMCell / GRUCell: TensorArrays in a while loop; these cells live in
               tf_keras, so such programs need TF_USE_LEGACY_KERAS=1)
    blocks     0-3 of "dense", "while_loop" (tf.compat.v1.while_loop), "function" (a
               tf.function called inside the graph), "nested_function" (a tf.function calling
               a tf.function), "captured_function" (a tf.function reading a variable it closes
               over instead of taking it as an argument)
    optimizer  "sgd" / "momentum" / "adam" (tf.compat.v1.train)
    apply      "minimize", "gradients" (tf.gradients + apply_gradients, the updates after
               every gradient: see _tf1_source), "compute_gradients"
    session    a subset of "callable" (train through sess.make_callable), "growth" (a new
               op, with a MatMul, built after the first run and then fetched),
               "interleaved_eval" (an eval fetch set between train steps); every program
               ends with an eval fetch set (loss on test data) and a predict fetch set
               (no labels fed), so every graph runs at least three fetch sets
    v1         True: tf.compat.v1.disable_v2_behavior() (v1 control flow: Enter/Exit/
               Switch/Merge, ref variables), False: TF2 behaviour in a tf.Graph (functional
               While, resource variables)
TF2 programs (kind "tf2"):
    "loop"     a GradientTape custom loop, eager, in a tf.function or in one XLA compiles
               ("mode": eager, function, jit: jit_compile=True, Keras 3's default on a
               machine with a GPU; compile(jit_compile=True) for fit), on raw
               tf.Variables or a Keras Sequential ("model"), with "extras": "none_grad" (a
               variable not touching the loss: its gradient is None; "none_filter" filters it
               out before apply_gradients, else the None is passed to the Keras optimizer,
               which skips it with a warning), "gather" (tf.gather of an embedding table:
               IndexedSlices gradients)
    "gan"      generator and discriminator (raw variables or Keras models), two Keras
               optimizers, alternating tapes; "none_grad" adds a generator variable in no loss
    "fit"      Keras 3 model.compile + model.fit for 2-3 epochs (steps > 3: 3), then
               model.evaluate and model.predict; mode "eager" compiles with run_eagerly=True,
               extra "gather" puts an Embedding first

Sizes are tiny (batch 8-16, widths <= 8, <= 5 steps) so a program takes well under 5 s of
TensorFlow time. Learning rates are small enough that float16/bfloat16 rounding stays within
harness.TOLERANCES of the float32 trajectory after the few steps taken; inputs are uniform in
[-1, 1] and every hidden activation is a tanh, so nothing approaches float16's range.

KNOWN_DIFFERENCES lists components whose programs differ today because of a tf_mpt bug
(see its entries); the tests count such a program as "known" instead of failing, so the
default run stays green and the issue stays listed.
"""

import dataclasses
import textwrap

from hypothesis import strategies as st

TF1_BASES = ("dense", "lstm", "gru")
TF1_BLOCKS = ("dense", "while_loop", "function", "nested_function", "captured_function")
TF1_OPTIMIZERS = ("sgd", "momentum", "adam")
TF1_APPLY = ("minimize", "gradients", "compute_gradients")
TF1_SESSION = ("callable", "growth", "interleaved_eval")
TF2_KINDS = ("loop", "gan", "fit")
TF2_OPTIMIZERS = ("sgd", "momentum", "adam")
TF2_EXTRAS = ("none_grad", "none_filter", "gather")
LOSSES = ("mse", "xent")
MAX_STEPS = 5

# Components (as spec.tags(): "kind:tf1", "block:function", "v1:True", ...) whose programs
# differ because of a tf_mpt bug. An entry matches a spec when all its `tags` are in
# spec.tags() and the dtype is in its `dtypes`. Keep the reason precise: it is the bug report.
KNOWN_DIFFERENCES = [
    # Empty since TF_MPT_KERAS=rewrite became the default: the one entry, a custom loop's
    # `model(x) - y` failing under the mixed Keras policy (the model's output was half), was
    # fixed by leaving Keras in float32 and rewriting the traced graph instead.
]


def known_difference(spec, dtype):
    """The KNOWN_DIFFERENCES entry `spec` run in `dtype` matches, or None."""
    tags = spec.tags()
    for entry in KNOWN_DIFFERENCES:
        if dtype in entry["dtypes"] and all(tag in tags for tag in entry["tags"]):
            return entry
    return None


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
    kind: str                 # "tf1" or "tf2"
    seed: int
    steps: int
    loss: str                 # "mse" or "xent"
    optimizer: str
    # tf1
    base: str = "dense"
    blocks: tuple = ()
    apply: str = "minimize"
    session: tuple = ()
    v1: bool = True
    # tf2
    tf2_kind: str = "loop"
    mode: str = "function"    # "eager", "function" or "jit" (XLA compiles the step)
    model: str = "variables"  # "variables" or "keras"
    extras: tuple = ()
    # batch 64 and 512-wide hidden layers instead of 16 and 8 (never drawn: the programs the
    # cost model weighs as faster in bfloat16, WIDE_SPECS)
    wide: bool = False

    @property
    def needs_legacy_keras(self):
        """BasicLSTMCell / GRUCell are tf_keras classes: TF_USE_LEGACY_KERAS=1."""
        return self.kind == "tf1" and self.base in ("lstm", "gru")

    @property
    def eager(self):
        """A TF2 program that runs eagerly (mode "eager"): tf_mpt rewrites graphs, so its
        mixed run executes no half op, by design."""
        return self.kind == "tf2" and self.mode == "eager"

    @property
    def target(self):
        """The target of its mixed run: `rules` for the drawn programs, whose 8-wide layers
        the suite's table keeps float32 in places (a TF1 program of three dense blocks: no
        half op) and a Keras fit at batch 8 at any width (512-wide Dense layers: 0 of 31
        converted), so that every graph program compares half compute with float32; the
        suite's table (None: the caller's TF_MPT_OP_COSTS) for WIDE_SPECS, whose products the
        cost model weighs and converts."""
        return None if self.wide else "rules"

    def tags(self):
        tags = {f"kind:{self.kind}", f"loss:{self.loss}", f"optimizer:{self.optimizer}"}
        if self.wide:
            tags.add("wide:True")
        if self.kind == "tf1":
            tags |= {f"base:{self.base}", f"apply:{self.apply}", f"v1:{self.v1}"}
            tags |= {f"block:{b}" for b in self.blocks} | {f"session:{s}" for s in self.session}
        else:
            tags |= {f"tf2:{self.tf2_kind}", f"mode:{self.mode}", f"model:{self.model}"}
            tags |= {f"extra:{e}" for e in self.extras}
        return tags

    def describe(self):
        if self.kind == "tf1":
            return (f"tf1 base={self.base} blocks={list(self.blocks)} opt={self.optimizer}/"
                    f"{self.apply} session={list(self.session)} v1={self.v1} "
                    f"loss={self.loss} steps={self.steps} seed={self.seed}"
                    + (" wide" if self.wide else ""))
        return (f"tf2 {self.tf2_kind} mode={self.mode} model={self.model} "
                f"extras={list(self.extras)} opt={self.optimizer} loss={self.loss} "
                f"steps={self.steps} seed={self.seed}")

    def source(self):
        if self.kind == "tf1":
            return _tf1_source(self)
        return {"loop": _tf2_loop_source, "gan": _tf2_gan_source,
                "fit": _keras_fit_source}[self.tf2_kind](self)


# TF1 programs of wide layers ([64 x 512] x [512 x 512] products in their dense blocks): under
# the suite's table (Zen 4) the cost model weighs them as faster in bfloat16 and converts
# them, so their pairs compare half compute the cost model chose with float32 (the drawn
# programs' 8-wide layers are half where the cost model leaves the rules' colours).
WIDE_SPECS = (
    ProgramSpec(kind="tf1", seed=11, steps=3, loss="xent", optimizer="sgd", base="dense",
                blocks=("dense",), apply="gradients", session=("growth",), v1=True,
                wide=True),
    ProgramSpec(kind="tf1", seed=7, steps=3, loss="mse", optimizer="momentum", base="dense",
                blocks=("dense", "dense"), apply="minimize", session=("interleaved_eval",),
                v1=False, wide=True),
)


# ---------------------------------------------------------------------------------------------
# strategies

def tf1_specs():
    return st.builds(
        ProgramSpec,
        kind=st.just("tf1"),
        seed=st.integers(0, 2**16),
        steps=st.integers(2, MAX_STEPS),
        loss=st.sampled_from(LOSSES),
        optimizer=st.sampled_from(TF1_OPTIMIZERS),
        base=st.sampled_from(TF1_BASES),
        blocks=st.lists(st.sampled_from(TF1_BLOCKS), max_size=3).map(tuple),
        apply=st.sampled_from(TF1_APPLY),
        session=st.lists(st.sampled_from(TF1_SESSION), unique=True).map(
            lambda s: tuple(sorted(s))),
        v1=st.booleans(),
    )


def tf2_specs():
    return st.builds(
        ProgramSpec,
        kind=st.just("tf2"),
        seed=st.integers(0, 2**16),
        steps=st.integers(2, MAX_STEPS),
        loss=st.sampled_from(LOSSES),
        optimizer=st.sampled_from(TF2_OPTIMIZERS),
        tf2_kind=st.sampled_from(TF2_KINDS),
        mode=st.sampled_from(("eager", "function", "jit")),
        model=st.sampled_from(("variables", "keras")),
        extras=st.lists(st.sampled_from(TF2_EXTRAS), unique=True).map(
            lambda s: tuple(sorted(s))),
    )


def all_specs():
    return st.one_of(tf1_specs(), tf2_specs())


# ---------------------------------------------------------------------------------------------
# rendering

_PRELUDE = '''\
import json

import numpy as np
import tensorflow as tf

SEED = {seed}
rng = np.random.RandomState(SEED)
tf.random.set_seed(SEED)
names, values = [], []


def record(name, array):
    for i, v in enumerate(np.asarray(array, dtype=np.float64).reshape(-1).tolist()):
        names.append(f"{{name}}[{{i}}]" if np.ndim(array) else name)
        values.append(v)


def glorot(shape):
    limit = np.sqrt(6.0 / (shape[0] + shape[-1]))
    return rng.uniform(-limit, limit, size=shape).astype(np.float32)


'''

_EPILOGUE = '''
print(json.dumps({"names": names, "values": values}))
'''

_TF1_OPTIMIZERS = {
    "sgd": "tf1.train.GradientDescentOptimizer(0.1)",
    "momentum": "tf1.train.MomentumOptimizer(0.05, 0.9)",
    "adam": "tf1.train.AdamOptimizer(0.01)",
}
_KERAS_OPTIMIZERS = {
    "sgd": "keras.optimizers.SGD(0.1)",
    "momentum": "keras.optimizers.SGD(0.05, momentum=0.9)",
    "adam": "keras.optimizers.Adam(0.01)",
}


def _data(spec, sequence=False):
    x_shape = "(B, T, F)" if sequence else "(B, F)"
    lines = [
        "B, T, F, H, C, V = 64, 4, 6, 512, 3, 10" if spec.wide else
        "B, T, F, H, C, V = 16, 4, 6, 8, 3, 10",
        f"X = rng.uniform(-1, 1, size={x_shape}).astype(np.float32)",
        f"X_TEST = rng.uniform(-1, 1, size={x_shape}).astype(np.float32)",
        "W_TRUE = rng.randn(X[0].size, C).astype(np.float32) / np.sqrt(X[0].size)",
    ]
    if spec.loss == "xent":
        lines += ["Y = np.argmax(X.reshape(B, -1) @ W_TRUE, axis=1).astype(np.int32)",
                  "Y_TEST = np.argmax(X_TEST.reshape(B, -1) @ W_TRUE, axis=1).astype(np.int32)"]
    else:
        lines += ["Y = np.tanh(X.reshape(B, -1) @ W_TRUE).astype(np.float32)",
                  "Y_TEST = np.tanh(X_TEST.reshape(B, -1) @ W_TRUE).astype(np.float32)"]
    return "\n".join(lines) + "\n"


def _indent(text, level):
    return textwrap.indent(textwrap.dedent(text), "    " * level)


def _tf1_source(spec):
    sequence = spec.base in ("lstm", "gru")
    out = [_PRELUDE.format(seed=spec.seed)]
    out.append("tf1 = tf.compat.v1\n")
    if spec.v1:
        out.append("tf1.disable_v2_behavior()\n")
    out.append(_data(spec, sequence))
    out.append("\ngraph = tf.Graph()\nwith graph.as_default():\n")
    body = []
    x_shape = "[None, T, F]" if sequence else "[None, F]"
    body.append(f'x = tf1.placeholder(tf.float32, {x_shape}, name="x")')
    if spec.loss == "xent":
        body.append('y = tf1.placeholder(tf.int32, [None], name="y")')
    else:
        body.append('y = tf1.placeholder(tf.float32, [None, C], name="y")')
    if spec.base == "dense":
        body += ['w0 = tf1.get_variable("w0", initializer=glorot((F, H)))',
                 'b0 = tf1.get_variable("b0", initializer=np.zeros(H, np.float32))',
                 "h = tf.tanh(tf.matmul(x, w0) + b0)"]
    else:
        cell = "BasicLSTMCell" if spec.base == "lstm" else "GRUCell"
        body += [
            'with tf1.variable_scope("rnn", initializer=tf1.glorot_uniform_initializer(seed=SEED)):',
            f"    cell = tf1.nn.rnn_cell.{cell}(H)",
            "    outputs, _ = tf1.nn.dynamic_rnn(cell, x, dtype=tf.float32)",
            "h = outputs[:, -1, :]",
        ]
    for i, block in enumerate(spec.blocks):
        body.append(f"# block {i}: {block}")
        if block == "dense":
            body += [f'w{i + 1} = tf1.get_variable("w{i + 1}", initializer=glorot((H, H)))',
                     f'b{i + 1} = tf1.get_variable("b{i + 1}", initializer=np.zeros(H, np.float32))',
                     f"h = tf.tanh(tf.matmul(h, w{i + 1}) + b{i + 1})"]
        elif block == "while_loop":
            body += [f'w{i + 1} = tf1.get_variable("w{i + 1}", initializer=0.5 * glorot((H, H)))',
                     "_, h = tf1.while_loop(lambda k, h: k < 3,",
                     f"                      lambda k, h: (k + 1, tf.tanh(tf.matmul(h, w{i + 1}) + h)),",
                     "                      [tf.constant(0), h])"]
        elif block == "function":
            body += [f'w{i + 1} = tf1.get_variable("w{i + 1}", initializer=glorot((H, H)))',
                     "",
                     "@tf.function",
                     f"def block{i}(h, w):",
                     "    return tf.tanh(tf.matmul(h, w))",
                     "",
                     f"h = block{i}(h, w{i + 1})"]
        elif block == "nested_function":
            body += [f'w{i + 1} = tf1.get_variable("w{i + 1}", initializer=glorot((H, H)))',
                     "",
                     "@tf.function",
                     f"def inner{i}(h, w):",
                     "    return tf.tanh(tf.matmul(h, w))",
                     "",
                     "@tf.function",
                     f"def outer{i}(h, w):",
                     f"    return 0.5 * inner{i}(h, w) + 0.5 * h",
                     "",
                     f"h = outer{i}(h, w{i + 1})"]
        elif block == "captured_function":
            body += [f'w{i + 1} = tf1.get_variable("w{i + 1}", initializer=glorot((H, H)))',
                     "",
                     "@tf.function",
                     f"def captured{i}(h):",
                     f"    return tf.tanh(tf.matmul(h, w{i + 1}))",
                     "",
                     f"h = captured{i}(h)"]
    body += ['w_out = tf1.get_variable("w_out", initializer=glorot((H, C)))',
             'b_out = tf1.get_variable("b_out", initializer=np.zeros(C, np.float32))',
             'pred = tf.add(tf.matmul(h, w_out), b_out, name="pred")']
    if spec.loss == "xent":
        body.append("loss = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits("
                    "labels=y, logits=pred))")
    else:
        body.append("loss = tf.reduce_mean(tf.square(pred - y))")
    body.append(f"opt = {_TF1_OPTIMIZERS[spec.optimizer]}")
    if spec.apply == "minimize":
        body.append("train = opt.minimize(loss)")
    elif spec.apply == "gradients":
        body += ["params = tf1.trainable_variables()",
                 "grads = tf.gradients(loss, params)",
                 "# every gradient before any update: with ref variables (v1) an update may",
                 "# otherwise run before a backward MatMul reads the variable, and the float32",
                 "# run itself is racy (mixed runs read a Cast snapshot: they differ from it)",
                 "with tf.control_dependencies(grads):",
                 "    train = opt.apply_gradients(list(zip(grads, params)))"]
    else:
        body += ["train = opt.apply_gradients(opt.compute_gradients(loss))"]
    body.append("init = tf1.global_variables_initializer()")
    body.append("")
    body.append("with tf1.Session(graph=graph) as sess:")
    sess = ["sess.run(init)"]
    if "callable" in spec.session:
        sess += ["step = sess.make_callable([loss, train], feed_list=[x, y])",
                 "run_step = lambda: step(X, Y)"]
    else:
        sess += ["run_step = lambda: sess.run([loss, train], {x: X, y: Y})"]
    sess += [f"for i in range({spec.steps}):",
             "    value, _ = run_step()",
             '    record(f"loss{i}", value)']
    if "interleaved_eval" in spec.session:
        sess += ['    record(f"eval{i}", sess.run(loss, {x: X_TEST, y: Y_TEST}))']
    if "growth" in spec.session:
        sess += ["    if i == 0:",
                 "        # the graph grows after its first run: a new MatMul over trained nodes",
                 '        grown = tf.reduce_mean(tf.tanh(tf.matmul(h, w_out)), name="grown")',
                 '        record("grown", sess.run(grown, {x: X_TEST}))']
    sess += ['record("eval_loss", sess.run(loss, {x: X_TEST, y: Y_TEST}))',
             'record("pred", sess.run(pred, {x: X_TEST[:4]}))']
    body += ["    " + line if line else "" for line in sess]
    out.append("\n".join("    " + line if line else "" for line in body) + "\n")
    out.append(_EPILOGUE)
    return "".join(out)


def _tf2_loss_expr(spec, pred, y):
    if spec.loss == "xent":
        return (f"tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits("
                f"labels={y}, logits={pred}))")
    return f"tf.reduce_mean(tf.square({pred} - {y}))"


def _tf2_loop_source(spec):
    gather = "gather" in spec.extras
    none_grad = "none_grad" in spec.extras or "none_filter" in spec.extras
    out = [_PRELUDE.format(seed=spec.seed), "import keras\n\n", _data(spec)]
    out.append("IDS = rng.randint(0, V, size=B).astype(np.int32)\n"
               "IDS_TEST = rng.randint(0, V, size=B).astype(np.int32)\n")
    body = []
    if spec.model == "keras":
        body += ["keras.utils.set_random_seed(SEED)",
                 "model = keras.Sequential([keras.Input((F,)),",
                 '                          keras.layers.Dense(H, activation="tanh"),',
                 "                          keras.layers.Dense(C)])",
                 "variables = list(model.trainable_variables)",
                 "forward_net = model"]
    else:
        body += ['w1 = tf.Variable(glorot((F, H)), name="w1")',
                 'b1 = tf.Variable(np.zeros(H, np.float32), name="b1")',
                 'w2 = tf.Variable(glorot((H, C)), name="w2")',
                 'b2 = tf.Variable(np.zeros(C, np.float32), name="b2")',
                 "variables = [w1, b1, w2, b2]",
                 "",
                 "def forward_net(x):",
                 "    return tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) + b2"]
    if gather:
        body += ['table = tf.Variable(0.3 * glorot((V, F)), name="table")',
                 "variables.append(table)"]
    if none_grad:
        body += ['unused = tf.Variable(glorot((F, H)), name="unused")  # not in the loss',
                 "variables.append(unused)"]
    body += [f"optimizer = {_KERAS_OPTIMIZERS[spec.optimizer]}",
             "",
             "",
             "def forward(x, ids):"]
    if gather:
        body.append("    x = x + tf.gather(table, ids)  # IndexedSlices gradient for table")
    body += ["    return forward_net(x)",
             "",
             "",
             "def train_step(x, y, ids):",
             "    with tf.GradientTape() as tape:",
             f"        loss = {_tf2_loss_expr(spec, 'forward(x, ids)', 'y')}",
             "    grads = tape.gradient(loss, variables)"]
    if "none_filter" in spec.extras:
        body.append("    optimizer.apply_gradients("
                    "[(g, v) for g, v in zip(grads, variables) if g is not None])")
    else:
        body.append("    optimizer.apply_gradients(zip(grads, variables))")
    body.append("    return loss")
    body.append("")
    body.append("")
    if spec.mode in ("function", "jit"):
        jit = ", jit_compile=True" if spec.mode == "jit" else ""
        body += [f"train_step = tf.function(train_step{jit})",
                 f"forward = tf.function(forward{jit})"]
    body += [f"for i in range({spec.steps}):",
             '    record(f"loss{i}", train_step(X, Y, IDS).numpy())',
             f'record("eval_loss", {_tf2_loss_expr(spec, "forward(X_TEST, IDS_TEST)", "Y_TEST")}.numpy())',
             'record("pred", forward(X_TEST[:4], IDS_TEST[:4]).numpy())']
    out.append("\n".join(body) + "\n")
    out.append(_EPILOGUE)
    return "".join(out)


def _tf2_gan_source(spec):
    # The discriminator's loss is a sigmoid cross entropy whatever spec.loss says; spec.loss
    # picks the generator's: "xent" the usual non-saturating one, "mse" a least-squares one.
    none_grad = "none_grad" in spec.extras or "none_filter" in spec.extras
    out = [_PRELUDE.format(seed=spec.seed), "import keras\n\n",
           "B, Z, F, H = 16, 4, 6, 8\n",
           "REAL = np.tanh(rng.randn(B, F)).astype(np.float32)\n",
           "NOISE = rng.uniform(-1, 1, size=(B, Z)).astype(np.float32)\n"]
    body = []
    if spec.model == "keras":
        body += ["keras.utils.set_random_seed(SEED)",
                 'generator = keras.Sequential([keras.Input((Z,)), keras.layers.Dense(H, activation="tanh"),',
                 '                              keras.layers.Dense(F, activation="tanh")])',
                 'discriminator = keras.Sequential([keras.Input((F,)), keras.layers.Dense(H, activation="tanh"),',
                 "                                  keras.layers.Dense(1)])",
                 "g_vars = list(generator.trainable_variables)",
                 "d_vars = list(discriminator.trainable_variables)"]
    else:
        body += ['g1 = tf.Variable(glorot((Z, H)), name="g1")',
                 'g2 = tf.Variable(glorot((H, F)), name="g2")',
                 'd1 = tf.Variable(glorot((F, H)), name="d1")',
                 'd2 = tf.Variable(glorot((H, 1)), name="d2")',
                 "g_vars, d_vars = [g1, g2], [d1, d2]",
                 "",
                 "def generator(z):",
                 "    return tf.tanh(tf.matmul(tf.tanh(tf.matmul(z, g1)), g2))",
                 "",
                 "def discriminator(x):",
                 "    return tf.matmul(tf.tanh(tf.matmul(x, d1)), d2)"]
    if none_grad:
        body += ['unused = tf.Variable(glorot((H, H)), name="unused")  # in no loss',
                 "g_vars.append(unused)"]
    opt = _KERAS_OPTIMIZERS[spec.optimizer]
    body += [f"g_opt = {opt}", f"d_opt = {opt}", "", "",
             "def xent(logits, label):",
             "    logits = tf.cast(logits, tf.float32)",
             "    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(",
             "        labels=tf.fill(tf.shape(logits), label), logits=logits))",
             "", "",
             "def train_step(real, noise):",
             "    with tf.GradientTape() as tape:",
             "        d_loss = xent(discriminator(real), 1.0) + xent(discriminator(generator(noise)), 0.0)",
             "    grads = tape.gradient(d_loss, d_vars)",
             "    d_opt.apply_gradients(zip(grads, d_vars))",
             "    with tf.GradientTape() as tape:"]
    if spec.loss == "xent":
        body.append("        g_loss = xent(discriminator(generator(noise)), 1.0)")
    else:
        body.append("        g_loss = tf.reduce_mean(tf.square(tf.cast(discriminator(generator(noise)), tf.float32) - 1.0))")
    body.append("    grads = tape.gradient(g_loss, g_vars)")
    if "none_filter" in spec.extras:
        body.append("    g_opt.apply_gradients([(g, v) for g, v in zip(grads, g_vars) if g is not None])")
    else:
        body.append("    g_opt.apply_gradients(zip(grads, g_vars))")
    body += ["    return d_loss, g_loss", "", ""]
    if spec.mode in ("function", "jit"):
        jit = ", jit_compile=True" if spec.mode == "jit" else ""
        body.append(f"train_step = tf.function(train_step{jit})")
    body += [f"for i in range({spec.steps}):",
             "    d_loss, g_loss = train_step(REAL, NOISE)",
             '    record(f"d_loss{i}", d_loss.numpy())',
             '    record(f"g_loss{i}", g_loss.numpy())',
             'record("fake", np.asarray(generator(NOISE[:2]), np.float32))',
             'record("score", np.asarray(discriminator(REAL[:4]), np.float32))']
    out.append("\n".join(body) + "\n")
    out.append(_EPILOGUE)
    return "".join(out)


def _keras_fit_source(spec):
    # spec.steps is the number of epochs minus 2 (2-3 epochs of 2 batches); spec.mode "eager"
    # compiles with run_eagerly=True; spec.extras: "gather" puts an Embedding in front.
    epochs = 2 + (spec.steps > 3)
    out = [_PRELUDE.format(seed=spec.seed), "import keras\n\n", _data(spec)]
    body = ["keras.utils.set_random_seed(SEED)"]
    if "gather" in spec.extras:
        body += ["IDS = rng.randint(0, V, size=(B, 2)).astype(np.int32)",
                 "IDS_TEST = rng.randint(0, V, size=(B, 2)).astype(np.int32)",
                 "model = keras.Sequential([keras.Input((2,), dtype='int32'),",
                 "                          keras.layers.Embedding(V, 4),",
                 "                          keras.layers.Flatten(),",
                 '                          keras.layers.Dense(H, activation="tanh"),',
                 "                          keras.layers.Dense(C)])",
                 "inputs, test_inputs = IDS, IDS_TEST"]
    else:
        body += ["model = keras.Sequential([keras.Input((F,)),",
                 '                          keras.layers.Dense(H, activation="tanh"),',
                 '                          keras.layers.Dense(H, activation="tanh"),',
                 "                          keras.layers.Dense(C)])",
                 "inputs, test_inputs = X, X_TEST"]
    loss = ('keras.losses.SparseCategoricalCrossentropy(from_logits=True)'
            if spec.loss == "xent" else '"mse"')
    eager = {"eager": ", run_eagerly=True", "jit": ", jit_compile=True"}.get(spec.mode, "")
    body += [f"model.compile(optimizer={_KERAS_OPTIMIZERS[spec.optimizer]}, loss={loss}{eager})",
             f"history = model.fit(inputs, Y, epochs={epochs}, batch_size=8, shuffle=False, verbose=0)",
             'record("loss", history.history["loss"])',
             'record("eval_loss", model.evaluate(test_inputs, Y_TEST, verbose=0))',
             'record("pred", np.asarray(model.predict(test_inputs[:4], verbose=0), np.float32))']
    out.append("\n".join(body) + "\n")
    out.append(_EPILOGUE)
    return "".join(out)
