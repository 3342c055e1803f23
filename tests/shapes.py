"""Tensor shapes of Stable Diffusion, and awkward ones, shared by tests and benchmarks."""

# (N, C, H, W), 32 groups: SD1.5/SDXL UNet at 512/1024 px with CFG (batch 2), and the VAE decoder at batch 1.
GROUP_NORM_SD = [
    (2, 320, 64, 64),     # UNet down/up block 1
    (2, 640, 32, 32),     # block 2
    (2, 1280, 16, 16),    # block 3
    (2, 1280, 8, 8),      # block 4 / mid
    (2, 960, 64, 64),     # up block concat (skip connections)
    (2, 2560, 8, 8),      # up block concat
    (1, 512, 64, 64),     # VAE decoder mid, 512 px
    (1, 512, 128, 128),   # VAE decoder up 1
    (1, 256, 256, 256),   # VAE decoder up 2
    (1, 128, 512, 512),   # VAE decoder up 3 (64 MB in fp16: larger than L2)
]

# (shape, groups) with a comment on what each one stresses.
# The SD1.5 UNet's other GroupNorm inputs (up blocks: skip concatenations and their outputs, CFG batch 2), for
# the benchmark's per-shape path comparison.
GROUP_NORM_SD15_UP = [
    (2, 2560, 16, 16),
    (2, 1920, 16, 16),
    (2, 1920, 32, 32),
    (2, 1280, 32, 32),
    (2, 960, 32, 32),
    (2, 640, 64, 64),
]

GROUP_NORM_AWKWARD = [
    ((3, 96, 7, 9), 32),     # batch 3, 3 channels per group, odd spatial: vector width 1
    ((2, 36, 5, 5), 4),      # 9 channels per group: C not a multiple of 8
    ((2, 1280, 1, 1), 32),   # 1x1 spatial
    ((1, 64, 3, 1), 32),     # 2 channels per group, tiny
    ((2, 320, 10), 32),      # 3-D input (N, C, L)
    ((1, 4096, 4, 4), 32),   # wide channels: NHWC with 512 threads a row
]

# GEGLU input (rows..., 2D): the SD1.5 feed-forward at 64x64, 32x32, 16x16, 8x8 latents (CFG batch 2).
GEGLU_SD = [(2, 4096, 2560), (2, 1024, 5120), (2, 256, 10240), (2, 64, 10240)]

# LayerNorm input (rows..., C): the SD1.5 transformer blocks at 64x64 .. 8x8 latents, and SDXL's 1280.
LAYER_NORM_SD = [(2, 4096, 320), (2, 1024, 640), (2, 256, 1280), (2, 64, 1280), (2, 1024, 1280)]

# (B, L, C) inputs of the diffusion transformers' AdaLN-Zero modulation: SD3.5 Large (C = 2432, not a multiple of
# 256) at 1024 px with CFG, image and text (77 + 256) tokens; SD3 / SD3.5 Medium (C = 1536) at 1024 and 512 px;
# Flux (C = 3072, batch 1) at 1024 px, image, text and the single blocks' joint stream, and at 2048 px.
ADA_LAYER_NORM_DIT = [(2, 4096, 2432), (2, 333, 2432), (2, 4096, 1536), (2, 333, 1536), (2, 1024, 1536),
                      (1, 4096, 3072), (1, 512, 3072), (1, 4608, 3072), (1, 16384, 3072)]

# (batch, q_len, kv_len, heads, head_dim): the attention calls of SD1.5 (512x512, CFG batch 2), SDXL (1024x1024)
# and SD2.1 (768x768), self and cross, and the VAE decoder's mid-block (one head of 512); then awkward ones: seq 1,
# 77, 1025, batch 3, head dims 8 / 72 / 128 / 168 / 504.
ATTENTION_SD = [
    (2, 4096, 4096, 8, 40), (2, 4096, 77, 8, 40), (2, 1024, 1024, 8, 80), (2, 1024, 77, 8, 80),
    (2, 256, 256, 8, 160), (2, 64, 77, 8, 160),                                   # SD1.5
    (2, 4096, 4096, 10, 64), (2, 4096, 77, 10, 64), (2, 1024, 1024, 20, 64), (2, 1024, 154, 20, 64),  # SDXL
    (2, 9216, 77, 5, 64), (2, 2304, 2304, 10, 64),                                # SD2.1 768
    (1, 4096, 4096, 1, 512), (1, 16384, 16384, 1, 512),                           # VAE mid-block, 512 and 1024
]
ATTENTION_AWKWARD = [(1, 1, 1, 1, 64), (3, 77, 77, 2, 40), (1, 1025, 1025, 3, 80), (3, 1, 1025, 1, 128),
                     (1, 33, 17, 2, 8), (2, 100, 300, 3, 72), (1, 16, 1, 1, 160),
                     (2, 1000, 1000, 1, 512), (3, 17, 33, 2, 504), (1, 1, 1, 1, 512), (1, 40, 90, 1, 168)]

# rocm_sd::rms_norm calls as (batch, len, heads, head_dim, lead_len or None, rope, fused): Q / K of the diffusion
# transformers at 1024x1024 (Flux: joint blocks with 512 text rows and the rotary embedding, single blocks over the
# 4608 joined rows; SD3.5 Large / Medium with CFG: 333 text rows, no rope), fused: x is a view of one third of a
# fused QKV projection; T5-XXL's RMSNorm as one head of 4096.
RMS_NORM_DIT = [
    (1, 4096, 24, 128, 512, True, False),   # Flux joint block
    (1, 4096, 24, 128, 512, True, True),    # the same from a fused QKV projection
    (1, 4608, 24, 128, None, True, True),   # Flux single block
    (2, 4096, 38, 64, 333, False, False),   # SD3.5 Large, CFG
    (2, 4096, 24, 64, 333, False, True),    # SD3.5 Medium, CFG, fused
    (2, 4096, 24, 64, None, False, False),  # SD3.5 Medium's second (image-only) attention
    (1, 512, 1, 4096, None, False, False),  # T5-XXL
]
# Head dim 40 (vectors of 8 bf16: five of them), 3 heads, 77 rows, batch 3, no lead rows (L0 = 0), one row, odd and
# tiny head dims.
RMS_NORM_AWKWARD = [
    (3, 77, 3, 40, 5, True, True), (3, 77, 3, 40, 0, True, False), (1, 1, 1, 64, None, False, False),
    (2, 7, 2, 33, 3, False, False), (2, 5, 3, 6, 2, True, False), (1, 3, 2, 2048, 1, True, True),
]
