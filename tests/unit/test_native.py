"""Building tf_mpt's Grappler optimizer: failures say what and how to fix it, and leave no
half-written library behind (the successful build and its cache are tested in
tests/integration/test_session_patterns.py)."""

import os
import stat
import time

import pytest

from tf_mpt.automatic.native import beside_import as _beside_import
from tf_mpt.automatic.native import library as _native


@pytest.fixture(autouse=True)
def _private_builds_in_tmp_path(tmp_path, monkeypatch):
    """The private builds these tests make (and tempfile's other files) go under tmp_path."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(_native.tempfile, "tempdir", str(temporary))


def _fake_compiler(tmp_path, body):
    script = tmp_path / "fake-c++"
    script.write_text("#!/bin/sh\n"
                      'case " $* " in *" --version "*) echo "fake-c++ 1.0"; exit 0;; esac\n'
                      + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_missing_compiler_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(_native.NativeUnavailable,
                       match=r"no C\+\+ compiler: running '.*no-such-compiler' failed .*"
                             r"Install g\+\+ \(or set CXX"):
        _native.library_path(str(tmp_path))


def test_a_failing_compile_reports_its_error_and_leaves_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, 'echo "error: no headers" >&2\nexit 3\n'))
    cache = tmp_path / "cache"
    path = _native.library_path(str(cache))
    assert os.path.dirname(path) == str(cache)
    with pytest.raises(_native.NativeUnavailable,
                       match=r"compiling .*session_rewrite\.cc failed \(exit 3\): "
                             r"error: no headers"):
        _native._build(path)  # pylint: disable=protected-access
    assert [name for name in os.listdir(cache) if name.endswith(".so")] == []


def test_the_cache_key_follows_the_compiler(tmp_path, monkeypatch):
    default = _native.library_path(str(tmp_path))
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, "exit 1\n"))
    assert _native.library_path(str(tmp_path)) != default


def _building_compiler(tmp_path):
    """A fake compiler that 'builds' by writing a few bytes to the -o file and counts its
    builds in tmp_path/builds."""
    return _fake_compiler(tmp_path, 'while [ "$1" != -o ]; do shift; done\n'
                                    'echo built > "$2"\n'
                                    f'echo x >> {tmp_path / "builds"}\n')


def _builds(tmp_path):
    path = tmp_path / "builds"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_compiler_with_flags_in_cxx_is_used_with_its_flags(tmp_path, monkeypatch):
    compiler = _building_compiler(tmp_path)
    monkeypatch.setenv("CXX", f"{compiler} -std=c++17")
    path = _native.library_path(str(tmp_path / "cache"))
    assert _native._build_command(_native._compiler(), "OUT")[:2] == [compiler, "-std=c++17"]
    _native._build(path)
    assert _builds(tmp_path) == 1 and _native._valid(path) == (True, None)


def test_a_truncated_or_unchecked_library_is_rebuilt_never_loaded(tmp_path, monkeypatch,
                                                                   caplog):
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    path = _native.library_path(str(tmp_path / "cache"))
    os.makedirs(os.path.dirname(path), mode=0o700)
    _native._build(path)
    _native._build(path)  # cached: no second build
    assert _builds(tmp_path) == 1
    with open(path, "r+b") as handle:  # a crash before the data reached the disk
        handle.truncate(4)
    valid, why = _native._valid(path)
    assert not valid and "do not match the checksum" in why
    _native._build(path)
    assert _builds(tmp_path) == 2 and _native._valid(path) == (True, None)
    assert "rebuilding tf_mpt's Grappler optimizer" in caplog.text
    os.remove(path + ".sha256")  # a library from before checksums, or a planted one
    assert _native._valid(path) == (False, "no checksum beside it")
    _native._build(path)
    assert _builds(tmp_path) == 3
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".tf_mpt-build-")] == []


def test_a_world_writable_cache_directory_is_not_trusted(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    assert "writable by others" in _native._directory_unsafe_because(str(cache))
    built, private = _native._built_library(str(cache))
    assert os.path.dirname(built) == private != str(cache)
    assert _native._valid(built) == (True, None)
    assert os.listdir(cache) == []  # nothing planted there is ever used
    assert caplog.text.count("built in a private temporary directory") == 1
    assert "writable by others" in caplog.text
    assert "to build it once, `chmod go-w` it" in caplog.text


def test_a_cache_owned_by_another_user_is_not_trusted(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user (os.chown)")
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    cache = tmp_path / "planted"
    cache.mkdir(mode=0o755)
    os.chown(cache, 65534, 65534)  # nobody
    assert "owned by uid 65534" in _native._directory_unsafe_because(str(cache))
    path = _native.library_path(str(tmp_path / "mine"))
    os.makedirs(os.path.dirname(path), mode=0o700)
    _native._build(path)
    os.chown(path, 65534, 65534)  # a library file of another user in my directory
    assert not _native._valid(path)[0] and "owned by uid 65534" in _native._valid(path)[1]
    assert os.path.dirname(_native._built_library(str(cache))[0]) != str(cache)


def test_a_planted_lock_symlink_is_not_followed(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    cache = tmp_path / "cache"
    path = _native.library_path(str(cache))
    cache.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, path + ".lock")
    built, _ = _native._built_library(str(cache))
    assert victim.read_text() == "precious"
    assert os.path.dirname(built) != str(cache) and _native._valid(built) == (True, None)
    assert "built in a private temporary directory" in caplog.text


def test_an_unusable_cache_directory_falls_back_to_a_private_build(tmp_path, monkeypatch,
                                                                  caplog):
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    built, _ = _native._built_library(str(blocker / "sub"))
    assert _native._valid(built) == (True, None)
    assert "a-file/sub cannot be created or read" in caplog.text
    assert "to build it once, set TF_MPT_CACHE_DIR to a directory of your own" in caplog.text


def test_a_build_that_times_out_is_killed_and_leaves_no_file(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, f"echo $$ > {pid_file}\nexec sleep 60\n"))
    monkeypatch.setattr(_native, "_BUILD_TIMEOUT_SECONDS", 1)
    cache = tmp_path / "cache"
    path = _native.library_path(str(cache))
    cache.mkdir(mode=0o700)
    with pytest.raises(_native.NativeUnavailable, match=r"took over 1 s"):
        _native._build(path)
    assert not os.path.exists(f"/proc/{pid_file.read_text().strip()}")  # no orphan compiler
    assert [n for n in os.listdir(cache) if n.endswith(".so")] == []


def test_a_read_only_cache_directory_falls_back_to_a_private_build(tmp_path, monkeypatch,
                                                                  caplog):
    """A cache directory this user cannot write (as root every directory is writable, so
    the lock's open is made to fail as it does for a read-only directory)."""
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    cache = tmp_path / "read-only"
    cache.mkdir(mode=0o500)
    real_open = os.open

    def open_(path, *args, **kwargs):
        if str(path).startswith(str(cache)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(_native.os, "open", open_)
    built, _ = _native._built_library(str(cache))
    assert os.path.dirname(built) != str(cache) and _native._valid(built) == (True, None)
    assert caplog.text.count("built in a private temporary directory") == 1
    assert "PermissionError" in caplog.text


def _private_builds(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith("tf_mpt-native-"))


def test_a_private_build_is_removed_once_loaded(tmp_path, monkeypatch, caplog):
    """The library is loaded from the private directory, which is then gone: a process that
    cannot use its cache leaves no build behind in the temporary directory."""
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    temporary = tmp_path / "tmp"
    monkeypatch.setattr(_native.STATE, "native_library", None)
    monkeypatch.setattr(_native.STATE, "native_failure", None)
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    opened = []

    def open_(path):
        opened.append((path, os.path.isfile(path), _private_builds(temporary)))
        return "the library"
    monkeypatch.setattr(_native, "_open", open_)
    assert _native.load(str(cache)) == "the library"
    ((path, existed, during),) = opened
    assert existed and len(during) == 1 and path.startswith(str(temporary / during[0]))
    assert _private_builds(temporary) == []
    assert caplog.text.count("built in a private temporary directory") == 1


def test_a_private_build_that_fails_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, 'echo "error: no headers" >&2\nexit 3\n'))
    temporary = tmp_path / "tmp"
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.raises(_native.NativeUnavailable, match="failed \\(exit 3\\)"):
        _native._built_library(str(cache))
    assert _private_builds(temporary) == []


