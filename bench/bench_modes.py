"""optimize() modes side by side on one random-weight pipeline: median seconds per image, first call, peak memory,
PSNR against the first mode's image, NaN check, what was replaced, and device time per kernel category over two
steps (torch profiler).

    python bench/bench_modes.py sd15 50 out.json fp16,fp8,fp8row,fp8noconv,fp8all,int8,deepcache3,deepcache3b1,adaptive0.15,attnfp8

'fp8row' is precision_scales="row" (a scale per row and output channel everywhere); 'fp8noconv' is precision_convs=False
(the resnets' convolutions stay fp16). The FP8 convolutions' GEMMs count as "gemm", their patches as "im2col".

'attnfp8' is attention_precision="fp8" as shipped (the FP8 attention where the tuning database measured it faster);
'attnfp8forced' runs the FP8 attention kernel at every shape (ROCM_SD_BACKEND's attention_fp8:rocm_sd), to see what
it would cost and change where it was not chosen.
"""
import contextlib
import json, statistics, sys, time
import numpy as np
import torch
import rocm_sd
from rocm_sd import dispatch, models
from rocm_sd.bench import psnr

model, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
MODES = sys.argv[4].split(",") if len(sys.argv) > 4 else ["fp16", "fp8", "int8"]
def keywords(mode):
    """'deepcache3', 'deepcache3b1' (cache_branch 1), 'adaptive0.15', 'adaptive0.15b1', 'fp8', 'fp8all'
    (precision_layers="all"); any of them + 'qkv' / 'noqkv': with fuse_qkv=True / False; + 'notextkv': text_kv=False."""
    if mode.endswith("notextkv"): return {**keywords(mode[:-8]), "text_kv": False}
    if mode.endswith("noqkv"): return {**keywords(mode[:-5]), "fuse_qkv": False}
    if mode.endswith("qkv"): return {**keywords(mode[:-3]), "fuse_qkv": True}
    if mode.startswith("attnfp8"): return {"attention_precision": "fp8"}
    if mode.endswith("all"): return {"precision": mode[:-3], "precision_layers": "all"}
    if mode.endswith("row"): return {"precision": mode[:-3], "precision_scales": "row"}
    if mode.endswith("noconv"): return {"precision": mode[:-6], "precision_convs": False}
    mode, _, branch = mode.partition("b")
    branch = {"cache_branch": int(branch)} if branch else {}
    if mode.startswith("deepcache"): return {"cache": "deepcache", "cache_interval": int(mode[9:] or 3), **branch}
    if mode.startswith("adaptive"): return {"cache": "adaptive", "cache_threshold": float(mode[8:] or 0.15), **branch}
    return {"precision": mode}
size = models.default_size(model)
pipe = models.build_sd_pipeline(model, "cuda", torch.float16)
kw = models.prompt_kwargs(pipe, "a watercolor painting of a lighthouse at dawn")

def generate():
    with torch.no_grad():
        img = pipe(**kw, num_inference_steps=steps, height=size, width=size, output_type="np",
                   generator=torch.Generator("cuda").manual_seed(0)).images[0]
    torch.cuda.synchronize()
    return img

def category(name):
    n = name.lower()
    # rocm_sd's kernels first, by their own names (a template argument may name another kernel's types)
    if "quantize_rows_kernel" in n: return "quantize"
    if "im2col_quantize_kernel" in n: return "im2col"
    if "geglu_rows_quantized" in n or "geglu_row_block_quantized" in n or "geglu_bounded_quantized" in n or ("layer_norm_rows" in n and ", true>" in n): return "norm/geglu + quantize"
    if "layer_norm_rows" in n or "geglu_kernel" in n: return "norm/geglu"
    # Attention before convolutions (cuDNN's flash attention kernels say "fprop"), convolutions before GEMMs (cuDNN's
    # say "implicit_gemm"); runs before 2026-11-25 (FP8 convolutions) counted cuDNN's attention as "conv" and its
    # convolutions as "gemm".
    if any(s in n for s in ("attention", "flash", "fmha", "sdpa", "attn")): return "attention"
    if any(s in n for s in ("conv", "implicit", "winograd", "fprop", "dgrad", "cudnn")): return "conv"
    if any(s in n for s in ("gemm", "cutlass", "sm90_xmma", "cublas", "matmul", "_mm", "nvjet", "scaled_mm", "f8f8", "int8", "s8")): return "gemm"
    return "other"

rows = []
ref_img = None
for precision in MODES:
  forced = dispatch.force_backend("attention_fp8", "rocm_sd") if precision.endswith("forced") else contextlib.nullcontext()
  with forced:
    rocm_sd.optimize(pipe, **keywords(precision))
    dispatch.reset_stats()
    first = time.perf_counter(); img = generate(); first = time.perf_counter() - first
    report = rocm_sd.report(pipe)["unet"]  # after the first call: precision_layers="measured" decides there
    times = []
    for _ in range(5):
        t = time.perf_counter(); img = generate(); times.append(time.perf_counter() - t)
    torch.cuda.reset_peak_memory_stats(); generate(); peak = torch.cuda.max_memory_allocated() / 2**20
    if ref_img is None: ref_img = img
    # one UNet step's device time by category (eager, graphs off for visibility of kernels inside replay is fine)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.no_grad():
            pipe(**kw, num_inference_steps=2, height=size, width=size, output_type="latent",
                 generator=torch.Generator("cuda").manual_seed(0))
        torch.cuda.synchronize()
    cats, kernels = {}, []
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0):
            cats[category(e.key)] = cats.get(category(e.key), 0) + e.self_device_time_total / 1e3
            kernels.append((e.self_device_time_total / 1e3, e.count, e.key[:160]))
    row = {"precision": precision, "median_s": statistics.median(times), "first_s": first, "peak_mb": peak,
           "psnr_vs_fp16": psnr(img, ref_img), "nan": bool(np.isnan(img).any()),
           "replaced": {k: v for k, v in report.items() if "GEMM" in k or "kept in" in k or "not applied" in k or "step cache" in k or "partial" in k or "attention ->" in k},
           "attention_fp8_calls": dispatch.stats().get("attention_fp8", {}),
           # the quantizing ops' Python-level calls (first call, warm-ups and captures; graph replays do not count)
           "quantizing_op_calls": {op: calls for op, calls in sorted(dispatch.stats().items())
                                   if "quantiz" in op or "im2col" in op},
           "profile_ms_2_steps": {k: round(v, 2) for k, v in sorted(cats.items())},
           "top_kernels_ms_calls": [(round(ms, 2), calls, name[:90]) for ms, calls, name in sorted(kernels, reverse=True)[:12]]}
    print(json.dumps(row), flush=True)
    row["kernels_ms_calls"] = [(round(ms, 3), calls, category(name), name) for ms, calls, name in sorted(kernels, reverse=True)]
    rows.append(row)
    rocm_sd.revert(pipe)
json.dump({"model": model, "steps": steps, "size": size, "device": torch.cuda.get_device_name(), "rows": rows},
          open(out, "w"), indent=1)
