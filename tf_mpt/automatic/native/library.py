"""Builds and loads tf_mpt's Grappler optimizer (`tf_mpt/automatic/native/session_rewrite.cc`).

The library is compiled at first use against the installed TensorFlow (its headers and
`tf.sysconfig` compile and link flags) with the C++ compiler in $CXX (default g++), and cached
in TF_MPT_CACHE_DIR (default: $XDG_CACHE_HOME/tf_mpt or ~/.cache/tf_mpt) under a key made of
the source, TensorFlow's version and flags and the compiler's version: a TensorFlow upgrade
builds a new one, a second process waits for the first one's build (file lock) and reuses it.
Loaded once per process (Grappler's registry accepts one "TfMpt").

`load(cache_dir)` returns the ctypes library or raises NativeUnavailable saying why; the
caller falls back to the shadow-copy path with one warning.
"""

import ctypes
import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading

import tensorflow as tf

_log = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "session_rewrite.cc")
PROTOCOL_VERSION = 1
_BUILD_TIMEOUT_SECONDS = 600

SINK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
REWRITER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, SINK, ctypes.c_void_p)

_lock = threading.Lock()
_library = None  # the loaded ctypes.CDLL
_failure = None  # NativeUnavailable of the first failed attempt (not retried)


class NativeUnavailable(RuntimeError):
    """The native optimizer could not be built or loaded (the message says why)."""


def default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tf_mpt")


def _compiler():
    return os.environ.get("CXX") or "g++"


def _compiler_version(compiler):
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        raise NativeUnavailable(
            f"no C++ compiler: running {compiler!r} failed ({error}). Install g++ (or set CXX "
            "to a C++17 compiler)") from error
    if done.returncode != 0:
        raise NativeUnavailable(f"{compiler} --version exited with {done.returncode}")
    return (done.stdout.splitlines() or [""])[0]


def _build_command(compiler, output):
    library_dir = os.path.dirname(tf.__file__)
    return ([compiler, "-shared", "-fPIC", "-O2", "-w"] + tf.sysconfig.get_compile_flags()
            + [SOURCE, "-o", output] + tf.sysconfig.get_link_flags()
            + [f"-Wl,-rpath,{library_dir}"])


def library_path(cache_dir=None):
    """Where the library for this TensorFlow and compiler is (or will be) cached."""
    compiler = _compiler()
    with open(SOURCE, "rb") as source:
        key = hashlib.sha256(source.read())
    key.update(" ".join([tf.__version__, tf.__git_version__, _compiler_version(compiler),
                         sys.platform] + _build_command(compiler, "OUT")).encode())
    return os.path.join(cache_dir or default_cache_dir(),
                        f"session_rewrite-{tf.__version__}-{key.hexdigest()[:16]}.so")


def _build(path):
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise NativeUnavailable(
            f"cannot create the cache directory {directory} ({error}); set TF_MPT_CACHE_DIR "
            "to a writable directory") from error
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if os.path.exists(path):
            return
        handle, partial = tempfile.mkstemp(suffix=".so", dir=directory)
        os.close(handle)
        command = _build_command(_compiler(), partial)
        _log.info("building tf_mpt's Grappler optimizer (once per TensorFlow version): %s",
                  " ".join(command))
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=_BUILD_TIMEOUT_SECONDS, check=False)
            if done.returncode != 0:
                raise NativeUnavailable(
                    f"compiling {SOURCE} failed (exit {done.returncode}): "
                    f"{done.stderr.strip()[-800:]}")
            os.replace(partial, path)
        except subprocess.TimeoutExpired as error:
            raise NativeUnavailable(
                f"compiling {SOURCE} took over {_BUILD_TIMEOUT_SECONDS} s") from error
        finally:
            if os.path.exists(partial):
                os.remove(partial)


def load(cache_dir=None):
    """The loaded library (built first if needed); raises NativeUnavailable saying why."""
    global _library, _failure
    with _lock:
        if _library is not None:
            return _library
        if _failure is not None:
            raise _failure
        try:
            path = library_path(cache_dir)
            if not os.path.exists(path):
                _build(path)
            try:
                library = ctypes.CDLL(path)
            except OSError as error:
                raise NativeUnavailable(f"loading {path} failed: {error}") from error
            library.tf_mpt_protocol_version.restype = ctypes.c_int
            if library.tf_mpt_protocol_version() != PROTOCOL_VERSION:
                raise NativeUnavailable(f"{path} speaks protocol "
                                        f"{library.tf_mpt_protocol_version()}, expected "
                                        f"{PROTOCOL_VERSION}")
            library.tf_mpt_set_rewriter.argtypes = [REWRITER]
            library.tf_mpt_set_rewriter.restype = None
        except NativeUnavailable as error:
            _failure = error
            raise
        _library = library
        return library