def test_a_new_build_removes_the_users_builds_unused_for_a_month(tmp_path, monkeypatch):
    """Each environment (TensorFlow, compiler, venv) builds its own library into the cache;
    one unused (neither written nor read) for _UNUSED_DAYS days is removed with its checksum
    when another is built. Recent ones, the lock files and other files stay."""
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    path = _native.library_path(str(tmp_path / "cache"))
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700)
    old = time.time() - (_native._UNUSED_DAYS + 1) * 86400  # pylint: disable=protected-access
    made = {}
    for name in ("session_rewrite-2.20.0-aaaa.so", "session_rewrite-2.20.0-bbbb.so",
                 "session_rewrite-2.20.0-aaaa.so.sha256", "session_rewrite-2.20.0-aaaa.so.lock",
                 "verdicts-bfloat16-cccc.json"):
        made[name] = os.path.join(directory, name)
        with open(made[name], "w") as handle:
            handle.write("x")
        os.utime(made[name], (old, old))
    recent = time.time() - 86400
    os.utime(made["session_rewrite-2.20.0-bbbb.so"], (recent, old))  # (read yesterday)
    _native._build(path)  # pylint: disable=protected-access
    assert _native._valid(path) == (True, None)  # pylint: disable=protected-access
    left = set(os.listdir(directory))
    assert "session_rewrite-2.20.0-aaaa.so" not in left
    assert "session_rewrite-2.20.0-aaaa.so.sha256" not in left
    assert {"session_rewrite-2.20.0-bbbb.so", "session_rewrite-2.20.0-aaaa.so.lock",
            "verdicts-bfloat16-cccc.json", os.path.basename(path)} <= left, left


