"""Device time of a GPU call as a graph-captured model would see it: the tuner and the benchmarks.

The calls over all the inputs are captured in one CUDA/HIP graph and the graph is replayed: what is
measured is the kernels' device time, not the Python and launch overhead that eager timing of a
microsecond-scale kernel would mostly measure (and that rocm_sd's graphed pipelines do not pay).
Inputs rotate through copies larger than the L2 cache, as the model streams activations from memory.
"""
from __future__ import annotations

import statistics

import torch

from .capture import graph_capture, warmup_stream


def graph_device_ms(fn, inputs: list[tuple], replays: int = 10, trials: int = 5) -> float:
    """Median device milliseconds of one fn(*args) call, args cycling through `inputs`."""
    stream = warmup_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in inputs:  # warm-up outside the graph: lazy init, allocator pools
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph):
        outputs = [fn(*args) for args in inputs]
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / (replays * len(inputs)))
    del outputs
    return statistics.median(samples)
