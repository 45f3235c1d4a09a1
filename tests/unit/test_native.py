"""Building tf_mpt's Grappler optimizer: failures say what and how to fix it, and leave no
half-written library behind (the successful build and its cache are tested in
tests/integration/test_session_patterns.py)."""

import os
import stat

import pytest

from tf_mpt.automatic.native import library as _native


def _fake_compiler(tmp_path, body):
    script = tmp_path / "fake-c++"
    script.write_text("#!/bin/sh\n"
                      'if [ "$1" = --version ]; then echo "fake-c++ 1.0"; exit 0; fi\n' + body)
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


def test_an_unwritable_cache_directory_names_the_variable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(_native.NativeUnavailable,
                       match=r"cannot create the cache directory .*a-file/sub .*set "
                             r"TF_MPT_CACHE_DIR to a writable directory"):
        _native._build(str(blocker / "sub" / "x.so"))  # pylint: disable=protected-access
