"""tf-mpt's command-line conventions: --version, one spelling per choice (older ones still
accepted, said on stderr), documented exit codes, and docs/cli.md's flag and exit-code tables
made from the parser itself. Nothing here converts a model (test_cli*.py do)."""

import importlib.metadata
import os
import re

import pytest

from tf_mpt import __version__
from tf_mpt import cli

CLI_DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli.md")


def _section(marker):
    with open(CLI_DOC) as f:
        text = f.read()
    found = re.search(rf"<!-- {marker}:[^\n]*-->\n(.*?)\n<!-- /{marker} -->", text, re.S)
    assert found, f"docs/cli.md lost its {marker} markers"
    return found.group(1).splitlines()


def test_the_docs_flag_table_is_the_parsers():
    """Regenerate with: python -c "from tf_mpt import cli; print('\\n'.join(cli.flag_table()))"."""
    assert _section("flag-table") == cli.flag_table()


def test_the_docs_exit_codes_are_the_clis():
    assert _section("exit-codes") == cli.exit_code_table()
    assert sorted(cli.EXIT_CODES) == [0, 1, 2, 3, 4]
    assert len(set(cli.EXIT_CODES.values())) == len(cli.EXIT_CODES)


def test_every_flag_shown_has_help_and_one_spelling_per_choice():
    """Of the flags a command shows, none lacks help and no two set the same option (an
    older spelling is accepted, not shown)."""
    table = cli.flag_table()
    assert all(not row.endswith("|  |") for row in table[2:]), table
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if hasattr(a, "choices") and  # pylint: disable=W0212
                    isinstance(a.choices, dict))
    for name, sub in commands.choices.items():
        shown = [a.dest for a in sub._actions  # pylint: disable=protected-access
                 if a.option_strings and a.help != "==SUPPRESS==" and a.dest != "help"]
        assert len(shown) == len(set(shown)), (name, shown)
    for old in cli._OLD_SPELLINGS:  # pylint: disable=protected-access
        assert f"`{old}" not in "\n".join(table), old