# --- the build started early (build_early): beside the script, waited for by load ----------

@pytest.fixture
def fresh_state(monkeypatch):
    """No library loaded, failed or under way in this process (as at a script's start)."""
    for name in ("native_library", "native_failure", "native_early"):
        monkeypatch.setattr(_native.STATE, name, None)
    return _native.STATE


def _gated_compiler(tmp_path):
    """A building compiler that waits until tmp_path/gate exists (the test opens it)."""
    return _fake_compiler(tmp_path, f'while [ ! -e {tmp_path / "gate"} ]; do sleep 0.02; done\n'
                                    'while [ "$1" != -o ]; do shift; done\n'
                                    'echo built > "$2"\n'
                                    f'echo x >> {tmp_path / "builds"}\n')


def test_an_early_build_runs_in_the_background_and_is_waited_for_once(tmp_path, monkeypatch,
                                                                      fresh_state):
    monkeypatch.setenv("CXX", _gated_compiler(tmp_path))
    cache = str(tmp_path / "cache")
    _native.build_early(cache)
    early = fresh_state.native_early
    assert early is not None and early.thread.daemon
    _native.build_early(cache)  # a second call starts nothing more
    assert fresh_state.native_early is early
    path = _native.library_path(cache)
    assert _native._valid(path) == (False, "not built yet")  # returned before the build
    (tmp_path / "gate").touch()
    _native._wait_for_early()  # what load() does first
    assert fresh_state.native_early is None and _native._valid(path) == (True, None)
    assert _native._built_library(cache) == (path, None) and _builds(tmp_path) == 1


def test_an_early_build_that_fails_is_the_first_sessions_failure(tmp_path, monkeypatch,
                                                                  fresh_state):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    _native.build_early(str(tmp_path / "cache"))
    with pytest.raises(_native.NativeUnavailable, match=r"no C\+\+ compiler"):
        _native.load(str(tmp_path / "cache"))
    assert isinstance(fresh_state.native_failure, _native.NativeUnavailable)


def test_an_early_build_nothing_waited_for_is_killed_at_exit(tmp_path, monkeypatch,
                                                             fresh_state):
    monkeypatch.setenv("CXX", _gated_compiler(tmp_path))
    cache = tmp_path / "cache"
    _native.build_early(str(cache))
    early = fresh_state.native_early
    while not _native._COMPILING:  # the thread has started the compiler
        early.thread.join(0.02)
    _native._kill_compilers()  # what the exit runs
    early.thread.join()
    assert isinstance(early.failure, _native.NativeUnavailable)
    assert "failed (exit -9)" in str(early.failure)
    assert [name for name in os.listdir(cache) if name.endswith(".so")] == []
    assert _builds(tmp_path) == 0


# --- the compile started beside TensorFlow's import (native/beside_import.py) ---------------

def _enabled(**extra):
    import tf_mpt  # pylint: disable=import-outside-toplevel
    return tf_mpt.Config.from_env(dict(dict(TF_MPT_ENABLE="1", TF_MPT_DTYPE="bfloat16"),
                                       **extra))


