"""Runs every rocm_sd kernel once per path at small shapes, for compute-sanitizer (memcheck, racecheck):

    compute-sanitizer --tool memcheck --error-exitcode 1 python bench/sanitize_kernels.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python bench/sanitize_kernels.py

Small shapes keep the sanitizers fast; each still takes the multi-block paths (group exchange, split
statistics, finalize), the vector widths 8/4/2/1, and every attention instance with partial tiles. Results go to
the GPU ledger, bench/results/notes/2026-11-21-sanitizer-h200.md (prose: a sanitizer run has no numbers to tabulate).
"""
import torch

from rocm_sd.ops.ada_layer_norm import ada_layer_norm_kernel, add_ada_layer_norm_kernel
from rocm_sd.ops.attention import attention_kernel, instance_fits, instances
from rocm_sd.ops.bias_residual import bias_residual_kernel
from rocm_sd.ops.geglu import geglu_kernel
from rocm_sd.ops.group_norm import group_norm_kernel
from rocm_sd.ops.layer_norm import add_layer_norm_kernel, layer_norm_kernel
from rocm_sd.ops.parity_shuffle import parity_shuffle_kernel
from rocm_sd.ops.rms_norm import rms_norm_kernel


def main() -> None:
    torch.manual_seed(0)
    dev, h = "cuda", torch.float16
    for shape, groups in (((2, 64, 32, 32), 32), ((3, 96, 7, 9), 32), ((1, 32, 64, 64), 4)):
        for fmt in (torch.contiguous_format, torch.channels_last):
            x = torch.randn(shape, device=dev, dtype=h).contiguous(memory_format=fmt)
            w = torch.rand(shape[1], device=dev, dtype=h)
            ib = torch.randn(shape[0], shape[1], device=dev, dtype=h)
            for path in ("resident", "split"):
                group_norm_kernel(x, groups, w, w, 1e-5, True, path=path)
                group_norm_kernel(x, groups, w, w, 1e-5, False, path=path, input_bias=ib)
            bias_residual_kernel(x, x.clone(), w, 0.5)
    for rows, c in ((64, 320), (7, 33), (3, 2048)):
        x = torch.randn(rows, c, device=dev, dtype=h)
        layer_norm_kernel(x, torch.rand(c, device=dev, dtype=h), None, 1e-5)
        add_layer_norm_kernel(x, torch.randn_like(x), torch.rand(c, device=dev, dtype=h), None, 1e-5)
        geglu_kernel(torch.randn(rows, 2 * c, device=dev, dtype=h))
    x = torch.randn(2, 64, 16, 16, device=dev, dtype=torch.float32)
    group_norm_kernel(x, 32, None, None, 1e-5, True)
    # AdaLN: one wave a row (320), scalar (33), row groups of several waves with a barrier (2432), parameters as
    # chunks of an embedding and transposed (scalar path, 8 vectors a lane at 4096)
    for c in (320, 33, 2432, 4096):
        x = torch.randn(3, 5, c, device=dev, dtype=h)
        shift, scale, gate = torch.randn(3, 6 * c, device=dev, dtype=h).chunk(6, dim=1)[:3]
        if c == 4096:
            shift, scale, gate = (torch.randn(c, 3, device=dev, dtype=h).t() for _ in range(3))
        ada_layer_norm_kernel(x, scale, shift, 1e-6)
        add_ada_layer_norm_kernel(x, torch.randn_like(x), gate, scale, shift, 1e-6)
    for c in (16, 12, 3):  # vector widths 8, 4 and 1
        parities = torch.randn(2, 4 * c, 6, 8, device=dev, dtype=h).contiguous(memory_format=torch.channels_last)
        parity_shuffle_kernel(parities, torch.randn(c, device=dev, dtype=h))
    # RMSNorm: lead rows and rope on a fused-QKV view (groups of 16 lanes), head dim 40 (idle lanes of a group), T5's
    # one head of 4096 (rows in registers on wave64, read twice on wave32) and in float32 (read twice).
    for dtype, (l0, l, heads, dim) in ((h, (5, 33, 3, 128)), (h, (2, 7, 3, 40)), (h, (0, 9, 1, 4096)),
                                       (torch.float32, (0, 9, 1, 4096))):
        qkv = torch.randn(2, l, 3 * heads * dim, device=dev, dtype=dtype)
        angles = torch.randn(l0 + l, dim, device=dev)
        rms_norm_kernel(qkv[..., heads * dim:2 * heads * dim].unflatten(-1, (heads, dim)),
                        torch.rand(dim, device=dev, dtype=dtype), 1e-6,
                        torch.randn(2, l0, heads, dim, device=dev, dtype=dtype), None, angles.cos(), angles.sin())
    # Attention: every instance at its padded head dim, with query and key tails (130 queries, 97 keys)
    # and packed K / V views.
    for name in instances():
        dtype = torch.float16 if name.startswith("f16_") else torch.bfloat16
        dim = max(d for d in range(8, 513, 8) if instance_fits(name, dtype, d))
        q = torch.randn(1, 130, 2, dim, device=dev, dtype=dtype)
        kv = torch.randn(1, 97, 2, 2, dim, device=dev, dtype=dtype)
        attention_kernel(q, kv[:, :, 0], kv[:, :, 1], dim ** -0.5, instance=name)
    torch.cuda.synchronize()
    print("all kernels ran")


if __name__ == "__main__":
    main()
