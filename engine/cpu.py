"""What the CPU can do fast, read from its feature flags (Linux /proc/cpuinfo), so that a numeric path is chosen
from the machine rather than by habit: bf16 products are 2-4x float32 where the CPU has native bf16 instructions
and slower where they are emulated; torch's int8 x int8 -> int32 product (`torch._int_mm`, the IVF scan's int8
path) is 1.6-1.9x the float32 scan on a CPU with VNNI and ~25x slower than a float32 product on one without
(AVX2 only: bench/RESULTS.md, "The int8 scan on a CPU without VNNI")."""

from __future__ import annotations

import functools

CPUINFO = "/proc/cpuinfo"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # x86 int8 dot-product instructions


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first CPU's feature flags (x86 'flags', Arm 'Features'); empty when /proc/cpuinfo is unreadable."""
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """True on a CPU with native bfloat16 instructions (avx512_bf16 or AMX), where bf16 matrix products run 2-4x
    faster than float32; False elsewhere (there bf16 is emulated and slower) or when the flags are unreadable."""
    return any(f in cpu_flags() for f in BF16_FLAGS)


def cpu_has_int8_dot() -> bool:
    """True on an x86 CPU with int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX-INT8), where
    `torch._int_mm` beats a float32 product; False elsewhere (AVX2 only, Arm, unreadable flags: float32 is the
    safe choice there)."""
    return any(f in cpu_flags() for f in INT8_DOT_FLAGS)
