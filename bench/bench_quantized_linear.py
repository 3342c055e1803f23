"""Per-shape microbenchmark of the 8-bit linear layers against F.linear: device time per call (microseconds), from a
CUDA graph of 20 calls replayed, so host time does not hide the kernels (the pipelines replay graphs too).

Columns: fp16 F.linear; quantize_rows alone; torch._scaled_mm on quantized input with row-wise scales, with fp32
promotion of the partial sums and with fast accumulation (the layer's choice on NVIDIA: modules/quantized_linear.py
FAST_ACCUMULATION); the same two with one scale per tensor (what a static, calibrated activation scale would allow);
the whole fp8 layer (quantize + GEMM); the whole int8 layer (torch._int_mm + dequantize).

    python bench/bench_quantized_linear.py
"""
import torch
import torch.nn.functional as F

from rocm_sd.modules.quantized_linear import RocmQuantizedLinear, new_model_call
from rocm_sd.ops.quantize import quantize_rows_kernel

CALLS = 20


def device_us(fn) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (5 * CALLS) * 1e3


def fresh(layer, x):
    new_model_call()  # the layer's input is quantized again on every call, as in a model call
    return layer(x)


# (M rows, K -> N): SDXL 1024 (batch 2 with CFG) and SD1.5 512 shapes of the attention projections, feed-forward
# and proj_in / proj_out, and the text embedding's keys and values.
SHAPES = [(8192, 640, 640), (8192, 640, 5120), (8192, 2560, 640), (2048, 1280, 1280), (2048, 1280, 10240),
          (2048, 5120, 1280), (8192, 320, 320), (8192, 1280, 320), (154, 2048, 640)]

if __name__ == "__main__":
    print("| M | K | N | fp16 linear | quantize | row-wise | row-wise fast | tensor-wise | tensor-wise fast "
          "| fp8 layer | fp8 layer vs fp16 | row-wise fast vs fp16 | tensor-wise fast vs fp16 | int8 layer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, device="cuda", dtype=torch.float16)
        linear = device_us(lambda: F.linear(x, w, b))
        layer = RocmQuantizedLinear(w, b, "e4m3fn").cuda()
        q, scale = quantize_rows_kernel(x, "e4m3fn")
        quantize = device_us(lambda: quantize_rows_kernel(x, "e4m3fn"))
        one = torch.ones((), device="cuda")
        gemm = {}
        for scales, (scale_a, scale_b) in {"row": (scale.unsqueeze(1), layer.weight_scale), "tensor": (one, one)}.items():
            for fast in (False, True):
                gemm[scales, fast] = device_us(lambda: torch._scaled_mm(
                    q, layer.weight_q.t(), scale_a=scale_a, scale_b=scale_b, bias=b, out_dtype=torch.float16,
                    use_fast_accum=fast))
        whole = device_us(lambda: fresh(layer, x))
        int8 = RocmQuantizedLinear(w, b, "int8").cuda()
        whole_int8 = device_us(lambda: fresh(int8, x))
        print(f"| {m} | {k} | {n} | {linear:.1f} | {quantize:.1f} | {gemm['row', False]:.1f} | {gemm['row', True]:.1f} "
              f"| {gemm['tensor', False]:.1f} | {gemm['tensor', True]:.1f} | {whole:.1f} | {linear / whole:.2f} "
              f"| {linear / gemm['row', True]:.2f} | {linear / gemm['tensor', True]:.2f} | {whole_int8:.1f} |", flush=True)
