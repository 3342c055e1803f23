"""Runs every rocm_sd kernel once per path at small shapes, for compute-sanitizer (memcheck, racecheck):

    compute-sanitizer --tool memcheck --error-exitcode 1 python bench/sanitize_kernels.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python bench/sanitize_kernels.py

Small shapes keep the sanitizers fast; each still takes the multi-block paths (group exchange, split
statistics, finalize) and the vector widths 8/4/2/1. Results go to bench/results/<date>-sanitizer-*.md.
"""
import torch

from rocm_sd.ops.bias_add import bias_residual_kernel
from rocm_sd.ops.geglu import geglu_kernel
from rocm_sd.ops.group_norm import group_norm_kernel
from rocm_sd.ops.layer_norm import layer_norm_kernel


def main() -> None:
    torch.manual_seed(0)
    dev, h = "cuda", torch.float16
    for shape, groups in (((2, 64, 32, 32), 32), ((3, 96, 7, 9), 32), ((1, 32, 64, 64), 4)):
        for fmt in (torch.contiguous_format, torch.channels_last):
            x = torch.randn(shape, device=dev, dtype=h).contiguous(memory_format=fmt)
            w = torch.rand(shape[1], device=dev, dtype=h)
            ib = torch.randn(shape[0], shape[1], device=dev, dtype=h)
            paths = ("resident", "split") if fmt == torch.contiguous_format else ("split",)
            for path in paths:
                group_norm_kernel(x, groups, w, w, 1e-5, True, path=path)
                group_norm_kernel(x, groups, w, w, 1e-5, False, path=path, input_bias=ib)
            bias_residual_kernel(x, x.clone(), w, 0.5)
    for rows, c in ((64, 320), (7, 33), (3, 2048)):
        x = torch.randn(rows, c, device=dev, dtype=h)
        layer_norm_kernel(x, torch.rand(c, device=dev, dtype=h), None, 1e-5)
        geglu_kernel(torch.randn(rows, 2 * c, device=dev, dtype=h))
    x = torch.randn(2, 64, 16, 16, device=dev, dtype=torch.float32)
    group_norm_kernel(x, 32, None, None, 1e-5, True)
    torch.cuda.synchronize()
    print("all kernels ran")


if __name__ == "__main__":
    main()
