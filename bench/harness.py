"""Timing and result files shared by the kernel benchmarks (protocol: docs/performance.md).

Device time is measured by replaying a CUDA/HIP graph that runs the op over a rotating set of
input buffers (together larger than L2, so each call starts with cold inputs as in a real model
whose activations do not fit), timed with device events; launch overhead is out of the numbers.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rocm_sd.bench import append_run, run_meta  # noqa: E402
from rocm_sd.timing import graph_device_ms  # noqa: E402

ROTATE_BYTES = 256 << 20


def rotating_inputs(make, bytes_per_input: int) -> list:
    count = max(2, min(64, -(-ROTATE_BYTES // max(1, bytes_per_input))))
    return [make() for _ in range(count)]


def wall_ms(fn, repeats: int, warmup: int = 3):
    """(median wall milliseconds of one synchronized fn() call after `warmup` calls, the last warm-up's result):
    what a user waits for, host time included (whole model calls in eager hosts, graphed calls)."""
    for _ in range(warmup):
        out = fn()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), out


def device_ms(fn, inputs: list, replays: int = 10, trials: int = 5) -> float:
    """Median device milliseconds of one fn(input) call (graph replays, rocm_sd/timing.py)."""
    return graph_device_ms(fn, [(x,) for x in inputs], replays, trials)


def copy_ceiling_gbps(trials: int = 5, iters: int = 10) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written (1 GiB fp16 copy).
    Timed with events outside a graph: a captured copy becomes a graph memcpy node that may run on
    a copy engine, far slower than the SM copy kernels a real op competes with."""
    n = 512 << 20
    src = torch.randn(n, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    samples = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return 2 * n * 2 / statistics.median(samples) / 1e6


def same_bytes_copy_ms(nbytes_moved: int) -> float:
    """Device ms of a streaming copy kernel moving `nbytes_moved` (half read, half written) over rotating
    buffers, timed like the ops: what "copy bandwidth" means at this size, where launch and ramp-up cost
    a larger share than in the 1 GiB ceiling. An elementwise kernel (torch.neg into a preallocated
    output), not copy_: captured into a graph, copy_ becomes a memcpy node that may take a copy engine."""
    n = max(1, nbytes_moved // 4)  # fp16 elements in each of source and destination
    pairs = rotating_inputs(lambda: (torch.randn(n, device="cuda", dtype=torch.float16),
                                     torch.empty(n, device="cuda", dtype=torch.float16)), 4 * n)
    return graph_device_ms(lambda src, dst: torch.neg(src, out=dst), pairs, 10, 5)


def write_results(what: str, rows: list[dict], table: str, out_dir: str) -> str:
    """Prints `table` and appends the run (rows and its date, device, torch, commit and command) to
    <out_dir>/data/<what>-<device>.jsonl (rocm_sd/bench.py, "Result files"); returns a line saying where."""
    print(table)
    command = " ".join([os.path.basename(sys.executable)] + sys.argv)
    path, run = append_run(out_dir, what, run_meta(torch.cuda.get_device_name(), command), rows)
    return f"appended run {run['run']} to {path} (python bench/render_results.py renders it)"


def kernel_bench_args(description: str, more=None):
    """The command line every kernel benchmark takes: --out-dir and --dtype; more(parser) adds a benchmark's own."""
    import argparse

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    if more is not None:
        more(parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():  # a kernel benchmark times the GPU: say so instead of torch's assertion
        parser.exit(2, f"{parser.prog}: no GPU visible to torch {torch.__version__}; kernel benchmarks time a GPU\n")
    return args


def compare_with_torch(op: str, args, shapes, setup, bytes_moved) -> None:
    """torch vs rocm_sd at each shape: device ms, speed-up, GB/s against the measured copy ceiling.

    setup(shape, dtype) -> (inputs, torch_fn, kernel_fn, reasons): rotating inputs, the two callables
    taking one input, and why the kernel cannot run (empty: it can). bytes_moved(shape, dtype): the
    least traffic any implementation needs. Appends the run to bench/results/data/<op>-<device>.jsonl.
    """
    dtype = getattr(torch, args.dtype)
    ceiling = copy_ceiling_gbps()
    rows = [{"op": "copy", "shape": "1Gi fp16", "gbps": round(ceiling, 1)}]
    lines = [f"Copy ceiling (read + write, 1 GiB): {ceiling:.0f} GB/s. Device time from graph replays over rotating "
             "inputs. 'same-bytes copy': a streaming copy kernel moving the op's bytes at this size (the ceiling "
             "a memory-bound op of this size can hope for); the last column is its time over rocm_sd's.", "",
             "| shape | torch ms | rocm_sd ms | speed-up | rocm_sd GB/s | % of copy | same-bytes copy ms | "
             "% of same-bytes copy |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in shapes:
        inputs, torch_fn, kernel_fn, reasons = setup(shape, dtype)
        if reasons:
            raise SystemExit(f"rocm_sd kernel cannot run {shape}: {reasons}")
        times = {"torch": device_ms(torch_fn, inputs), "rocm_sd": device_ms(kernel_fn, inputs)}
        copy_ms = same_bytes_copy_ms(bytes_moved(shape, dtype))
        for backend, ms in times.items():
            gbps = bytes_moved(shape, dtype) / ms / 1e6
            rows.append({"op": op, "shape": str(shape), "dtype": args.dtype, "backend": backend, "ms": round(ms, 4),
                         "gbps": round(gbps, 1), "pct_copy": round(100 * gbps / ceiling, 1),
                         "same_bytes_copy_ms": round(copy_ms, 4), "pct_same_bytes_copy": round(100 * copy_ms / ms, 1)})
        k = rows[-1]
        lines.append(f"| {shape} | {times['torch']:.4f} | {times['rocm_sd']:.4f} | "
                     f"{times['torch'] / times['rocm_sd']:.1f}x | {k['gbps']:.0f} | {k['pct_copy']:.1f} | "
                     f"{copy_ms:.4f} | {k['pct_same_bytes_copy']:.1f} |")
        print(lines[-1], flush=True)
    print(write_results(op, rows, "\n".join(lines), args.out_dir))
