"""TF2: rewrite ConcreteFunctions, and `tf_mpt.function`, a tf.function whose graphs are rewritten.

    graph_def = concrete_function.graph.as_graph_def()       # body + function library
    rewrite it (outputs, control outputs and inputs keep their dtypes)
    new function = tf.function(import the rewritten GraphDef, inputs mapped to the arguments,
                               captured placeholders mapped to the original captures)
    return its concrete function for the original input signature

The captures are the original tensors (variable handles), so a rewritten training step
updates the real variables.
"""

import dataclasses
import functools
import inspect
import logging
import os
import threading
import weakref

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops

from tf_mpt import _dtypes
from tf_mpt import config as _config
from tf_mpt import rewrite as _rewrite
from tf_mpt import targets as _targets
from tf_mpt._process import xla as _xla
from tf_mpt.choose.timers import step_timer as _step_timers
from tf_mpt.rewrite import function_bodies as _function_library
from tf_mpt.rewrite import type_attrs as _ta
from tf_mpt.rewrite.paint import shapes as _shapes

_log = logging.getLogger(__name__)

# tf.function as TensorFlow defines it, kept before the automatic path replaces `tf.function`.
_TF_FUNCTION = tf.function


def _check_concrete_function(function):
    if not (hasattr(function, "graph") and hasattr(function, "captured_inputs")
            and hasattr(function, "structured_input_signature")):
        hint = ""
        if hasattr(function, "get_concrete_function"):
            hint = " Call .get_concrete_function(...) on the tf.function first."
        raise TypeError(
            "concrete_function must be a TensorFlow ConcreteFunction. Received: "
            f"concrete_function={function!r} (of type {type(function).__name__}).{hint}")


def rewrite_function(concrete_function, *, dtype="float16", config=None, jit_compile=None,
                     target=None):
    """Returns a ConcreteFunction computing `concrete_function` in mixed precision.

    Same input signature and output structure and dtypes; captured variables stay captured,
    so assignments (a training step's updates) reach the real variables. If the rewrite
    changes nothing, or fails internally (one warning is logged), the input is returned.

    Args:
        concrete_function: e.g. `my_tf_function.get_concrete_function(spec)`.
        dtype: 'float16' or 'bfloat16'.
        config: a tf_mpt.Config, or None for the TF_MPT_* environment.
        jit_compile: passed to the tf.function the rewritten graph is rebuilt in (that of
            the tf.function `concrete_function` came from, e.g. True for XLA).
        target: 'rules', 'here', a cost table's path or 'auto'; None: the config's (see
            tf_mpt.rewrite_graph_def).
    """
    _check_concrete_function(concrete_function)
    return _rewrite_concrete(concrete_function, dtype, config, jit_compile, target).function


@dataclasses.dataclass(frozen=True)
class _Rewritten:
    """function: the rebuilt ConcreteFunction, or the input when nothing changed (or it could
    not be rebuilt, or it ran faster in float32); report: the rewrite's report; graph_def:
    the GraphDef `function` was rebuilt from (its library named apart and registered with
    the eager context, so not in it), None where none was; library: that library."""
    function: object
    report: object = None
    graph_def: object = None
    library: object = None

    def whole_graph_def(self):
        """A copy of graph_def with its library (a Session importing graph_def without it
        crashed TF 2.21), or None."""
        if self.graph_def is None:
            return None
        whole = type(self.graph_def)()
        whole.CopyFrom(self.graph_def)
        whole.library.CopyFrom(self.library)
        return whole


def _rewrite_concrete(cf, dtype, config, jit_compile, target, timed=False, name=None):
    """timed: where when.step_applies (tf_mpt.function), the candidate colourings are
    timed on copies of the function's variables and the fastest is kept; `name` is the
    function's in the INFO line that says so (None: the trace's)."""
    config = _rewrite.with_target(config, target)
    dtype_name = _dtypes.parse(dtype).name
    graph_def = cf.graph.as_graph_def()
    fetches = [t.op.name for t in cf.outputs] + [t.op.name for t in cf.inputs]
    control_outputs = [op.name for op in cf.graph.control_outputs if op.name not in fetches]
    fetches += control_outputs
    result = _rewrite.rewrite_with_library(
        graph_def, dtype=dtype_name, fetches=fetches, lists=None, strict=False,
        shapes=lambda: _shapes.shapes_of_graph(cf.graph), config=config,
        control_outputs=control_outputs,
        step_timer=_step_timer(cf, jit_compile, graph_def) if timed else None,
        label=f"tf.function {name or _text(cf.name)}")
    if not result.modified:
        return _Rewritten(cf, report=result.report)
    graph_def = _rename_library(result.graph_def, f"_tf_mpt_{dtype_name}")
    try:
        library = _register_library(graph_def)
        return _Rewritten(_function_from_graph_def(cf, graph_def, library, jit_compile),
                          result.report, graph_def, library)
    except Exception as error:  # pylint: disable=broad-except
        _log.warning("tf_mpt could not rebuild function %s from its rewritten graph (%s: %s); "
                     "it is left unchanged in float32.", _text(cf.name), type(error).__name__, error)
        return _Rewritten(cf, report=result.report)


