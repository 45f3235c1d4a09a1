"""Builds, caches and loads tf_mpt's Grappler optimizer (`session_rewrite.cc` beside this file).

The library is compiled at first use against the installed TensorFlow (its headers and
`tf.sysconfig` compile and link flags) with the C++ compiler in $CXX (default g++; flags
allowed, e.g. CXX="g++ -std=c++17"), and cached in TF_MPT_CACHE_DIR (default:
$XDG_CACHE_HOME/tf_mpt or ~/.cache/tf_mpt) under a key made of the source, TensorFlow's
version and flags and the compiler's version: a TensorFlow upgrade builds a new one, a second
process waits for the first one's build (file lock) and reuses it. Loaded once per process
(Grappler's registry accepts one "TfMpt").

A cached library is loaded only when it is safe to run, since its constructor runs in this
process:

    directory  owned by this user, not writable by group or others (else: build in a
               private temporary directory for this process, removed once the library is
               loaded; one WARNING saying why and how to make the cache usable)
    file       a regular file owned by this user, not writable by group or others
    contents   the SHA-256 written beside it (`<library>.sha256`) when it was built; a
               truncated or half-written file (disk full, a crash before the data reached
               the disk) does not match and is rebuilt

The build writes to a temporary file, fsyncs it and renames it into place, then writes the
checksum the same way; the lock file is opened without following symlinks. A compiler that
is interrupted or times out is killed with its process group.

`load(cache_dir)` returns the ctypes library or raises NativeUnavailable saying why; the
caller falls back to the shadow-copy path with one warning. `build_early(cache_dir)` starts the
build in a background thread (the automatic path, when the script names TF1 Sessions): its
compile (~4 s on a Zen 4 core, TensorFlow's headers parsed) then runs beside the script's own
graph building and the first rewrite's measurements, and `load` waits for what is left of it.
A compiler still running at the process's exit is killed.
"""

import atexit
import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

import tensorflow as tf

from tf_mpt import config as _config
from tf_mpt._process.state import STATE
from tf_mpt.automatic.native import beside_import as _beside_import

_log = logging.getLogger(__name__)

SOURCE = _beside_import.SOURCE
PROTOCOL_VERSION = 1
_BUILD_TIMEOUT_SECONDS = 600
_PARTIAL_PREFIX = ".tf_mpt-build-"
_CHECKSUM_SUFFIX = ".sha256"
# Builds for other TensorFlow versions, compilers or environments (a venv's include path is
# in the key) unused this long are removed when a new one is built: each venv that ran
# tf_mpt left one (~30 KB), and nothing else ever removed them. A removed one that is still
# wanted is built again (seconds).
_UNUSED_DAYS = 30

SINK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
REWRITER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, SINK, ctypes.c_void_p)


class NativeUnavailable(RuntimeError):
    """The native optimizer could not be built or loaded (the message says why)."""


def _compiler():
    """The compiler command as a list: $CXX split like a shell would (default g++)."""
    try:
        return _beside_import.compiler()
    except ValueError as error:
        raise NativeUnavailable(str(error)) from error


