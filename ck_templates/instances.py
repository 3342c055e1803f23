"""The Composable Kernel device-op instances rocm_sd builds, described as data (DESIGN.md convention 9).

Each instance is one template instantiation of a CK device operation; its name encodes every
parameter, so the tuner's database rows say exactly what ran. generate.py writes one source per
instance. The lists follow CK's own instance tables for these ops (library/src/tensor_operation_instance/
gpu/normalization_fwd), cut to the vector widths SD's channel counts (multiples of 32) can use.
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
