"""The Grappler optimizer's compile, started as the script starts importing TensorFlow.

No TensorFlow import: this runs from the start-up import hook, before TensorFlow's own import
(~2 s of a Zen 4 core, several on a slower CPU), so that the compile (~4 s of a Zen 4 core,
nearly all of it parsing TensorFlow's headers) runs beside that import instead of after it.
The command is `library`'s, with TensorFlow's compile and link flags as its wheel sets them
(`GUESSED_COMPILE_FLAGS`, its directory found without importing it); the output goes to a
private temporary directory. Once TensorFlow is imported, `library._build` compares the
command it would run with this one: the same (the flags were right), it takes the file this
compile wrote (and checksums it as its own build); else it compiles as before and this one is
dropped. A compile nothing takes is killed at the process's exit.

Started only where the first-run build is certain to be wanted: the automatic path on, graph
rewriting on with the Grappler path, a half type for this process, the main script names
TF1 Sessions (`script_names_sessions`), and no library for this TensorFlow version in the
cache directory yet. Never raises.
"""

import atexit
import glob
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "session_rewrite.cc")
# -O0: the shim only copies buffers and calls back (protobuf's own code, built optimised, does
# the copying); TensorFlow's headers take the time (on a Zen 4 core: -O2 8.0 s, -O1 4.5 s,
# -O0 4.1 s wall, ~3.2 s of it parsing the headers)
OPTIONS = ["-shared", "-fPIC", "-O0", "-w"]
# tf.sysconfig.get_compile_flags() of TensorFlow's Linux wheels, without the -I of its
# include directory (checked against the real ones before the result is used)
GUESSED_COMPILE_FLAGS = ["-D_GLIBCXX_USE_CXX11_ABI=1", "--std=c++17",
                         "-DEIGEN_MAX_ALIGN_BYTES=64"]
FRAMEWORK = "libtensorflow_framework.so.2"
_SESSION_WORDS = (b"Session", b"Estimator", b"estimator")
_SCRIPT_BYTES = 1 << 20

_STARTED = {}  # "build": (command with OUTPUT, output path, process, directory)
OUTPUT = "<output>"  # (the output's place in a command, for comparing two of them)


def compiler():
    """The compiler command as a list: $CXX split like a shell would (default g++); raises
    ValueError saying what and the fix where it cannot be parsed or names nothing."""
    text = os.environ.get("CXX") or "g++"
    try:
        command = shlex.split(text)
    except ValueError as error:
        raise ValueError(f"CXX={text!r} cannot be parsed ({error}); set CXX to a C++17 "
                         "compiler and its flags, e.g. CXX='g++ -std=c++17'") from error
    if not command:
        raise ValueError(f"CXX={text!r} names no compiler; set CXX to a C++17 compiler")
    return command


def command(compiler_command, output, compile_flags, link_flags, library_dir):
    """The compile command of the optimizer (library's and this module's)."""
    return (compiler_command + OPTIONS + list(compile_flags) + [SOURCE, "-o", output]
            + list(link_flags) + [f"-Wl,-rpath,{library_dir}"])


def script_names_sessions():
    """Whether the main script's text names a TF1 Session (Session, MonitoredTrainingSession,
    ...) or an Estimator: a hint that its optimizer will be wanted, read from the script's
    first MiB."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else None)
    if not path or not path.endswith(".py"):
        return False
    try:
        with open(path, "rb") as script:
            text = script.read(_SCRIPT_BYTES)
    except OSError:
        return False
    return any(word in text for word in _SESSION_WORDS)


def _tensorflow_dir():
    spec = importlib.util.find_spec("tensorflow")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return locations[0] if locations else None


def _built_already(cache_dir):
    """A library of this TensorFlow version is in the cache (its key needs TensorFlow's
    import: any build of the version counts, and at worst the compile starts after it)."""
    from tf_mpt.costs import op_costs  # pylint: disable=import-outside-toplevel
    return any(glob.glob(os.path.join(cache_dir, f"session_rewrite-{glob.escape(v)}-*.so"))
               for v in op_costs.installed_tensorflow_versions())


def start(config, cache_dir):
    """Starts the compile (see the module's docstring for where); never raises."""
    try:
        if "build" in _STARTED or not config.graph_rewrite or \
                config.session_rewrite != "grappler" or not script_names_sessions():
            return
        from tf_mpt import _cpu  # pylint: disable=import-outside-toplevel
        if config.resolve_dtype(_cpu.gpu_device_present(),
                                _cpu.has_native_bfloat16(_cpu.cpu_flags(config))) is None:
            return
        library_dir = _tensorflow_dir()
        if library_dir is None or _built_already(cache_dir):
            return
        directory = tempfile.mkdtemp(prefix="tf_mpt_build_")
        output = os.path.join(directory, "session_rewrite.so")
        args = command(compiler(), output,
                       [f"-I{os.path.join(library_dir, 'include')}"] + GUESSED_COMPILE_FLAGS,
                       [f"-L{library_dir}", f"-l:{FRAMEWORK}"], library_dir)
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        _STARTED["build"] = ([OUTPUT if a == output else a for a in args], output, process,
                             directory)
        atexit.register(drop)
    except Exception:  # pylint: disable=broad-except
        drop()  # the compile starts once TensorFlow is imported, as without this


def compiling():
    """Whether a compile started beside the import is under way (or done, not yet taken)."""
    return "build" in _STARTED


def take(real_command, partial, timeout):
    """Where the compile started beside the import ran `real_command` (its output `partial`)
    and succeeded: copies what it wrote to `partial` and returns True. Else False (nothing
    started, another command, a failure): the caller compiles. Never raises."""
    started = _STARTED.get("build")
    if started is None:
        return False
    try:
        args, output, process, _ = started
        if [OUTPUT if a == partial else a for a in real_command] != args:
            return False
        if process.wait(timeout=timeout) != 0 or not os.path.isfile(output):
            return False
        shutil.copyfile(output, partial)
        return True
    except Exception:  # pylint: disable=broad-except
        return False
    finally:
        drop()


def drop():
    """Stops the compile started beside the import, if it runs, and removes its directory."""
    started = _STARTED.pop("build", None)
    if started is None:
        return
    _, _, process, directory = started
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        process.wait()
    shutil.rmtree(directory, ignore_errors=True)
