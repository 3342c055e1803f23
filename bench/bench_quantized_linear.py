"""Per-shape microbenchmark of RocmQuantizedLinear against F.linear (eager calls in a loop, microseconds, host time
included): python bench/bench_quantized_linear.py"""
import torch, torch.nn.functional as F
from rocm_sd.ops.quantize import quantize_rows, quantize_rows_kernel
from rocm_sd.modules.quantized_linear import RocmQuantizedLinear
def t(fn, n=50):
    for _ in range(5): fn()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n * 1e3
print("| M | K | N | fp16 linear us | quantize us | fp8 scaled_mm us | fp8 total | speed-up | int8 total |")
for M, K, N in [(8192, 640, 640), (8192, 640, 5120), (8192, 2560, 640), (2048, 1280, 1280), (2048, 1280, 10240), (2048, 5120, 1280), (8192, 320, 320), (8192, 1280, 320), (154, 2048, 640)]:
    x = torch.randn(M, K, device="cuda", dtype=torch.float16); w = torch.randn(N, K, device="cuda", dtype=torch.float16); b = torch.randn(N, device="cuda", dtype=torch.float16)
    lin = t(lambda: F.linear(x, w, b))
    layer = RocmQuantizedLinear(w, b, "e4m3fn").cuda()
    q, s = quantize_rows_kernel(x, "e4m3fn")
    qt = t(lambda: quantize_rows_kernel(x, "e4m3fn"))
    mm = t(lambda: layer.matmul(q, s, torch.float16))
    tot = t(lambda: layer(x))
    l8 = RocmQuantizedLinear(w, b, "int8").cuda()
    i8 = t(lambda: l8(x))
    print(f"| {M} | {K} | {N} | {lin:.1f} | {qt:.1f} | {mm:.1f} | {tot:.1f} | {lin/tot:.2f} | {i8:.1f} |")
