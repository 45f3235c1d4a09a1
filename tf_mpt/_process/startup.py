"""Process start-up: what the installed `tf_mpt-startup.pth` line and `python -m tf_mpt` run.

Costs nothing unless a TF_MPT_ENABLE / TF_MPT_GRAPH_REWRITE / TF_MPT_LOSS_SCALING variable is
set (no TensorFlow import). When one is, the configuration is parsed at once (a bad value
stops the script with a message naming the variable, the value and what is accepted; when
every switch is off, a bad value of another variable is only a warning), and tf_mpt is
enabled right after the script imports tensorflow.
"""

import logging
import os
import sys

from tf_mpt._process import import_hooks as _import_hooks, patches as _patches  # no TensorFlow import
from tf_mpt._process.state import STATE


def install_from_env(environ=None, at_startup=True):
    """Called at start-up. Returns True if the post-import hook was installed.

    A bad value ends the process with status 2 after the message (at start-up, from the .pth
    line, a SystemExit would become a fatal "Failed to import the site module" error).
    The .pth line can run twice in one start-up (a virtual environment's site-packages is
    processed by site.venv() and again by site.main()): the second call does nothing.
    """
    if at_startup and STATE.started:
        return STATE.started[0]
    STATE.started.append(_install_from_env(environ, at_startup))
    return STATE.started[0]


def _install_from_env(environ, at_startup):
    environ = os.environ if environ is None else environ
    from tf_mpt import config as _config  # no TensorFlow import
    try:
        config = _config.Config.from_env(environ)
    except ValueError as error:
        if not _switched_on(_config, environ):
            # tf_mpt is off: a bad setting of a feature nobody turned on stops nothing
            sys.stderr.write(f"tf_mpt: WARNING: {error} (ignored: tf_mpt is off)\n")
            return False
        sys.stderr.write(f"tf_mpt: {error}\n")
        sys.stderr.flush()
        if at_startup:
            os._exit(2)  # pylint: disable=protected-access
        raise SystemExit(2) from None
    if not (config.enable or config.graph_rewrite or config.loss_scaling):
        return False  # switches set, but all to off
    _show_log_lines()
    if "tensorflow" in sys.modules:
        _enable(config)
    else:
        finder = _import_hooks.AfterImport(_WATCHED, _after_import(config),
                                           prefix="tf_mpt.",
                                           before=_before_import(config)).install()
        _patches.record("<start-up import hook>", finder.remove)
    return True


def _switched_on(config_module, environ):
    """Whether a TF_MPT_ENABLE / GRAPH_REWRITE / LOSS_SCALING switch is on; a bad switch value
    counts as on (it stops the script)."""
    try:
        return config_module.any_switch_on(environ)
    except ValueError:
        return True


def _show_log_lines():
    """The automatic path's INFO lines (configuration, rewrite summaries) go to stderr,
    unless the script configures the 'tf_mpt' logger itself."""
    logger = logging.getLogger("tf_mpt")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("tf_mpt: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _enable(config, finished=None):
    """Enables the automatic path; any failure leaves the script in float32 with a warning.

    When a tf_mpt module imported tensorflow (the script imported tf_mpt first), that module
    is still half-imported: enabling waits until its import has finished (`_after_import`)."""
    if _initializing_tf_mpt_modules(finished):
        STATE.deferred_enable.append(config)
        return
    try:
        from tf_mpt.automatic import switch as _autoenable  # pylint: disable=g-import-not-at-top
        _autoenable.enable(config)
    except Exception as error:  # pylint: disable=broad-except
        logging.getLogger("tf_mpt").warning(
            "tf_mpt could not enable mixed precision (%s: %s); the script runs in float32.",
            type(error).__name__, error)


def _initializing_tf_mpt_modules(finished=None):
    """tf_mpt modules whose import is under way (their code has not finished running), but
    `finished` (a module whose code has just run: importlib marks it a moment later)."""
    return [name for name, module in list(sys.modules.items())
            if (name == "tf_mpt" or name.startswith("tf_mpt.")) and name != finished
            and getattr(getattr(module, "__spec__", None), "_initializing", False)]


_WATCHED = ("tensorflow", "keras", "tf_keras")


def _before_import(config):
    """What runs as the script starts importing tensorflow: the Grappler optimizer's compile
    (a TF1 script's first run) and the dispatch check's child start, beside the script's own
    import (never raises)."""

    def starting(name):
        if name == "tensorflow":
            # pylint: disable=g-import-not-at-top
            from tf_mpt.automatic.native import beside_import
            from tf_mpt.costs import dispatch as _dispatch
            beside_import.start(config, config.cache_directory)
            _dispatch.start_beside_import(config, compiling=beside_import.compiling())
    return starting


def _after_import(config):
    """What runs right after `name` finishes importing: enable after tensorflow (or after the
    tf_mpt module that imported tensorflow, once no tf_mpt module is half-imported); Keras's
    policy after keras or tf_keras (a script that imports keras first imports tensorflow
    from inside keras's import)."""

    def done(name):
        if name == "tensorflow":
            _enable(config)
            return
        if name.startswith("tf_mpt."):
            if STATE.deferred_enable:  # _enable defers it again while one is half-imported
                _enable(STATE.deferred_enable.pop(), finished=name)
            return
        # loaded by _enable; absent if tensorflow is not imported yet or enabling failed
        keras = sys.modules.get("tf_mpt.automatic.keras")
        if keras is not None:
            keras.keras_imported(name)

    return done
