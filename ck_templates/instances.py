"""The Composable Kernel device-op instances rocm_sd builds, described as data (docs/design.md, convention 9).

Each instance is one template instantiation of a CK device operation; its name encodes every
parameter, so the tuner's database rows say exactly what ran. generate.py writes one source per
instance. The lists follow CK's own instance tables for these ops (library/src/tensor_operation_instance/
gpu/normalization_fwd, gpu/batched_gemm_softmax_gemm_permute, gpu/gemm_add_fastgelu and gpu/grouped_conv2d_fwd;
for WMMA: gpu/gemm_add_multiply's wmma_c_shuffle_v3 table, grouped_conv_fwd/device_grouped_conv_fwd_wmma_instance.hpp
and, CK having no library table for WMMA attention, its example/32_batched_gemm_scale_softmax_gemm *_wmma_fp16 ones),
cut to what SD's shapes can use.

GEMM, attention and convolution come in two matrix-core families, each built only for the GPUs CK compiles its
kernels for (elsewhere CK compiles them to empty kernels): XDL (MFMA, CDNA: XDL_TARGETS) and WMMA (RDNA3/4:
WMMA_TARGETS). GroupNorm is plain HIP and built for every target.
"""
from __future__ import annotations

from dataclasses import dataclass

# The processors whose code objects hold each family's kernel bodies: ck/ck.hpp's __gfx9__ (XDL) and __gfx11__ /
# __gfx12__ (WMMA), the same lists as CK's host-side checks (ck/host_utility/device_prop.hpp).
XDL_TARGETS = ("gfx908", "gfx90a", "gfx942", "gfx950")
WMMA_TARGETS = ("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1200", "gfx1201")
FAMILY_TARGETS = {"xdl": XDL_TARGETS, "wmma": WMMA_TARGETS}


def built_targets(family: str | None, targets) -> tuple[str, ...]:
    """Which of `targets` (GPU_TARGETS entries, target features allowed: "gfx90a:xnack+") an instance of `family`
    ("xdl", "wmma", or None for the plain-HIP ones) is compiled for."""
    if family is None:
        return tuple(targets)
    return tuple(t for t in targets if t.split(":")[0] in FAMILY_TARGETS[family])


@dataclass(frozen=True)
class GroupNormInstance:
    """DeviceNormalizationFwdImpl over x as [N, H, W, G, C/G] (channels_last), reducing H, W and C/G:
    GroupNorm, with Swish (SiLU) applied to the output or not. fp16 data, fp32 statistics."""
    act: str                 # "swish" or "pass"
    block: int               # threads per block
    m_cluster: int           # threads along the kept dims (N, G)
    k_cluster: int           # threads along the reduced dims
    m_slice: int             # elements per thread along kept dims
    k_slice: int             # elements per thread along reduced dims
    vector: int              # x/y/gamma/beta vector width (elements)
    family = None            # plain HIP: no matrix cores, built for every target

    def __post_init__(self):
        if self.act not in ("swish", "pass"):
            raise ValueError(f"act must be swish or pass, not {self.act!r}")
        if self.m_cluster * self.k_cluster != self.block:
            raise ValueError(f"{self.name}: m_cluster * k_cluster must equal block")
        if self.k_slice % self.vector:
            raise ValueError(f"{self.name}: k_slice must be a multiple of the vector width")

    @property
    def name(self) -> str:
        return (f"ck_group_norm_{self.act}_f16_b{self.block}_c{self.m_cluster}x{self.k_cluster}"
                f"_s{self.m_slice}x{self.k_slice}_v{self.vector}")

    @property
    def element_op(self) -> str:
        return "::ck::tensor_operation::element_wise::Swish" if self.act == "swish" else \
            "::ck::tensor_operation::element_wise::PassThrough"