def _compiler_version(compiler):
    try:
        done = subprocess.run(compiler + ["--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        raise NativeUnavailable(
            f"no C++ compiler: running {' '.join(compiler)!r} failed ({error}). Install g++ "
            "(or set CXX to a C++17 compiler)") from error
    if done.returncode != 0:
        raise NativeUnavailable(f"{' '.join(compiler)} --version exited with {done.returncode}")
    return (done.stdout.splitlines() or [""])[0]


def _build_command(compiler, output):
    return _beside_import.command(compiler, output, tf.sysconfig.get_compile_flags(),
                                  tf.sysconfig.get_link_flags(), os.path.dirname(tf.__file__))


def library_path(cache_dir=None):
    """Where the library for this TensorFlow and compiler is (or will be) cached."""
    compiler = _compiler()
    with open(SOURCE, "rb") as source:
        key = hashlib.sha256(source.read())
    key.update(" ".join([tf.__version__, tf.__git_version__, _compiler_version(compiler),
                         sys.platform] + _build_command(compiler, "OUT")).encode())
    return os.path.join(cache_dir or _config.default_cache_dir(),
                        f"session_rewrite-{tf.__version__}-{key.hexdigest()[:16]}.so")


# --- trust: what may be loaded ----------------------------------------------------------------

def _unsafe_because(status, what):
    """Why a file or directory with this os.stat_result is not safe to load from, or None."""
    if status.st_uid != os.geteuid():
        return f"{what} is owned by uid {status.st_uid}, not this user (uid {os.geteuid()})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by others (mode {stat.filemode(status.st_mode)})"
    return None


def _directory_unsafe_because(directory):
    """Creates `directory` (mode 0700) if missing; why it is unsafe to cache in, or None."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        status = os.stat(directory)
    except OSError as error:
        return f"cannot be created or read ({error})"
    if not stat.S_ISDIR(status.st_mode):
        return "is not a directory"
    return _unsafe_because(status, "it")


def _file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _valid(path):
    """(True, None) if `path` is a library this user built, intact; else (False, why)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return False, "not built yet"
    if not stat.S_ISREG(status.st_mode):
        return False, "not a regular file"
    why = _unsafe_because(status, "the cached library")
    if why is not None:
        return False, why
    try:
        checksum_status = os.lstat(path + _CHECKSUM_SUFFIX)
        if (not stat.S_ISREG(checksum_status.st_mode)
                or _unsafe_because(checksum_status, "its checksum file")):
            return False, "its checksum file is not this user's"
        with open(path + _CHECKSUM_SUFFIX, encoding="ascii") as handle:
            expected = handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return False, "no checksum beside it"
    if _file_digest(path) != expected:
        return False, (f"its contents ({status.st_size} bytes) do not match the checksum "
                       "written when it was built (truncated or half-written)")
    return True, None


# --- building -----------------------------------------------------------------------------------

def _fsync_directory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path, data):
    """Writes `data` to `path` through a temporary file, fsync and rename."""
    directory = os.path.dirname(path)
    handle, partial = tempfile.mkstemp(prefix=_PARTIAL_PREFIX, dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _remove_stale_partials(directory):
    """Temporary files of builds that were killed (older than a build may take)."""
    cutoff = time.time() - 2 * _BUILD_TIMEOUT_SECONDS
    for name in os.listdir(directory):
        if not name.startswith(_PARTIAL_PREFIX):
            continue
        full = os.path.join(directory, name)
        try:
            status = os.lstat(full)
            if status.st_uid == os.geteuid() and status.st_mtime < cutoff:
                os.remove(full)
        except OSError:
            continue


def _remove_unused_builds(directory, keep):
    """This user's other libraries in `directory` (and their checksums) neither written nor
    read for _UNUSED_DAYS days; `keep` (the one being built) stays. Their lock files stay
    too: a process may hold one."""
    cutoff = time.time() - _UNUSED_DAYS * 86400
    for name in os.listdir(directory):
        full = os.path.join(directory, name)
        if not (name.startswith("session_rewrite-") and name.endswith(".so")) or \
                full == keep:
            continue
        try:
            status = os.lstat(full)
            if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or \
                    max(status.st_mtime, status.st_atime) >= cutoff:
                continue
            os.remove(full)
            if os.path.lexists(full + _CHECKSUM_SUFFIX):
                os.remove(full + _CHECKSUM_SUFFIX)
        except OSError:
            continue


_COMPILING = set()  # compiler processes running now (killed at exit: build_early's)


def _run_compiler(command):
    """Runs the compiler in its own process group; kills the group if this is interrupted
    (KeyboardInterrupt, SystemExit) or the build times out."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    _COMPILING.add(process)
    try:
        _, stderr = process.communicate(timeout=_BUILD_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as error:
        _kill_group(process)
        raise NativeUnavailable(
            f"compiling {SOURCE} took over {_BUILD_TIMEOUT_SECONDS} s") from error
    except BaseException:
        _kill_group(process)
        raise
    finally:
        _COMPILING.discard(process)
    return process.returncode, stderr


def _kill_compilers():
    """At exit: a build that nothing waited for (build_early's) does not outlive the process
    (its partial file is removed by a later build, _remove_stale_partials)."""
    for process in list(_COMPILING):
        _kill_group(process)


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    process.wait()


def _open_lock(path):
    """The lock file beside `path`, opened without following a symlink or truncating."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path + ".lock", flags, 0o600)
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid():
        os.close(fd)
        raise NativeUnavailable(f"{path}.lock is not a regular file of this user")
    return fd


def _build(path):
    """Makes `path` a valid library (built, or rebuilt if the cached one is not valid)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process may be building it right now
        valid, why = _valid(path)
        if valid:
            return
        if why != "not built yet":
            _log.warning("rebuilding tf_mpt's Grappler optimizer %s: %s", path, why)
            for stale in (path, path + _CHECKSUM_SUFFIX):
                if os.path.lexists(stale):
                    os.remove(stale)
        _remove_stale_partials(directory)
        handle, partial = tempfile.mkstemp(prefix=_PARTIAL_PREFIX, suffix=".so", dir=directory)
        os.close(handle)
        command = _build_command(_compiler(), partial)
        try:
            if _beside_import.take(command, partial, _BUILD_TIMEOUT_SECONDS):
                _log.info("built tf_mpt's Grappler optimizer (once per TensorFlow version) "
                          "beside TensorFlow's import: %s", " ".join(command))
                returncode, stderr = 0, ""
            else:
                _log.info("building tf_mpt's Grappler optimizer (once per TensorFlow "
                          "version): %s", " ".join(command))
                returncode, stderr = _run_compiler(command)
            if returncode != 0:
                raise NativeUnavailable(
                    f"compiling {SOURCE} failed (exit {returncode}): {stderr.strip()[-800:]}")
            os.chmod(partial, 0o755)
            with open(partial, "rb+") as built:
                os.fsync(built.fileno())
            digest = _file_digest(partial)
            os.replace(partial, path)
            _write_durably(path + _CHECKSUM_SUFFIX, digest.encode("ascii"))
            _fsync_directory(directory)
            _remove_unused_builds(directory, path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    finally:
        os.close(fd)


def _fix_for(why):
    """What makes a cache directory usable again, for the reason `why` it is not."""
    if "writable by others" in why:
        return "`chmod go-w` it, or set TF_MPT_CACHE_DIR to a directory of your own"
    return "set TF_MPT_CACHE_DIR to a directory of your own, not writable by others"


def _built_library(cache_dir):
    """(path of a valid library, None) when it is in the cache (safe to use), else (path,
    the private temporary directory of this process it was built in: the caller removes it
    once the library is loaded; one WARNING saying why and how to make the cache usable)."""
    path = library_path(cache_dir)
    directory = os.path.dirname(path)
    why = _directory_unsafe_because(directory)
    if why is None:
        try:
            _build(path)
            return path, None
        except OSError as error:
            why = f"cannot be used ({type(error).__name__}: {error})"
    private = tempfile.mkdtemp(prefix="tf_mpt-native-")
    _log.warning("tf_mpt's cache directory %s %s; its Grappler optimizer is built in a private "
                 "temporary directory for this process instead, removed once loaded, so every "
                 "process builds it again (~6 s): to build it once, %s.",
                 directory, why, _fix_for(why))
    private_path = os.path.join(private, os.path.basename(path))
    try:
        _build(private_path)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return private_path, private


def _open(path):
    try:
        library = ctypes.CDLL(path)
    except OSError as error:
        raise NativeUnavailable(f"loading {path} failed: {error}") from error
    library.tf_mpt_protocol_version.restype = ctypes.c_int
    if library.tf_mpt_protocol_version() != PROTOCOL_VERSION:
        raise NativeUnavailable(f"{path} speaks protocol {library.tf_mpt_protocol_version()}, "
                                f"expected {PROTOCOL_VERSION}")
    library.tf_mpt_set_rewriter.argtypes = [REWRITER]
    library.tf_mpt_set_rewriter.restype = None
    return library


class _Early:
    """A build started before any Session asked (build_early): its thread and its failure."""

    def __init__(self, cache_dir):
        self.cache_dir = cache_dir
        self.failure = None
        self.thread = threading.Thread(target=self._run, name="tf_mpt-native-build",
                                       daemon=True)

    def _run(self):
        try:
            path = library_path(self.cache_dir)
            # only into a usable cache: a private build is this process's, made by load()
            if _directory_unsafe_because(os.path.dirname(path)) is None and \
                    not _valid(path)[0]:
                _build(path)
        except NativeUnavailable as error:  # no compiler, a failed compile: load() says so
            self.failure = error
        except Exception as error:  # pylint: disable=broad-except
            # anything else: load() builds again as it would have without this
            _log.debug("tf_mpt's early build of its Grappler optimizer failed: %s", error)


def build_early(cache_dir=None):
    """Starts building the library now, in a background thread (the compiler is a child
    process: the thread only waits for it), where it is neither loaded nor being built.
    Never raises; `load` waits for it."""
    try:
        with STATE.native_lock:
            if STATE.native_library is not None or STATE.native_failure is not None or \
                    STATE.native_early is not None:
                return
            STATE.native_early = _Early(cache_dir)
            atexit.register(_kill_compilers)
            STATE.native_early.thread.start()
    except Exception as error:  # pylint: disable=broad-except
        _log.debug("tf_mpt did not start building its Grappler optimizer early: %s", error)


def _wait_for_early():
    """Joins build_early's thread, if one ran; raises the NativeUnavailable it met."""
    early = STATE.native_early
    if early is None:
        return
    early.thread.join()
    STATE.native_early = None
    if early.failure is not None:
        raise early.failure


def load(cache_dir=None):
    """The loaded library (built first if needed); raises NativeUnavailable saying why."""
    with STATE.native_lock:
        if STATE.native_library is not None:
            return STATE.native_library
        if STATE.native_failure is not None:
            raise STATE.native_failure
        try:
            _wait_for_early()
        except NativeUnavailable as error:
            STATE.native_failure = error
            raise
        private = None
        try:
            path, private = _built_library(cache_dir)
            library = _open(path)
        except NativeUnavailable as error:
            STATE.native_failure = error
            raise
        except OSError as error:
            STATE.native_failure = NativeUnavailable(
                f"building it failed ({type(error).__name__}: {error})")
            raise STATE.native_failure from error
        finally:
            # a loaded library stays mapped after its file is gone: nothing is left behind
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)
        STATE.native_library = library
        return library


def loaded():
    """The loaded library, or None if none is loaded in this process."""
    return STATE.native_library
