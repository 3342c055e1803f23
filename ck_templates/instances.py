"""The Composable Kernel device-op instances rocm_sd builds, described as data (DESIGN.md convention 9).

Each instance is one template instantiation of a CK device operation; its name encodes every
parameter, so the tuner's database rows say exactly what ran. generate.py writes one source per
instance. The lists follow CK's own instance tables for these ops (library/src/tensor_operation_instance/
gpu/normalization_fwd, gpu/batched_gemm_softmax_gemm_permute, gpu/gemm_add_fastgelu and gpu/grouped_conv2d_fwd),
cut to what SD's shapes can use.
"""
from __future__ import annotations

from dataclasses import dataclass


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
ATTENTION_INSTANCES = [
    AttentionInstance(True, 128, 128, 64, 128, 1, 4, 4),
    AttentionInstance(True, 128, 64, 32, 128, 1, 2, 4),
    AttentionInstance(True, 128, 128, 32, 64, 1, 4, 2),
    AttentionInstance(False, 128, 128, 32, 64, 1, 4, 2),
]


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

    def __post_init__(self):
        waves = self.block // 64
        m_waves = self.m_per_block // (self.m_xdl_per_wave * self.per_xdl)
        n_waves = self.n_per_block // (self.n_xdl_per_wave * self.per_xdl)
        if m_waves < 1 or n_waves < 1 or m_waves * n_waves != waves:
            raise ValueError(f"{self.tag}: {waves} waves do not tile the {self.m_per_block}x{self.n_per_block} block")
        if self.k_per_block % self.k1 or self.block % (self.k_per_block // self.k1):
            raise ValueError(f"{self.tag}: k_per_block must split into {self.k1}-element vectors over the block")
        if (n_waves * self.per_xdl) % self.out_vector:
            raise ValueError(f"{self.tag}: the epilogue's vectors do not tile a wave's {self.per_xdl} columns")

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
    def out_cluster(self) -> str:  # the epilogue's thread cluster (1, M, 1, N) over one shuffle of the C tile
        n_threads = (self.n_per_block // self.n_xdl_per_wave) // self.out_vector
        return f"S<1, {self.block // n_threads}, 1, {n_threads}>"

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
class LinearGegluInstance:
    """diffusers' GEGLU projection as two CK GEMMs with fused epilogues (DeviceGemmMultipleD_Xdl_CShuffle, fp16,
    fp32 accumulation), x [M, K] times the projection weight [2N, K] (nn.Linear's, read in place):
        gate = gelu(x W[N:]^T + b[N:])              (bias + exact GELU in the first GEMM's epilogue)
        out  = (x W[:N]^T + b[:N]) * gate           (bias + product in the second's)
    so the [M, 2N] projection is never written: 2MN bytes of gate traffic instead of 5MN."""
    tile: XdlTile

    @property
    def name(self) -> str:
        return f"ck_linear_geglu_f16_{self.tile.tag}"


@dataclass(frozen=True)
class ConvBiasResidualInstance:
    """ResnetBlock2D's conv2 and its tail as one CK grouped convolution (DeviceGroupedConvFwdMultipleABD_Xdl_
    CShuffle, 2-D, one group, fp16, fp32 accumulation), channels_last x and weight (NHWGC, GKYXC):
        out = (residual + (conv(x, w) + bias)) * scale      (bias, residual and scale in the epilogue)"""
    tile: XdlTile

    @property
    def name(self) -> str:
        return f"ck_conv_bias_residual_f16_{self.tile.tag}"


LINEAR_GEGLU_INSTANCES = [LinearGegluInstance(t) for t in XDL_TILES]
CONV_BIAS_RESIDUAL_INSTANCES = [ConvBiasResidualInstance(t) for t in XDL_TILES]
