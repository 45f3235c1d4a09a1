"""Faults around the automatic path: a script under TF_MPT_ENABLE=1 behaves as without tf_mpt.

Signals that arrive while tf_mpt rewrites a graph inside Session.run (the Grappler callback)
run their Python handlers when Session.run returns, as they would without tf_mpt: a SIGTERM
handler that saves a checkpoint does not deadlock, Ctrl-C raises KeyboardInterrupt in the
script, a handler's sys.exit exits. Each script sends the signal from inside the rewrite.
"""

import os
import subprocess
import sys
import textwrap

import pytest
from support.helpers import child_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TIMEOUT_S = 180

# A TF1 training graph; the signal is sent from inside tf_mpt's rewrite of the training step.
_PRELUDE = textwrap.dedent("""
    import os, signal, sys
    # Ctrl-C raises KeyboardInterrupt, as in a terminal: a child started where SIGINT is
    # ignored (a CI job launched in the background by a shell without job control) would
    # otherwise inherit the ignoring, with or without tf_mpt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy as np
    import tensorflow as tf
    import tf_mpt.rewrite as rewrite
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    SIGNAL = getattr(signal, sys.argv[1])
    original = rewrite.rewrite_with_library
    def rewrite_and_signal(*args, **kwargs):
        rewrite.rewrite_with_library = original  # once
        os.kill(os.getpid(), SIGNAL)
        return original(*args, **kwargs)
    x = tf1.placeholder(tf.float32, [None, 8], name="x")
    w = tf1.get_variable("w", [8, 8], initializer=tf1.ones_initializer())
    y = tf.matmul(x, w, name="y")
    loss = tf.reduce_mean(tf.square(y))
    train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
    saver = tf1.train.Saver()
    sess = tf1.Session()
    sess.run(tf1.global_variables_initializer())
    feed = {x: np.ones((4, 8), np.float32)}
    rewrite.rewrite_with_library = rewrite_and_signal  # the next rewrite: the training step's
""")


def _run(body, signal_name, dtype="bfloat16", **env):
    full_env = child_env()
    full_env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_ENABLE="1",
                    TF_MPT_DTYPE=dtype, **env)
    try:
        return subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body),
                               signal_name], env=full_env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the script hung (over {TIMEOUT_S} s): {error.stderr!r}"[-3000:])


def test_a_sigterm_handler_that_saves_a_checkpoint_runs_after_the_step(tmp_path):
    done = _run(f"""
        def save_and_note(signum, frame):
            print("saved", saver.save(sess, {str(tmp_path / 'model.ckpt')!r}), flush=True)
        signal.signal(signal.SIGTERM, save_and_note)
        print("loss", sess.run([train, loss], feed)[1], flush=True)
        print("after")
    """, "SIGTERM")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # the handler ran when Session.run returned, before the script's next line
    assert [line.split()[0] for line in lines] == ["saved", "loss", "after"]
    assert os.path.exists(str(tmp_path / "model.ckpt.index"))
    assert "could not rewrite" not in done.stderr


def test_ctrl_c_during_the_rewrite_reaches_the_script_as_keyboard_interrupt():
    done = _run("""
        try:
            sess.run([train, loss], feed)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        print("w", sess.run(w)[0, 0])  # the step ran before the handler, as without tf_mpt
    """, "SIGINT")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["interrupted", "w 0.98"], \
        done.stderr[-3000:]  # 1 - 0.01 * 2: one step
    assert "could not rewrite" not in done.stderr


def test_sys_exit_in_a_handler_during_the_rewrite_exits_with_its_status():
    done = _run("""
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
        sess.run([train, loss], feed)
        print("still running")
    """, "SIGTERM")
    assert done.returncode == 7, done.stderr[-3000:]
    assert "still running" not in done.stdout
    assert "could not rewrite" not in done.stderr


# --- imports: tf_mpt imported before tensorflow -------------------------------------------------

_IMPORTS_FIRST = textwrap.dedent("""
    {first}
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    x = tf1.placeholder(tf.float32, [None, 256])
    w = tf1.get_variable("w", [256, 256])
    y = tf.reduce_sum(tf.matmul(x, w), axis=1)
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        meta = tf1.RunMetadata()
        sess.run(y, {{x: np.ones((64, 256))}},
                 options=tf1.RunOptions(output_partition_graphs=True), run_metadata=meta)
    print("half", sum(node.attr["T"].type == tf.bfloat16.as_datatype_enum
                      for graph in meta.partition_graphs for node in graph.node))
""")


# the public name by default; the others under -m heavy
@pytest.mark.parametrize("first", [
    "from tf_mpt import keep_fp32",
    pytest.param("import tf_mpt.rewrite", marks=pytest.mark.heavy),
    pytest.param("from tf_mpt.training import optimizer", marks=pytest.mark.heavy),
    pytest.param("import tf_mpt.automatic.switch", marks=pytest.mark.heavy),
    pytest.param("import tf_mpt.models.sources", marks=pytest.mark.heavy)])
