"""What the emulation itself promises the kernels' tests (tests/amd_emulation/include/rsd_emu/lanes.h): the device
pass's code (rocm_sd/common.h's bf16 conversion, which gfx11 / gfx12 take through __bf16), __shared__ poisoned for
every block, a failing block ending the blocks that wait for it, and the lane exchanges of the RDNA attention
(v_permlanex16, v_perm_b32) as the ISA documents them. The checks live in the group_norm library
(entry_group_norm.cpp), so they build nothing of their own."""

import ctypes
import struct

import pytest
import torch

from tests.amd_emulation_tests.emulated import ARCHS, MARKS, library, pointer, run
from tests.amd_emulation_tests.test_group_norm import LIBRARIES

pytestmark = MARKS

POISON = 0xFFFFFFFF


@pytest.fixture(scope="module", params=ARCHS)
def emulated(request):
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    u32 = ctypes.c_uint32
    return request.param, library(request.param, LIBRARIES["emulated"], rsd_emu_bf16_from_float=[p, p, i64],
                                  rsd_emu_shared_poison_reads=[p, i32], rsd_emu_wait_for_failed_block=[p, p, i32],
                                  rsd_emu_permlanex16=[p, p, i32, u32, u32], rsd_emu_byte_perm=[p, p, p, p, i32])


def bits_of(words) -> torch.Tensor:
    return torch.tensor([struct.unpack("<i", struct.pack("<I", w))[0] for w in words], dtype=torch.int32)


# fp32 bit patterns: (bits of an exact bf16 at `b`, a tie, one above and below it) for an even and an odd `b`, both
# signs; in the denormals; the largest finite value (rounds to infinity), infinities, zeros; quiet and signalling
# NaNs with payloads in the kept and in the dropped bits.
SPECIAL = []
for b in (0x3F80, 0x3F81, 0x7F7E, 0x7F7F, 0x0000, 0x0001, 0x007F, 0x0080, 0x4B00, 0x4B01):
    for sign in (0, 0x80000000):
        SPECIAL += [sign | b << 16 | low for low in (0x0000, 0x8000, 0x8001, 0x7FFF, 0x0001, 0xFFFF)]
SPECIAL += [0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000,
            0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F808000, 0xFF80FFFF, 0x7FBFFFFF, 0x7FFFFFFF, 0x7F8A0000]


def test_bf16_conversion_rounds_as_the_gpu(emulated):
    """rocm_sd/common.h's float -> bf16 (on gfx11 / gfx12 the device pass's static_cast<__bf16>, elsewhere its
    integer rounding): round to nearest even, ties to even, denormals kept, overflow to infinity, as torch rounds;
    a NaN keeps its sign and payload's upper bits with the quiet bit set, as the GPU's instructions do
    (v_or_b32 0x400000 for a NaN: tests/amd_emulation/include/hip/hip_runtime.h), where torch makes every NaN
    0x7fc0."""
    arch, lib = emulated
    x = torch.cat([bits_of(SPECIAL), torch.randint(-2**31, 2**31 - 1, (4096,), dtype=torch.int32)]).view(torch.float32)
    y = torch.full(x.shape, -1, dtype=torch.int16)  # poisoned: 0xffff, itself a NaN code nobody writes here
    run(lib.rsd_emu_bf16_from_float, pointer(x), pointer(y), x.numel())
    nan = x.isnan()
    truth = x.to(torch.bfloat16).view(torch.int16)
    truth[nan] = ((x.view(torch.int32)[nan] | 0x400000) >> 16).to(torch.int16)
    wrong = (y != truth).nonzero().flatten()[:6].tolist()
    assert not wrong, f"{arch}: (fp32 bits, ours, expected) " + ", ".join(
        f"({x.view(torch.int32)[i].item() & POISON:08x}, {y[i].item() & 0xFFFF:04x}, {truth[i].item() & 0xFFFF:04x})"
        for i in wrong)


def test_shared_memory_starts_each_block_poisoned(emulated):
    """A __shared__ slot no lane of the block wrote reads as 0xff bytes (NaN), in every block of a launch with more
    blocks than the emulated device runs at once (blocks reuse a thread's storage); a slot a lane wrote reads as
    written by the block's other lanes."""
    arch, lib = emulated
    blocks = 24
    seen = torch.zeros(blocks, 3, dtype=torch.int32)
    run(lib.rsd_emu_shared_poison_reads, pointer(seen), blocks)
    expected = torch.stack([bits_of([POISON] * blocks), torch.arange(blocks, dtype=torch.int32),
                            bits_of([POISON] * blocks)], dim=1)
    assert torch.equal(seen, expected), f"{arch}: per block (before any write, lane 0's write, never written)\n{seen}"