def _group_norms(act: str) -> list[GroupNormInstance]:
    return [GroupNormInstance(act, 64, 1, 64, 1, 1, 1),      # generic: any size
            GroupNormInstance(act, 256, 1, 256, 1, 8, 8),
            GroupNormInstance(act, 256, 1, 256, 1, 16, 8),
            GroupNormInstance(act, 512, 1, 512, 1, 8, 8),
            GroupNormInstance(act, 1024, 1, 1024, 1, 8, 8)]


GROUP_NORM_INSTANCES = _group_norms("swish") + _group_norms("pass")


@dataclass(frozen=True)
class AttentionInstance:
    """DeviceBatchedGemmSoftmaxGemmPermute_Xdl_CShuffle (XDL: CDNA's matrix cores): softmax(scale * Q K^T) V
    per (batch, head), fp16 in and out, fp32 accumulation and softmax, no mask. Q, K, V and the output are
    taken with any strides, so the projections' per-head views need no copy. `padded` (CK's MNKOPadding)
    takes any sequence length and any head dim that is a multiple of 8 (SD: 40, 64, 80, 160, and 77 keys of
    cross-attention); unpadded instances need every length a multiple of its tile and are faster there."""
    padded: bool
    m_per_block: int         # queries a block (Gemm0 M)
    n_per_block: int         # keys a block (Gemm0 N)
    k_per_block: int         # head-dim slice of Q K^T a step (Gemm0 K): 32 or 64
    o_per_block: int         # output head dims a block (Gemm1 N): 64 or 128
    m_xdl_per_wave: int
    n_xdl_per_wave: int      # of Gemm0
    o_xdl_per_wave: int      # of Gemm1
    block: int = 256
    per_xdl: int = 32        # the 32x32 XDL instruction shape
    family = "xdl"

    def __post_init__(self):
        if self.k_per_block not in (32, 64):
            raise ValueError(f"{self.name}: k_per_block must be 32 or 64 (the Q/K block transfer layouts below)")
        if self.o_per_block not in (64, 128):
            raise ValueError(f"{self.name}: o_per_block must be 64 or 128 (the V block transfer layouts below)")
        waves = self.block // 64
        m_waves = self.m_per_block // (self.m_xdl_per_wave * self.per_xdl)
        if m_waves * self.n_per_block != waves * self.n_xdl_per_wave * self.per_xdl or m_waves < 1:
            raise ValueError(f"{self.name}: the waves do not tile the {self.m_per_block}x{self.n_per_block} block")
        if m_waves * self.o_per_block != waves * self.o_xdl_per_wave * self.per_xdl:
            raise ValueError(f"{self.name}: the waves do not tile the {self.m_per_block}x{self.o_per_block} output")

    @property
    def name(self) -> str:
        return (f"ck_attention_f16_{'pad' if self.padded else 'exact'}_b{self.block}_m{self.m_per_block}"
                f"_n{self.n_per_block}_k{self.k_per_block}_o{self.o_per_block}_x{self.per_xdl}"
                f"_w{self.m_xdl_per_wave}x{self.n_xdl_per_wave}x{self.o_xdl_per_wave}")

    # The transfer layouts CK's table pairs with these tiles (256 threads a block).
    @property
    def qk_cluster(self) -> str:   # Q and K block transfer thread cluster (K0, M|N, K1) and AddExtraM|N
        return "S<4, 64, 1>" if self.k_per_block == 32 else "S<8, 32, 1>"

    @property
    def qk_extra(self) -> str:
        return "true" if self.k_per_block == 32 else "false"

    @property
    def v_cluster(self) -> str:    # V block transfer thread cluster
        return "S<16, 16, 1>" if self.o_per_block == 64 else "S<8, 32, 1>"


# From CK's f16 gmk_gnk_gno_gmo table: its padded fallback and the two tiles that fit SD's head dims best
# (64: SDXL, SD2.x; 40/80/160, SD1.5, only padded), each padded and, for self-attention, exact.
ATTENTION_XDL_INSTANCES = [
    AttentionInstance(True, 128, 128, 64, 128, 1, 4, 4),
    AttentionInstance(True, 128, 64, 32, 128, 1, 2, 4),
    AttentionInstance(True, 128, 128, 32, 64, 1, 4, 2),
    AttentionInstance(False, 128, 128, 32, 64, 1, 4, 2),
]