def _step_timer(cf, jit_compile, graph_def):
    """decision.decide's timer for `cf`'s candidates (timers.step_timer.StepTimer): on copies
    of its variables, or as XLA compiles them where `jit_compile`; `graph_def`, `cf`'s as
    traced, says whether it calls a function XLA compiles (Keras's predict loop calling its
    jit_compile step: timed whatever the cost model predicts, in the Session sandbox, which
    compiles that call as the step's run does)."""
    return _step_timers.StepTimer(
        cf, bool(jit_compile), _rename_library, _compiled_candidate,
        lambda graph: _canonical(graph, cf), _calls_compiled(graph_def))


def _calls_compiled(graph_def):
    """Whether a node of `graph_def` or of its library functions is one XLA compiles (its
    `_XlaMustCompile` attr: a call of a jit_compile=True function), or a library function
    is marked so."""
    # (read with `in` first: indexing a protobuf map inserts the key, and `graph_def` is the
    # one being rewritten)
    for function in graph_def.library.function:
        if _XLA_MUST_COMPILE in function.attr and function.attr[_XLA_MUST_COMPILE].b:
            return True
    return any(_XLA_MUST_COMPILE in node.attr and node.attr[_XLA_MUST_COMPILE].b
               for node in _function_library.all_nodes(graph_def))


_XLA_MUST_COMPILE = "_XlaMustCompile"


def _compiled_candidate(cf, graph_def, values):
    """A no-argument tf.function(jit_compile=True) running candidate `graph_def` of `cf` (its
    library functions named apart) on `values` ({the placeholder name of each argument and
    capture: an eager tensor or a variable copy's handle}): the step as XLA compiles it,
    reading and updating the copies (timers.compiled.CompiledSandbox)."""
    output_names = [t.name for t in cf.outputs]
    control_names = [op.name for op in cf.graph.control_outputs]
    graph_def, unused = _without_mapped_placeholders(graph_def, list(values),
                                                      output_names + control_names)
    if graph_def.library.function:
        copied = type(graph_def)()
        copied.CopyFrom(graph_def)  # (_register_library drops the library from its argument)
        graph_def = copied
    library = _register_library(graph_def)

    def body():
        graph = tf.compat.v1.get_default_graph()
        _add_library(graph, library)
        input_map = {name: graph.capture(value) for name, value in values.items()
                     if name not in unused}
        returned = tf.graph_util.import_graph_def(
            graph_def, input_map=input_map, return_elements=output_names + control_names,
            name="candidate")
        with tf.control_dependencies(returned[len(output_names):]):
            return [tf.identity(t) for t in returned[:len(output_names)]] or tf.constant(0)

    return _TF_FUNCTION(body, autograph=False, jit_compile=True)