def test_a_failing_block_ends_the_blocks_waiting_for_it(emulated):
    """Block 0 traps while 3 blocks wait for it in rocm_sd/grid_sync.h's wait_at_least: the launch fails with
    block 0's error, and no waiting block spins to the wait's bound (2^26 sleeps; minutes in the emulation)."""
    arch, lib = emulated
    blocks = 4
    counters, timed_out = torch.zeros(2, dtype=torch.int32), torch.zeros(blocks, dtype=torch.int32)
    error = lib.rsd_emu_wait_for_failed_block(pointer(counters), pointer(timed_out), blocks).decode()
    assert error == "the kernel trapped (__builtin_trap)", f"{arch}: {error!r}"
    assert counters.tolist() == [blocks - 1, 0], arch  # every other block was waiting when block 0 trapped
    assert timed_out.tolist() == [0] * blocks, f"{arch}: blocks that waited to the bound: {timed_out.tolist()}"


def words(n, generator):
    return torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, generator=generator)


def test_permlanex16_reads_the_other_row(emulated):
    """v_permlanex16_b32: lane l reads lane sel[l % 16] of the other 16-lane row of its pair of rows, in every wave;
    with identity selects (wave_mma.h's swap_rows16) lane l ^ 16. gfx9 has no such instruction."""
    arch, lib = emulated
    waves, wave = 3, 64 if arch == "gfx942" else 32
    x = words(waves * wave, torch.Generator().manual_seed(7))
    lanes = torch.arange(waves * wave)
    selects = {"identity": list(range(16)), "reversed": list(range(15, -1, -1)),
               "scattered": [5, 0, 15, 9, 9, 2, 12, 7, 1, 14, 3, 3, 11, 6, 8, 10]}
    for what, nibbles in selects.items():
        sel = sum(n << (4 * i) for i, n in enumerate(nibbles))
        y = torch.zeros_like(x)
        error = lib.rsd_emu_permlanex16(pointer(x), pointer(y), waves, sel & POISON, sel >> 32).decode()
        if arch == "gfx942":
            assert error == "no v_permlanex16 on gfx942", error
            return
        assert error == "", error
        source = (lanes // 16 ^ 1) * 16 + torch.tensor(nibbles)[lanes % 16]
        assert torch.equal(y, x[source]), f"{arch}, {what} selects: lanes {(y != x[source]).nonzero().flatten()[:8]}"
        if what == "identity":
            assert torch.equal(y, x[lanes ^ 16]), arch


def test_byte_perm_follows_the_isa(emulated):
    """v_perm_b32: each result byte is the byte of {s0 (4-7), s1 (0-3)} its selector byte names, the sign of byte
    1, 3, 5 or 7 for 8-11, zero for 12 and 0xff above, for every selector byte value."""
    arch, lib = emulated
    g = torch.Generator().manual_seed(11)
    n = 1024
    s0, s1 = words(n, g), words(n, g)
    selector_bytes = torch.cat([torch.arange(256), torch.randint(0, 16, (4 * n - 256,), generator=g)])
    sel = (selector_bytes.view(n, 4) << torch.tensor([0, 8, 16, 24])).sum(1).to(torch.int64)
    sel = torch.where(sel >= 2**31, sel - 2**32, sel).to(torch.int32)
    out = torch.zeros(n, dtype=torch.int32)
    run(lib.rsd_emu_byte_perm, pointer(s0), pointer(s1), pointer(sel), pointer(out), n)

    def reference(a, b, c):
        data = (a & POISON) << 32 | (b & POISON)
        result = 0
        for k in range(4):
            byte = c >> (8 * k) & 0xFF
            value = (0xFF if byte >= 13 else 0 if byte == 12 else 0xFF * (data >> (16 * (byte - 8) + 15) & 1)
                     if byte >= 8 else data >> (8 * byte) & 0xFF)
            result |= value << (8 * k)
        return result

    wrong = [(i, out[i].item() & POISON) for i in range(n)
             if out[i].item() & POISON != reference(s0[i].item(), s1[i].item(), sel[i].item() & POISON)]
    assert not wrong, f"{arch}: (index, ours) {wrong[:6]}"