@dataclass(frozen=True)
class AttentionWmmaInstance:
    """DeviceBatchedGemmSoftmaxGemmPermute_Wmma_CShuffle (WMMA: RDNA3/4's matrix cores, wave32, 16x16x16
    instructions): the same softmax(scale * Q K^T) V, fp16 in and out, fp32 accumulation and softmax, no mask,
    every length padded (MNKOPadding: any sequence length, head dims that are multiples of 8). Unlike the XDL op
    it takes packed [batch, sequence, heads, head dim] tensors only: this CK compiles out the op's strided
    argument path and keeps the one that computes those strides itself (the instance refuses other strides)."""
    block: int               # threads a block (wave32: block // 32 waves, one 16-query row of tiles each)
    m_per_block: int         # queries a block (Gemm0 M)
    n_per_block: int         # keys a block (Gemm0 N; CK's L)
    k_per_block: int         # head-dim slice of Q K^T a step (Gemm0 K)
    o_per_block: int         # output head dims a block (Gemm1 N)
    n_tile: int              # keys of P V a step (Gemm1 K; CK's LTilePerBlock)
    n_repeat: int            # 16-key tiles a wave (Gemm0)
    o_repeat: int            # 16-dim output tiles a wave (Gemm1)
    k_threads: int           # K's thread cluster of the K block transfer: CK's tables pair it with each tile
    per_wmma: int = 16       # the only WMMA shape gfx11 / gfx12 have
    family = "wmma"

    def __post_init__(self):
        waves = self.block // 32
        if self.m_per_block != waves * self.per_wmma:
            raise ValueError(f"{self.name}: the {waves} waves must take {self.per_wmma} queries each")
        if self.n_per_block != self.n_repeat * self.per_wmma or self.o_per_block != self.o_repeat * self.per_wmma:
            raise ValueError(f"{self.name}: a wave's repeats do not tile the {self.n_per_block} keys and "
                             f"{self.o_per_block} output dims")
        if self.k_per_block % 8 or self.n_tile % 8 or self.n_per_block % self.n_tile:
            raise ValueError(f"{self.name}: K and the key tile must split into 8-element vectors, and the key "
                             "tile must divide the block's keys")

    @property
    def name(self) -> str:
        return (f"ck_attention_f16_wmma_pad_b{self.block}_m{self.m_per_block}_n{self.n_per_block}"
                f"_k{self.k_per_block}_o{self.o_per_block}_t{self.n_tile}_x{self.per_wmma}"
                f"_r{self.n_repeat}x{self.o_repeat}_c{self.k_threads}")

    # The transfer layouts CK's WMMA attention examples pair with these tiles.
    @property
    def q_cluster(self) -> str:    # Q block transfer thread cluster (K0, M, K1)
        return f"S<2, {self.block // 2}, 1>"

    @property
    def k_cluster(self) -> str:    # K block transfer thread cluster (K0, N, K1)
        return f"S<{self.k_threads}, {self.block // self.k_threads}, 1>"

    @property
    def v_cluster(self) -> str:    # V block transfer thread cluster (N0, O, N1)
        return f"S<2, {self.block // 16}, 8>"

    @property
    def v_vector(self) -> int:     # V's source vector width: 8 at one wave, halved as the waves double
        return 256 // self.block


# From CK's WMMA attention examples (batched_gemm_scale_softmax_gemm_permute_wmma_fp16.cpp: the 8-wave tile for
# head dim 64, SDXL / SD2.x; cross_attention_forward_wmma_fp16.cpp: its head-dim-80 and -160 tiles, SD1.5's
# 80 / 160, and 40 padded): three tiles, padded, for every SD head dim.
ATTENTION_WMMA_INSTANCES = [
    AttentionWmmaInstance(256, 128, 128, 64, 64, 64, 8, 4, k_threads=8),
    AttentionWmmaInstance(128, 64, 128, 80, 80, 64, 8, 5, k_threads=2),
    AttentionWmmaInstance(64, 32, 32, 160, 80, 32, 2, 5, k_threads=2),
]