def test_version_names_tf_mpt_and_tensorflow(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == cli.EXIT_OK
    out = capsys.readouterr().out.strip()
    tf_version = next(v for v in (_installed(n) for n in ("tensorflow-cpu", "tensorflow",
                                                         "tensorflow-intel", "tf-nightly"))
                      if v is not None)
    assert out == f"tf-mpt {__version__} (TensorFlow {tf_version})", out


def _installed(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("argv, expected", [
    (["convert", "a", "b", "--convert-variables"], {"variables": "half"}),
    (["convert", "a", "b", "--keep-variables"], {"variables": "float32"}),
    (["convert", "a", "b", "--keep-io-types"], {"keep_io_types": True}),
    (["convert", "a", "b", "--validate", "4"], {"validate": 4}),
    (["convert", "a", "b", "--validate"], {"validate": 0, "samples": 8}),
    (["convert", "a", "b", "--validate", "--samples", "16"], {"validate": 0, "samples": 16}),
    (["inspect", "a", "--samples", "3", "--json"], {"samples": 3, "json": True}),
])
def test_older_spellings_parse_as_the_one_shown(argv, expected, capsys):
    options = cli.build_parser().parse_args(argv)
    assert {key: getattr(options, key) for key in expected} == expected
    cli._old_spellings(argv, argv[0])  # pylint: disable=protected-access
    err = capsys.readouterr().err
    old = [a for a in argv if a in cli._OLD_SPELLINGS]  # pylint: disable=protected-access
    assert (f"{old[0]} is an older spelling" in err) if old else err == "", err


def test_usage_errors_exit_2_and_a_missing_model_4(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["convert", "--no-such-flag"])
    assert exited.value.code == cli.EXIT_USAGE
    with pytest.raises(SystemExit) as exited:
        cli.main(["convert", str(tmp_path / "missing.pb"), str(tmp_path / "out.pb"),
                  "--target", "rules"])
    assert exited.value.code == cli.EXIT_BAD_INPUT
    assert "does not exist" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_cache_lists_by_kind_and_clear_removes_only_tf_mpts_files(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setenv("TF_MPT_CACHE_DIR", str(tmp_path))
    cli.main(["cache"])
    assert capsys.readouterr().out.strip() == f"tf_mpt's cache {tmp_path}: empty"
    ours = ["verdicts-bfloat16-ab.json", "op_costs-bfloat16-ab.json",
            "dispatch-float16-ab-v3-onednn-on.json", "session_rewrite-2.21.0-ab.so"]
    for name in ours + ["notes.txt"]:
        (tmp_path / name).write_bytes(b"x" * 2048)
    cli.main(["cache"])
    out = capsys.readouterr().out
    assert out.startswith(f"tf_mpt's cache {tmp_path}: 5 file(s)"), out
    assert "graph timing's verdicts" in out and "dispatch and numerics checks" in out
    assert "not tf_mpt's (left as they are): notes.txt" in out
    cli.main(["cache", "--clear"])
    assert capsys.readouterr().out.strip() == (
        f"removed 4 file(s) from {tmp_path}; left 1 that are not tf_mpt's: notes.txt")
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_a_bad_setting_stops_each_command_with_bad_input(monkeypatch, tmp_path, capsys):
    """A bad TF_MPT_* value is bad input (4) for every command that reads the environment,
    said before anything is measured or written."""
    monkeypatch.setenv("TF_MPT_DTYPE", "half")
    table = tmp_path / "t.json"
    for argv in (["cache"], ["doctor"], ["cpu"], ["measure", "--out", str(table)]):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == cli.EXIT_BAD_INPUT, argv
        assert re.match(rf"tf-mpt {argv[0]}: TF_MPT_DTYPE must be one of float16, bfloat16, "
                        r"auto\. Received: TF_MPT_DTYPE='half'", capsys.readouterr().err)
    assert not table.exists()


def test_the_hook_check_names_a_missing_hook_only_where_a_switch_is_on(monkeypatch, tmp_path):
    from tf_mpt._process import hook_check
    monkeypatch.setattr(hook_check, "site_directories", lambda: [str(tmp_path)])
    assert hook_check.hook_path() is None
    assert hook_check.missing_hook_warning({"TF_MPT_ENABLE": "0"}) is None
    assert hook_check.missing_hook_warning({}) is None
    warning = hook_check.missing_hook_warning({"TF_MPT_ENABLE": "1"})
    assert warning.startswith("TF_MPT_ENABLE is set, but tf_mpt's start-up hook") and \
        "tf-mpt run script.py" in warning and "pip install ." in warning
    (tmp_path / hook_check.PTH).write_text("import os\n")
    assert hook_check.hook_path() == str(tmp_path / hook_check.PTH)
    assert hook_check.missing_hook_warning({"TF_MPT_ENABLE": "1"}) is None


def test_doctor_says_whether_the_hook_is_there_and_what_enable_would_do(monkeypatch, tmp_path,
                                                                       capsys):
    """With the CPU's flags injected (Zen 4's: native bfloat16) and no GPU in this process."""
    from tf_mpt._process import hook_check
    monkeypatch.setenv("TF_MPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TF_MPT_CPU_FLAGS", "avx2 avx512f avx512bw avx512_bf16")
    monkeypatch.setattr(hook_check, "site_directories", lambda: [str(tmp_path)])
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert out.startswith(cli._version()), out  # pylint: disable=protected-access
    assert "start-up hook: not installed" in out and "tf-mpt run script.py" in out
    assert "TF_MPT_ENABLE=1 here: bfloat16 (TF_MPT_DTYPE=auto)" in out
    assert f"tf_mpt's cache {tmp_path}: empty" in out
    monkeypatch.setenv("TF_MPT_CPU_FLAGS", "avx2 fma")  # (Zen 3: no native bfloat16)
    (tmp_path / hook_check.PTH).write_text("import os\n")
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert f"start-up hook: installed ({tmp_path / hook_check.PTH})" in out
    assert "TF_MPT_ENABLE=1 here: the script stays float32" in out


def test_the_readme_names_the_exit_codes_and_commands_as_the_cli_has_them():
    with open(os.path.join(os.path.dirname(CLI_DOC), "..", "README.md")) as f:
        text = " ".join(f.read().split())
    listed = ", ".join(f"{code} {meaning.split(':')[0]}" for code, meaning in
                       cli.EXIT_CODES.items())
    assert f"({listed})" in text, listed
    commands = cli.build_parser()._actions[-1].choices  # pylint: disable=protected-access
    for command in ("doctor", "cache", "convert", "inspect", "measure", "cpu", "run"):
        assert command in commands and f"tf-mpt {command}" in text, command
