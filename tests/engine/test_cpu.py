"""engine.cpu: numeric paths chosen from the CPU's feature flags."""

from __future__ import annotations

import pytest

from qasc.engine import cpu


@pytest.fixture
def fake_cpuinfo(tmp_path, monkeypatch):
    def write(text: str | None):
        path = tmp_path / "cpuinfo"
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(cpu, "CPUINFO", str(path))
        cpu.cpu_flags.cache_clear()

    yield write
    cpu.cpu_flags.cache_clear()


AVX2 = ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n\n"
        "processor\t: 1\nflags\t\t: fpu sse2 avx2 fma\n")
VNNI_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16\n"
AMX = "processor\t: 0\nflags\t\t: avx2 amx_bf16 amx_int8 amx_tile\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd asimddp i8mm bf16\n"


@pytest.mark.parametrize(("text", "int8", "bf16"), [(AVX2, False, False), (VNNI_BF16, True, True), (AMX, True, True),
                                                    (ARM, False, False), ("", False, False), (None, False, False)])
def test_paths_follow_the_flags(fake_cpuinfo, text, int8, bf16):
    fake_cpuinfo(text)
    assert cpu.cpu_has_int8_dot() is int8
    assert cpu.cpu_has_native_bf16() is bf16


def test_flags_are_whole_words(fake_cpuinfo):
    fake_cpuinfo("flags\t\t: avx512_vnnix notavx_vnni\n")  # a flag that merely contains the name does not count
    assert not cpu.cpu_has_int8_dot()
    fake_cpuinfo(ARM)
    assert "asimddp" in cpu.cpu_flags()