def test_tf_mpt_imported_before_tensorflow_enables_once_and_fully(first):
    # TF_MPT_CPU_FLAGS passes through: a run of the suite "as another CPU" reaches the script
    full_env = child_env(keep=("TF_MPT_CPU_FLAGS",))
    # the op lists decide: whether this CPU times a [64x256] x [256x256] MatMul faster in
    # bfloat16 is no part of enabling (a Zen 4 measured it slower, Casts included, and kept
    # it float32; a Cascade Lake always does)
    full_env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_ENABLE="1",
                    TF_MPT_DTYPE="bfloat16", TF_MPT_TARGET="rules")
    done = subprocess.run([sys.executable, "-c", _IMPORTS_FIRST.format(first=first)],
                          env=full_env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("tf_mpt: enabled: dtype=bfloat16") == 1, done.stderr[-3000:]
    assert "could not enable" not in done.stderr
    assert int(done.stdout.split("half")[1]) > 0  # the MatMul ran in bfloat16


# --- a Session on another master ----------------------------------------------------------------

_REMOTE = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    server = tf1.train.Server.create_local_server()
    x = tf1.placeholder(tf.float32, [None, 64])
    w = tf1.get_variable("w", [64, 64], initializer=tf1.glorot_uniform_initializer(seed=1))
    y = tf.reduce_sum(tf.matmul(x, w), axis=1)
    for _ in range(2):
        with tf1.Session(server.target) as sess:
            sess.run(tf1.global_variables_initializer())
            meta = tf1.RunMetadata()
            out = sess.run(y, {x: np.ones((4, 64))},
                           options=tf1.RunOptions(output_partition_graphs=True),
                           run_metadata=meta)
    print("half", sum(node.attr["T"].type == tf.bfloat16.as_datatype_enum
                      for graph in meta.partition_graphs for node in graph.node))
    print("out", repr(out.tolist()))
""")


# under -m heavy (a second TensorFlow server): what runs float32 with one warning stays in the
# default run (the copy path's Sessions with state, test_session_patterns.py)
@pytest.mark.parametrize("session_rewrite", [pytest.param("grappler", marks=pytest.mark.heavy),
                                             pytest.param("copy", marks=pytest.mark.heavy)])
def test_a_session_on_a_remote_master_says_once_that_it_runs_float32(session_rewrite):
    full_env = child_env()
    full_env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    runs = {}
    for label, extra in (("float32", {}), ("mixed", dict(
            TF_MPT_ENABLE="1", TF_MPT_DTYPE="bfloat16", TF_MPT_SESSION_REWRITE=session_rewrite))):
        runs[label] = subprocess.run([sys.executable, "-c", _REMOTE], env={**full_env, **extra},
                                     capture_output=True, text=True, timeout=TIMEOUT_S)
        assert runs[label].returncode == 0, runs[label].stderr[-3000:]
    mixed = runs["mixed"]
    assert mixed.stderr.count("runs in float32: its graph runs on that master") == 1
    assert "half 0" in mixed.stdout
    assert mixed.stdout == runs["float32"].stdout  # exactly float32's results


# --- the native optimizer is built at the first TF1 Session, not before --------------------------

_EAGER_THEN_SESSION = textwrap.dedent("""
    import sys
    import tensorflow as tf
    w = tf.Variable(tf.ones([4, 4]))
    print("eager", float(tf.reduce_sum(tf.matmul(tf.ones([2, 4]), w))), flush=True)
    print("EAGER DONE", file=sys.stderr, flush=True)
    if sys.argv[1] == "session":
        graph = tf.Graph()
        with graph.as_default():
            y = tf.reduce_sum(tf.matmul(tf.ones([2, 4]), tf.ones([4, 4])))
        with tf.compat.v1.Session(graph=graph) as sess:
            print("session", float(sess.run(y)))
""")


# the eager script alone under -m heavy (the Session's run sees its eager part first)
@pytest.mark.parametrize("with_session", [pytest.param(False, marks=pytest.mark.heavy), True])
def test_the_native_optimizer_is_built_at_the_first_session_only(with_session, tmp_path):
    """An eager TF2 script never compiles the TF1 Session optimizer; the first Session does
    (here the compiler is missing: one warning then, at the Session, and the copy path)."""
    full_env = child_env()
    full_env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_MPT_ENABLE="1",
                    TF_MPT_DTYPE="bfloat16", CXX=str(tmp_path / "no-such-compiler"),
                    TF_MPT_CACHE_DIR=str(tmp_path / "cache"),
                    TF_MPT_TARGET="rules")  # an empty cache: no op-cost table to measure
    done = subprocess.run([sys.executable, "-c", _EAGER_THEN_SESSION,
                           "session" if with_session else "eager"], env=full_env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    eager_part, _, session_part = done.stderr.partition("EAGER DONE")
    assert "Grappler optimizer is unavailable" not in eager_part  # nothing compiled yet
    assert "eager 32.0" in done.stdout
    warnings = session_part.count("Grappler optimizer is unavailable (no C++ compiler")
    assert warnings == (1 if with_session else 0), done.stderr[-3000:]
    if with_session:
        assert "session 32.0" in done.stdout