def _check_wave_grid(tag: str, block: int, wave: int, m_per_block: int, n_per_block: int, m_repeat: int,
                     n_repeat: int, per: int, out_vector: int) -> None:
    """Raises unless the block's waves (each m_repeat x n_repeat per x per instructions) tile its m x n outputs
    exactly, and the epilogue's out_vector-element vectors tile one shuffle of the C tile (each wave's first
    column of instructions: CShuffleNXdlPerWavePerShuffle / CShuffleNRepeatPerShuffle 1, as in CK's tables)."""
    waves, m_waves, n_waves = block // wave, m_per_block // (m_repeat * per), n_per_block // (n_repeat * per)
    if m_waves < 1 or n_waves < 1 or m_waves * n_waves != waves:
        raise ValueError(f"{tag}: {waves} waves do not tile the {m_per_block}x{n_per_block} block")
    if (n_waves * per) % out_vector:
        raise ValueError(f"{tag}: the epilogue's vectors do not tile a shuffle's {n_waves * per} columns")


def _epilogue_cluster(block: int, n_per_block: int, n_repeat: int, out_vector: int) -> str:
    """CK's epilogue thread cluster (1, M, 1, N) over one shuffle of the C tile (n_per_block / n_repeat columns),
    read and written in out_vector-element vectors."""
    n_threads = (n_per_block // n_repeat) // out_vector
    return f"S<1, {block // n_threads}, 1, {n_threads}>"


@dataclass(frozen=True)
class XdlTile:
    """The block tile of CK's XDL GEMM pipelines (DeviceGemmMultipleD_Xdl_CShuffle and the implicit GEMM of
    DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle share it): a block computes m x n outputs, k of the reduction a
    step, with 32x32 XDL instructions. Inputs are read in 8-element vectors along K (so K, i.e. the GEMM's
    reduction or the convolution's input channels, must be a multiple of 8), outputs written in 8-element vectors.
    Every size is padded (CK's MNKPadding), so any M, N, K runs."""
    block: int
    m_per_block: int
    n_per_block: int
    k_per_block: int
    m_xdl_per_wave: int
    n_xdl_per_wave: int
    per_xdl: int = 32
    k1: int = 8              # elements per vector along K, in global memory and LDS
    out_vector: int = 8      # elements per vector of the epilogue's reads and writes along N
    family = "xdl"

    def __post_init__(self):
        _check_wave_grid(self.tag, self.block, 64, self.m_per_block, self.n_per_block, self.m_xdl_per_wave,
                         self.n_xdl_per_wave, self.per_xdl, self.out_vector)
        if self.k_per_block % self.k1 or self.block % (self.k_per_block // self.k1):
            raise ValueError(f"{self.tag}: k_per_block must split into {self.k1}-element vectors over the block")

    @property
    def tag(self) -> str:
        return (f"b{self.block}_m{self.m_per_block}_n{self.n_per_block}_k{self.k_per_block}_x{self.per_xdl}"
                f"_w{self.m_xdl_per_wave}x{self.n_xdl_per_wave}")

    # The transfer layouts CK's tables pair with these tiles.
    @property
    def ab_cluster(self) -> str:   # A and B block transfer thread cluster (K0, M|N, K1)
        k0 = self.k_per_block // self.k1
        return f"S<{k0}, {self.block // k0}, 1>"

    @property
    def out_cluster(self) -> str:
        return _epilogue_cluster(self.block, self.n_per_block, self.n_xdl_per_wave, self.out_vector)

    def template_args(self) -> str:
        """From NumGemmKPrefetchStage to the epilogue's vector width, in both device ops' parameter order."""
        return (f"1, {self.block}, {self.m_per_block}, {self.n_per_block}, {self.k_per_block}, {self.k1}, {self.k1}, "
                f"{self.per_xdl}, {self.per_xdl}, {self.m_xdl_per_wave}, {self.n_xdl_per_wave}, "
                f"{self.ab_cluster}, S<1, 0, 2>, S<1, 0, 2>, 2, {self.k1}, {self.k1}, 1, "
                f"{self.ab_cluster}, S<1, 0, 2>, S<1, 0, 2>, 2, {self.k1}, {self.k1}, 1, "
                f"1, 1, {self.out_cluster}, {self.out_vector}")


# From CK's f16 GEMM / grouped-conv-forward XDL tables: a large, a square and a small tile, so that the tuner
# has a choice between SD's largest GEMMs (8192 x 5120 at SD1.5 512) and its 8x8-latent ones.
XDL_TILES = [
    XdlTile(256, 256, 128, 32, 4, 2),
    XdlTile(256, 128, 128, 32, 2, 2),
    XdlTile(128, 128, 64, 32, 2, 2),
]


@dataclass(frozen=True)
class WmmaTile:
    """The block tile of CK's WMMA GEMM pipelines (DeviceGemmMultipleD_Wmma_CShuffleV3 and the implicit GEMM of
    DeviceGroupedConvFwdMultipleD_Wmma_CShuffle): wave32 blocks, each wave m_repeat x n_repeat 16x16x16 WMMA
    instructions (the only shape RDNA3/4 have), k of the reduction a step. Vectors of 8 elements along K in and
    along N out, as XdlTile (so K, N and the convolution's channels must be multiples of 8); every size padded."""
    block: int
    m_per_block: int
    n_per_block: int
    k_per_block: int
    m_repeat: int
    n_repeat: int
    lds_pad: bool            # CK's ABlockLdsExtraM / BBlockLdsExtraN: a padded LDS row against bank conflicts
    per_wmma: int = 16
    k1: int = 8
    out_vector: int = 8
    k_threads: int = 4       # the A/B transfers' threads along K0 (K / k1): 4 in every row of CK's WMMA tables
    family = "wmma"

    def __post_init__(self):
        _check_wave_grid(self.tag, self.block, 32, self.m_per_block, self.n_per_block, self.m_repeat, self.n_repeat,
                         self.per_wmma, self.out_vector)
        if self.k_per_block % (self.k1 * self.k_threads):
            raise ValueError(f"{self.tag}: k_per_block must split into {self.k1}-element vectors over "
                             f"{self.k_threads} threads")

    @property
    def tag(self) -> str:
        return (f"wmma_b{self.block}_m{self.m_per_block}_n{self.n_per_block}_k{self.k_per_block}_x{self.per_wmma}"
                f"_r{self.m_repeat}x{self.n_repeat}{'_ldspad' if self.lds_pad else ''}")

    @property
    def ab_cluster(self) -> str:   # A and B block transfer thread cluster (K0, M|N, K1)
        return f"S<{self.k_threads}, {self.block // self.k_threads}, 1>"

    @property
    def out_cluster(self) -> str:
        return _epilogue_cluster(self.block, self.n_per_block, self.n_repeat, self.out_vector)

    def _transfers(self) -> str:
        pad = int(self.lds_pad)
        return (f"{self.ab_cluster}, S<1, 0, 2>, S<1, 0, 2>, 2, {self.k1}, {self.k1}, {pad}, "
                f"{self.ab_cluster}, S<1, 0, 2>, S<1, 0, 2>, 2, {self.k1}, {self.k1}, {pad}, "
                f"1, 1, {self.out_cluster}")

    def gemm_args(self, num_d: int) -> str:
        """DeviceGemmMultipleD_Wmma_CShuffleV3's parameters from BlockSize on, for `num_d` D tensors (the vector
        widths of D0.., E), with CK's default pipeline (Intrawave, v1)."""
        vectors = ", ".join([str(self.out_vector)] * (num_d + 1))
        return (f"{self.block}, {self.m_per_block}, {self.n_per_block}, {self.k_per_block}, {self.k1}, {self.k1}, "
                f"{self.per_wmma}, {self.per_wmma}, {self.m_repeat}, {self.n_repeat}, {self._transfers()}, "
                f"S<{vectors}>, ::ck::BlockGemmPipelineScheduler::Intrawave, ::ck::BlockGemmPipelineVersion::v1")

    def conv_args(self) -> str:
        """DeviceGroupedConvFwdMultipleD_Wmma_CShuffle's parameters from NumGemmKPrefetchStage on."""
        return (f"1, {self.block}, {self.m_per_block}, {self.n_per_block}, {self.k_per_block}, {self.k1}, "
                f"{self.per_wmma}, {self.per_wmma}, {self.m_repeat}, {self.n_repeat}, {self._transfers()}, "
                f"{self.out_vector}")


# From CK's f16 WMMA tables, a large, a middle and a small tile each, as XDL_TILES: gemm_add_multiply's
# mk_nk_mn_mn_mn table (the GEGLU layout: x row-major, nn.Linear's weight column-major) for the GEMMs, and
# device_grouped_conv_fwd_wmma_instance.hpp's f16 table for the convolution (they differ in their smaller tiles).
WMMA_GEMM_TILES = [
    WmmaTile(256, 128, 128, 32, 4, 2, lds_pad=True),
    WmmaTile(128, 128, 64, 64, 4, 2, lds_pad=False),
    WmmaTile(64, 32, 64, 64, 2, 2, lds_pad=False),
]
WMMA_CONV_TILES = [
    WmmaTile(256, 128, 128, 32, 4, 2, lds_pad=True),
    WmmaTile(128, 128, 64, 32, 4, 2, lds_pad=True),
    WmmaTile(64, 32, 64, 32, 1, 4, lds_pad=True),
]


@dataclass(frozen=True)
class LinearGegluInstance:
    """diffusers' GEGLU projection as two CK GEMMs with fused epilogues (DeviceGemmMultipleD_Xdl_CShuffle with an
    XdlTile, DeviceGemmMultipleD_Wmma_CShuffleV3 with a WmmaTile; fp16, fp32 accumulation), x [M, K] times the
    projection weight [2N, K] (nn.Linear's, read in place):
        gate = gelu(x W[N:]^T + b[N:])              (bias + exact GELU in the first GEMM's epilogue)
        out  = (x W[:N]^T + b[:N]) * gate           (bias + product in the second's)
    so the [M, 2N] projection is never written: 2MN bytes of gate traffic instead of 5MN."""
    tile: XdlTile | WmmaTile

    @property
    def family(self) -> str:
        return self.tile.family

    @property
    def name(self) -> str:
        return f"ck_linear_geglu_f16_{self.tile.tag}"


@dataclass(frozen=True)
class ConvBiasResidualInstance:
    """ResnetBlock2D's conv2 and its tail as one CK grouped convolution (DeviceGroupedConvFwdMultipleABD_Xdl_
    CShuffle with an XdlTile, DeviceGroupedConvFwdMultipleD_Wmma_CShuffle with a WmmaTile; 2-D, one group, fp16,
    fp32 accumulation), channels_last x and weight (NHWGC, GKYXC):
        out = (residual + (conv(x, w) + bias)) * scale      (bias, residual and scale in the epilogue)"""
    tile: XdlTile | WmmaTile

    @property
    def family(self) -> str:
        return self.tile.family

    @property
    def name(self) -> str:
        return f"ck_conv_bias_residual_f16_{self.tile.tag}"


ATTENTION_INSTANCES = ATTENTION_XDL_INSTANCES + ATTENTION_WMMA_INSTANCES
LINEAR_GEGLU_INSTANCES = [LinearGegluInstance(t) for t in XDL_TILES + WMMA_GEMM_TILES]
CONV_BIAS_RESIDUAL_INSTANCES = [ConvBiasResidualInstance(t) for t in XDL_TILES + WMMA_CONV_TILES]