def _canonical(graph_def, cf):
    """A copy of `cf`'s traced `graph_def` keyed for the verdict cache (decision.decide): its
    library functions renamed `f0, f1, ...` in the order the graph's nodes, then theirs,
    call them (a trace names them with its process's counters), listed in that order, their
    arguments numbered (_number_arguments), and a Const node holding the
    shapes and dtypes of its variables and arguments (what the GraphDef alone does not say:
    a wider layer reads the same ReadVariableOps). The same script's step in another process
    has the same key."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    order, todo = [], [graph_def.node]
    while todo:
        for node in todo.pop(0):
            called = [node.op] + [f.name for f in _function_library.called_functions(node)]
            for name in called:  # (a node may call a function by its op's name)
                if name in functions and name not in order:
                    order.append(name)
                    todo.append(functions[name].node_def)
    order += sorted(set(functions) - set(order))  # (only in the gradient registry)
    out = _with_functions_renamed(
        graph_def, {name: f"f{index}" for index, name in enumerate(order)})
    for fdef in out.library.function:
        _number_arguments(fdef)
    listed = sorted(out.library.function, key=lambda f: int(f.signature.name[1:]))
    out.library.ClearField("function")
    out.library.function.extend(listed)  # (in the order of their names, not of their traces)
    gradients = sorted(out.library.gradient, key=lambda g: (g.function_name, g.gradient_func))
    out.library.ClearField("gradient")
    out.library.gradient.extend(gradients)
    sizes = sorted(f"{v.dtype.name}{v.shape.as_list()}" for v in cf.variables) + \
        [f"{t.dtype.name}{t.shape}" for t in cf.inputs]  # (cf.variables: in no set order)
    marker = out.node.add(name="_tf_mpt_key_shapes", op="Const")
    marker.attr["value"].tensor.string_val.extend(s.encode() for s in sizes)
    return out


def _number_arguments(fdef):
    """Renames `fdef`'s arguments a0, a1, ... (in place), references included: a trace names
    a body's arguments after its own counters (map_while_cond_20___redundant_placeholder0)."""
    args = {arg.name: f"a{index}" for index, arg in enumerate(fdef.signature.input_arg)}

    def fixed(reference):
        control = reference.startswith("^")
        head, sep, rest = reference[control:].partition(":")
        return ("^" if control else "") + args[head] + sep + rest if head in args else reference
    for arg in fdef.signature.input_arg:
        arg.name = args[arg.name]
    for node in fdef.node_def:
        for index, reference in enumerate(node.input):
            node.input[index] = fixed(reference)
    for key in list(fdef.ret):
        fdef.ret[key] = fixed(fdef.ret[key])
    for key in list(fdef.control_ret):
        fdef.control_ret[key] = fixed(fdef.control_ret[key])


def _rename_library(graph_def, suffix):
    """A copy with every library function renamed `<name><suffix>`, references included,
    and every `api_implements` attr value suffixed the same way.

    The eager context already holds the original functions under their names, and importing
    a function whose name is taken keeps the registered (float32) body.
    """
    renamed = {f.signature.name: f.signature.name + suffix for f in graph_def.library.function}
    if not renamed:
        return graph_def
    out = _with_functions_renamed(graph_def, renamed)
    for fdef in out.library.function:
        if "api_implements" in fdef.attr:
            # TensorFlow's implementation selector swaps a call for any registered function
            # with the same `api_implements` (tf_keras's LSTM: standard_lstm on a CPU); the
            # original float32 functions are registered under the old value
            fdef.attr["api_implements"].s += suffix.encode()
    return out


