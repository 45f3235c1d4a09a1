"""tf_mpt/_cpu.py: the CPU facts TF_MPT_DTYPE=auto decides from, for every CPU kind."""

import pytest

import tf_mpt
from tf_mpt import _cpu

CPUINFO = """processor\t: 0
model name\t: {model}
flags\t\t: {flags}

processor\t: 1
model name\t: {model}
flags\t\t: {flags}
"""


@pytest.mark.parametrize("model, flags, native, grappler, auto", [
    ("AMD EPYC 7B13 (Zen 3)", "fpu sse4_2 avx avx2 fma f16c", False, False, None),
    ("AMD EPYC 9B14 (Zen 4)", "avx2 avx512f avx512bw avx512_bf16", True, True, "bfloat16"),
    ("Intel Xeon (AMX)", "avx2 avx512f amx_tile amx_bf16", True, True, "bfloat16"),
    ("Intel Xeon (Skylake)", "avx2 avx512f avx512bw", False, True, None),
])
def test_facts_per_cpu_kind(tmp_path, model, flags, native, grappler, auto):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(model=model, flags=flags))
    read = _cpu.real_cpu_flags(str(path))
    assert read == frozenset(flags.split())
    assert _cpu.cpu_model(str(path)) == model
    assert _cpu.has_native_bfloat16(read) is native
    assert _cpu.grappler_bfloat16_runs(read) is grappler
    assert _cpu.auto_dtype(False, read) == auto
    assert _cpu.auto_dtype(True, read) == "float16"  # a GPU wins


def test_unreadable_cpuinfo_means_no_flags(tmp_path):
    missing = str(tmp_path / "nope")
    assert _cpu.real_cpu_flags(missing) == frozenset()
    assert _cpu.cpu_model(missing) == "unknown CPU"


def test_injected_flags_win_over_the_real_cpu_and_are_said_so():
    config = tf_mpt.Config.from_env({"TF_MPT_CPU_FLAGS": "avx2, AVX512F avx512_bf16"})
    assert config.cpu_flags == frozenset({"avx2", "avx512f", "avx512_bf16"})
    assert _cpu.cpu_flags(config) == config.cpu_flags
    lines = _cpu.facts(config)
    assert "TF_MPT_CPU_FLAGS (injected)" in lines[0]
    assert lines[1] == "native bfloat16: yes (avx512_bf16)"
    assert lines[-1] == "TF_MPT_DTYPE=auto picks: bfloat16"
    assert _cpu.cpu_flags(tf_mpt.Config()) == _cpu.real_cpu_flags()


def test_bad_injected_flag_names_the_variable():
    with pytest.raises(ValueError, match=r"TF_MPT_CPU_FLAGS must be space-separated CPU flags"
                       r".*Received: TF_MPT_CPU_FLAGS='avx2 avx-512' \(bad entry 'avx-512'\)"):
        tf_mpt.Config.from_env({"TF_MPT_CPU_FLAGS": "avx2 avx-512"})