@pytest.fixture
def beside(monkeypatch):
    """beside_import with a main script that names Sessions and nothing started yet."""
    monkeypatch.setattr(_beside_import, "_STARTED", {})
    monkeypatch.setattr(_beside_import, "script_names_sessions", lambda: True)
    yield _beside_import
    _beside_import.drop()


def test_the_guessed_flags_are_the_installed_tensorflows():
    """The command started before TensorFlow's import is the one library builds with once it
    is imported (else the early compile is dropped and the first run waits for a second)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    library_dir = os.path.dirname(tf.__file__)
    guessed = _beside_import.command(
        ["g++"], "OUT",
        [f"-I{os.path.join(library_dir, 'include')}"] + _beside_import.GUESSED_COMPILE_FLAGS,
        [f"-L{library_dir}", f"-l:{_beside_import.FRAMEWORK}"], library_dir)
    assert guessed == _native._build_command(["g++"], "OUT")


def test_the_compile_started_beside_the_import_is_what_the_build_takes(tmp_path, monkeypatch,
                                                                         beside):
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    cache = str(tmp_path / "cache")
    beside.start(_enabled(), cache)
    assert "build" in beside._STARTED  # pylint: disable=protected-access
    path = _native.library_path(cache)
    _native._build(path)
    assert _builds(tmp_path) == 1 and _native._valid(path) == (True, None)  # compiled once
    assert beside._STARTED == {}  # pylint: disable=protected-access


def test_a_compile_started_with_other_flags_is_dropped_and_the_build_compiles(
        tmp_path, monkeypatch, beside):
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    monkeypatch.setattr(beside, "GUESSED_COMPILE_FLAGS", ["--std=c++14"])
    beside.start(_enabled(), str(tmp_path / "cache"))
    _, _, process, directory = beside._STARTED["build"]  # pylint: disable=protected-access
    path = _native.library_path(str(tmp_path / "cache"))
    _native._build(path)
    assert _native._valid(path) == (True, None)
    assert _builds(tmp_path) == 2  # the early one, then the build's own
    assert process.poll() is not None and not os.path.exists(directory)


def test_a_failed_early_compile_is_not_taken(tmp_path, monkeypatch, beside):
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, "exit 1\n"))
    beside.start(_enabled(), str(tmp_path / "cache"))
    assert beside.take(["anything"], "OUT", 60) is False
    real = _native._build_command(_native._compiler(), str(tmp_path / "partial.so"))
    beside.start(_enabled(), str(tmp_path / "cache"))
    assert beside.take(real, str(tmp_path / "partial.so"), 60) is False
    assert not (tmp_path / "partial.so").exists()


@pytest.mark.parametrize("why, extra, names, built", [
    ("the script names no Session", {}, False, False),
    ("no graph rewrite", {"TF_MPT_GRAPH_REWRITE": "0"}, True, False),
    ("the copy path", {"TF_MPT_SESSION_REWRITE": "copy"}, True, False),
    ("no half type here", {"TF_MPT_DTYPE": "auto", "TF_MPT_CPU_FLAGS": "avx2"}, True, False),
    ("built already", {}, True, True)])
def test_no_compile_starts_beside_the_import_where_none_is_wanted(
        tmp_path, monkeypatch, beside, why, extra, names, built):
    monkeypatch.setenv("CXX", _building_compiler(tmp_path))
    monkeypatch.setattr(beside, "script_names_sessions", lambda: names)
    cache = tmp_path / "cache"
    cache.mkdir()
    if built:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        (cache / f"session_rewrite-{tf.__version__}-0123456789abcdef.so").write_text("x")
    beside.start(_enabled(**extra), str(cache))
    assert beside._STARTED == {}, why  # pylint: disable=protected-access
    assert _builds(tmp_path) == 0


@pytest.mark.parametrize("cxx, message", [
    ("g++ 'unterminated", r"CXX=\"g\+\+ 'unterminated\" cannot be parsed \(.*\); set CXX to a "
                          r"C\+\+17 compiler and its flags, e.g. CXX='g\+\+ -std=c\+\+17'"),
    ("  ", r"CXX='  ' names no compiler; set CXX to a C\+\+17 compiler")])
def test_a_bad_cxx_is_named_with_the_fix_and_starts_no_early_compile(
        cxx, message, tmp_path, monkeypatch, beside):
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(_native.NativeUnavailable, match=message):
        _native.library_path(str(tmp_path))
    beside.start(_enabled(), str(tmp_path / "cache"))  # never raises
    assert beside._STARTED == {}  # pylint: disable=protected-access
