"""tf_mpt's process-wide state, all of it, in one object (no TensorFlow import).

Why global: what tf_mpt hooks into is process-wide. Sessions, `tf.gradients`, GradientTape and
the Keras optimizers are patched on their classes, Grappler's registry holds one "TfMpt"
optimizer per process, and Python runs signal handlers and import hooks for the whole
interpreter. So the automatic path's settings, the patches that undo it, the native
optimizer and its graphs, the registry of scaled gradients and the warnings already given
live here, each field saying who writes it; `tf_mpt.disable()` resets what a later
`enable()` must find fresh.
"""

import contextlib
import itertools
import logging
import threading
import weakref

_log = logging.getLogger("tf_mpt")


class State:
    """The fields, grouped by the module that writes them."""

    def __init__(self):
        # tf_mpt._process.patches: (owner, attribute, original); owner None: a label and its restore
        self.patches = []
        # tf_mpt._process.startup: the start-up call's result; a Config waiting for a tf_mpt import
        self.started = []
        self.deferred_enable = []
        # tf_mpt.automatic.switch: the Settings in force (None while off); 'auto' found no
        # fast half type (warned once)
        self.settings = None
        self.stays_float32 = False
        # tf_mpt.automatic.sessions: user Session -> its rewritten shadow (copy path)
        self.shadows = weakref.WeakKeyDictionary()
        # tf_mpt.automatic.native.library: the loaded library, or the first failure
        self.native_lock = threading.Lock()
        self.native_library = None
        self.native_failure = None
        self.native_early = None  # a build under way (library.build_early)
        # tf_mpt.automatic.native.rewriter: what the callback rewrites to, the callback
        # (alive for the process once made), the user graphs by key (for static shapes), and
        # the signals that arrived during a rewrite
        self.rewriter_lock = threading.Lock()
        self.rewriter = None
        self.rewriter_callback = None
        self.graphs = weakref.WeakValueDictionary()
        self.graph_keys = weakref.WeakKeyDictionary()
        self.next_graph_key = itertools.count(1)
        self.deferred_signals = []
        # tf_mpt.training.gradient_records: the loss scale for optimizers that have none yet
        # ('dynamic' or a number; None: automatic scaling off), the all-reduce dtype choice,
        # graph -> {name of an unscaling op: Record}
        self.default_loss_scale = None
        self.allreduce_dtype = "float32"
        self.gradient_records = weakref.WeakKeyDictionary()
        # tf_mpt.automatic.gradients: autograph's generated file -> {line: the script's line}
        self.source_maps = {}
        # tf_mpt.costs.op_costs: the cost tables read or measured, by (source, path,
        # dtype); kept by disable() (a machine's kernel times do not change)
        self.op_cost_tables = {}
        # ... the child process that measures for this process (op_costs.ProbeServer), and
        # whether its atexit handler is registered
        self.probe_server = None
        self.probe_server_atexit = False
        # ... and the node_spec keys the cost model asks times for, while `tf-mpt measure
        # --model` records them (a set), else None
        self.node_spec_recorder = None
        # warn_once: the keys of the warnings given (forgotten by disable())
        self.warned = set()
        self.local = threading.local()  # per thread: .bypass, .fed_batch


STATE = State()


_WARNED_LOCK = threading.Lock()


def warn_once(key, message, *args, level=logging.WARNING):
    """Logs `message % args` (WARNING, or `level`) the first time `key` is seen (until
    disable())."""
    with _WARNED_LOCK:  # two threads may meet the same first time (two traces at once)
        if key in STATE.warned:
            return
        STATE.warned.add(key)
    _log.log(level, message, *args)


@contextlib.contextmanager
def _thread_value(name, value, default):
    """STATE.local.<name> = value while active (this thread), then what it was."""
    previous = getattr(STATE.local, name, default)
    setattr(STATE.local, name, value)
    try:
        yield
    finally:
        setattr(STATE.local, name, previous)


def bypass():
    """While active (this thread), tf_mpt's patched methods do what TensorFlow/Keras would:
    tf_mpt calling TensorFlow itself (a shadow Session, a wrapped optimizer, Keras applying
    gradients tf_mpt already scaled)."""
    return _thread_value("bypass", True, False)


def bypassing():
    return getattr(STATE.local, "bypass", False)


def fed_batch(batch):
    """While active (this thread): the batch size the running Session.run feeds (None:
    unknown), for the cost model of a graph the Session optimises in that run."""
    return _thread_value("fed_batch", batch, None)


def current_fed_batch():
    return getattr(STATE.local, "fed_batch", None)