def _with_functions_renamed(graph_def, renamed):
    """A copy of `graph_def` with its library functions renamed by {old name: new name}
    (every one), references included: calls by op name, function-valued attrs in the graph
    and in every body, and the gradient registry."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)

    def fix(nodes):
        for node in nodes:
            if node.op in renamed:
                node.op = renamed[node.op]
            for func in _function_library.called_functions(node):
                if func.name in renamed:
                    func.name = renamed[func.name]

    fix(out.node)
    for fdef in out.library.function:
        fdef.signature.name = renamed[fdef.signature.name]
        fix(fdef.node_def)
    for gradient in out.library.gradient:
        for field in ("function_name", "gradient_func"):
            name = getattr(gradient, field)
            if name in renamed:
                setattr(gradient, field, renamed[name])
    return out


def _register_library(graph_def):
    """Registers the (renamed) library functions with the eager context and drops them from
    `graph_def`: importing them inside a tf.function instead crashed TF 2.21 at run time
    (a segmentation fault calling a While whose body was imported that way).

    Returns the dropped library: the rebuilt function's graph must still list its functions
    (see `_add_library`), or a TF1 graph calling it gets the call without the callees.
    """
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
    ctx = context.context()
    for fdef in graph_def.library.function:
        if not ctx.has_function(fdef.signature.name):
            ctx.add_function_def(fdef)
    library = type(graph_def.library)()
    library.CopyFrom(graph_def.library)
    del graph_def.library.function[:]
    del graph_def.library.gradient[:]
    return library


def _add_library(graph, library):
    """Adds `library`'s functions to the FuncGraph being traced, as import_graph_def does.

    The eager context has them already, which is all an eager call needs; but a graph that
    calls the traced function (a TF1 graph run by a Session, or an enclosing tf.function's
    graph) copies only the functions its FuncGraph lists, so without them the Session reports
    "Function <name>_tf_mpt_<dtype> is not defined".
    """
    from tensorflow.python.framework import function as defun  # pylint: disable=g-import-not-at-top
    for func in defun.from_library(library):
        if not graph._is_function(func.name):  # pylint: disable=protected-access
            func.add_to_graph(graph)


def _function_from_graph_def(cf, graph_def, library=None, jit_compile=None):
    captured = list(cf.captured_inputs)
    n_args = len(cf.inputs) - len(captured)
    arg_names = [t.name for t in cf.inputs[:n_args]]
    capture_names = [t.name for t in cf.inputs[n_args:]]
    output_names = [t.name for t in cf.outputs]
    control_names = [op.name for op in cf.graph.control_outputs]
    structured_outputs = cf.structured_outputs
    args_spec, kwargs_spec = cf.structured_input_signature

    unused = ()
    if jit_compile:  # (only there: without XLA the executor prunes them, and Grappler's
        # implementation selector chose tf_keras's LSTM's float32 original without them)
        graph_def, unused = _without_mapped_placeholders(
            graph_def, arg_names + capture_names, output_names + control_names)
    signature = _python_signature(cf)
    # The variables whose handles it captures: the rebuilt function reads them through the
    # variable (as the traced code did), so calls record a variable access and a
    # GradientTape around a call watches them (capturing the bare handle gives no gradient).
    owners = {id(v.handle): v for v in cf.graph.variables}
    read = [owners[id(t)] for t in captured if id(t) in owners]

    def body(*args, **kwargs):
        if signature is not None:
            bound = signature.bind(*args, **kwargs)
            args, kwargs = [bound.arguments[name] for name in signature.parameters], {}
        leaves = [x for x in tf.nest.flatten((args, kwargs), expand_composites=True)
                  if isinstance(x, (tf.Tensor, tf.Variable))]
        if len(leaves) != len(arg_names):
            raise ValueError(f"expected {len(arg_names)} tensor arguments, got {len(leaves)}")
        input_map = dict(zip(arg_names, leaves))
        graph = tf.compat.v1.get_default_graph()
        if library is not None:
            _add_library(graph, library)
        for variable in read:
            _resource_variable_ops.variable_accessed(variable)
        input_map.update((name, graph.capture(t)) for name, t in zip(capture_names, captured))
        for name in unused:  # (import_graph_def refuses a key it neither finds nor uses)
            input_map.pop(name, None)
        returned = tf.graph_util.import_graph_def(
            graph_def, input_map=input_map, return_elements=output_names + control_names,
            name="tf_mpt")
        outputs = returned[:len(output_names)]
        with tf.control_dependencies(returned[len(output_names):]):
            outputs = [tf.identity(t) for t in outputs]
        return _pack_outputs(structured_outputs, outputs)

    if signature is not None:
        body.__signature__ = signature  # keyword arguments keep working
    body.__name__ = f"tf_mpt_{_text(cf.name)}"
    return _TF_FUNCTION(body, autograph=False, jit_compile=jit_compile).get_concrete_function(
        *args_spec, **kwargs_spec)


def _without_mapped_placeholders(graph_def, mapped, returned):
    """A copy of `graph_def` without the Placeholders of its arguments and captures (the
    tensors named in `mapped`, which import_graph_def's input_map replaces), where none is
    itself returned. Imported, such a Placeholder would stay in the rebuilt function's body
    with no consumer: the executor prunes it, but XLA compiles the whole body and has no
    Placeholder kernel (a jit_compile=True function failed to compile, and so did every
    function it was called from).

    Returns (the graph, the names in `mapped` it no longer holds and nothing reads: an
    argument the function never uses, whose input_map entry must go too)."""
    mapped_nodes = {name.split(":")[0] for name in mapped if name.endswith(":0")}
    # returned, or a control input (which input_map cannot stand in for): kept
    kept_nodes = {name.split(":")[0].lstrip("^") for name in returned} | {
        name[1:] for node in graph_def.node for name in node.input if name.startswith("^")}
    drop = {node.name for node in graph_def.node if node.op == "Placeholder"
            and node.name in mapped_nodes and node.name not in kept_nodes}
    if not drop:
        return graph_def, ()
    read = {name.split(":")[0] for node in graph_def.node for name in node.input}
    pruned = type(graph_def)()
    pruned.CopyFrom(graph_def)
    del pruned.node[:]
    pruned.node.extend(node for node in graph_def.node if node.name not in drop)
    return pruned, [name for name in mapped if name.split(":")[0] in drop - read]


def _python_signature(cf):
    """The original function's parameters (names and kinds), or None if they are variadic."""
    function_type = getattr(cf, "function_type", None)
    if function_type is None:
        return None
    params = list(function_type.parameters.values())
    if any(p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
           for p in params):
        return None
    return inspect.Signature([inspect.Parameter(p.name, p.kind) for p in params])


def _text(name):
    return name.decode() if isinstance(name, bytes) else str(name)


def _pack_outputs(structure, tensors):
    """`structure` with its tensor leaves replaced, in order, by `tensors`."""
    leaves = tf.nest.flatten(structure, expand_composites=True)
    it = iter(tensors)
    # A loaded SavedModel's functions describe their outputs with TensorSpecs.
    new_leaves = [next(it) if isinstance(leaf, (tf.Tensor, tf.TensorSpec)) else leaf
                  for leaf in leaves]
    return tf.nest.pack_sequence_as(structure, new_leaves, expand_composites=True)


class Function:
    """A tf.function whose traced graphs are rewritten to mixed precision (see `function`)."""

    def __init__(self, fn, dtype, tf_function_kwargs, tf_function=None, on_trace=None,
                 target=None, leave_own_half=False):
        self._dtype = _dtypes.parse(dtype).name
        # the automatic path: a traced graph that already computes in half (the script's own
        # mixed precision) runs as the script wrote it
        self._leave_own_half = leave_own_half
        self._target = None if target is None else _targets.parse(target)
        self._on_trace = on_trace  # called with each newly traced graph, before the rewrite
        self._jit_compile = tf_function_kwargs.get("jit_compile")
        self._tf_function = (tf_function if tf_function is not None
                             else _TF_FUNCTION(fn, **tf_function_kwargs))
        self._rewritten = {}
        # checks a compiled step left to its caller (_process/xla.py), by the name of the
        # function a call runs
        self._deferred = {}
        self._lock = threading.Lock()
        self._bound = weakref.WeakKeyDictionary()
        self._warned = set()
        functools.update_wrapper(self, fn)

    def __get__(self, instance, owner):
        """Decorating a method works as with tf.function: one bound function per instance."""
        if instance is None:
            return self
        try:
            bound = self._bound.get(instance)
        except TypeError:  # not weak-referenceable
            bound = None
        if bound is None:
            bound = Function(self.__wrapped__, self._dtype, {"jit_compile": self._jit_compile},
                             tf_function=self._tf_function.__get__(instance, owner),
                             on_trace=self._on_trace, target=self._target,
                             leave_own_half=self._leave_own_half)
            try:
                self._bound[instance] = bound
            except TypeError:
                pass
        return bound

    @property
    def python_function(self):
        return self._tf_function.python_function

    def get_concrete_function(self, *args, **kwargs):
        """The rewritten ConcreteFunction for these arguments (traced on first use)."""
        return self._concrete(args, kwargs, called=False)

    def _concrete(self, args, kwargs, called):
        """called: the arguments are a call's (values, not specs): a graph traced for any
        batch is costed at their leading size (else at TF_MPT_COST_BATCH)."""
        with _xla.collect() as deferred:  # checks a compiled step leaves to its caller
            original = self._tf_function.get_concrete_function(*args, **kwargs)
        with self._lock:
            rewritten = self._rewritten.get(original.name)
            if rewritten is None:
                if self._on_trace is not None:
                    self._on_trace(original.graph)
                own = _half_ops(original.graph) if self._leave_own_half else 0
                if own:
                    self._rewritten[original.name] = original
                    self._deferred[original.name] = list(deferred)
                    _log.info("tf_mpt leaves tf.function %s as the script wrote it: %d of its "
                              "ops already compute in bfloat16 or float16 (the script's own "
                              "mixed precision: a layer's dtype policy, or a global one), so "
                              "it is not converted again", getattr(self, "__name__", "?"), own)
                    return original
                config = _config.Config.from_env(os.environ)
                batch = _shapes.leading_size((args, kwargs)) if called else None
                if batch is not None:
                    config = dataclasses.replace(config, cost_batch=batch)
                rewritten = _rewrite_concrete(original, self._dtype, config,
                                              self._jit_compile, self._target,
                                              timed=True,
                                              name=getattr(self, "__name__", None)).function
                self._rewritten[original.name] = rewritten
                self._deferred[rewritten.name] = list(deferred)
        return rewritten

    def __call__(self, *args, **kwargs):
        rewritten = self._concrete(args, kwargs, called=True)
        deferred = self._deferred.get(rewritten.name, ())
        try:
            return _xla.run_after(deferred, rewritten(*args, **kwargs))
        except TypeError as error:
            # The arguments bind to the traced function but not to the one rebuilt from its
            # rewritten graph (e.g. a TF1 ref variable passed as an argument): that call runs
            # the function as TensorFlow traced it, in float32, rather than fail.
            key = ("unbindable", _text(rewritten.name))
            if key not in self._warned:
                self._warned.add(key)
                _log.warning("tf_mpt runs tf.function %s in float32 for these arguments: they "
                             "do not bind to its mixed-precision version (%s: %s).",
                             getattr(self, "__name__", rewritten.name), type(error).__name__,
                             str(error).splitlines()[0][:300])
            return _xla.run_after(deferred, self._tf_function(*args, **kwargs))
        except tf.errors.OpError as error:
            if not (self._jit_compile and _xla.failed_to_compile(error)):
                raise
            return self._as_written(args, kwargs, error, deferred)

    def _as_written(self, args, kwargs, error, deferred):
        """XLA could not compile the rewritten program (before running any of it): this call
        and the later ones with these arguments run the function as the script wrote it,
        with one WARNING saying why (a float32 program XLA cannot compile fails as without
        tf_mpt)."""
        original = self._tf_function.get_concrete_function(*args, **kwargs)
        with self._lock:
            self._rewritten[original.name] = original
            self._deferred[original.name] = deferred
        key = ("xla refused the rewrite", _text(original.name))
        if key not in self._warned:
            self._warned.add(key)
            _log.warning("tf_mpt runs tf.function %s in float32, as written: XLA "
                         "(jit_compile=True) could not compile its mixed-precision version "
                         "(%s)", getattr(self, "__name__", "?"), _xla.first_line(error))
        return _xla.run_after(deferred, self._tf_function(*args, **kwargs))

    def experimental_get_compiler_ir(self, *args, **kwargs):
        """What XLA compiles for these arguments, as tf.function's method gives it: the
        rewritten function's program (the wrapped float32 one's would show what no longer
        runs), called from a compiled function."""
        rewritten = self._concrete(args, kwargs, called=True)
        caller = _TF_FUNCTION(lambda *a, **k: rewritten(*a, **k), jit_compile=True,
                              autograph=False)
        return caller.experimental_get_compiler_ir(*args, **kwargs)

    def __getattr__(self, name):
        # Anything else a tf.function offers (input_signature, experimental_* ...) is the
        # wrapped tf.function's.
        if name.startswith("__") or name in ("_tf_function", "_bound", "_on_trace", "_warned",
                                             "_jit_compile", "_target", "_leave_own_half",
                                             "_deferred"):
            raise AttributeError(name)
        return getattr(self._tf_function, name)


def _half_ops(graph):
    """How many ops of a traced graph (its functions included) compute in float16 or
    bfloat16: a type attr, or an entry of a type-list attr, is one."""
    halves = set(_ta.HALF_TYPES)
    return sum(1 for node in _function_library.all_nodes(graph.as_graph_def())
               if _ta.computes_in(node, halves))


def function(fn=None, *, dtype="float16", target=None, **tf_function_kwargs):
    """A drop-in for tf.function whose traced graphs run in mixed precision.

    Usable as `@tf_mpt.function`, `@tf_mpt.function(dtype="bfloat16")` or
    `tf_mpt.function(fn, dtype=..., input_signature=...)`; `target` as in
    tf_mpt.rewrite_graph_def (None: TF_MPT_TARGET); other keyword arguments go to
    tf.function.
    """
    if fn is None:
        return lambda f: Function(f, dtype, tf_function_kwargs, target=target)
    return Function(fn, dtype, tf_function_kwargs, target=target)
