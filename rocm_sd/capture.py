"""What every graph capture in rocm_sd (graphs.GraphedCall, timing.graph_device_ms) shares.

- One warm-up side stream per device, for the process. torch gives every (BLAS handle, stream) pair its own
  cuBLAS / hipBLAS workspace (32 MiB on Hopper) and keeps it for the life of the process: a new stream per capture
  (or per timed candidate in the tuner) left a workspace allocated for good after every capture.
- No cycle collection while a capture runs. A graph in unreachable cycles (a model and the graphed call installed
  on it, after a test or a revert) that Python's collector frees mid-capture destroys its CUDA graph there, which is
  not permitted while a stream captures and invalidates the capture (torch 2.11 no longer collects before capturing).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager

import torch

_streams: dict[int, torch.cuda.Stream] = {}


def warmup_stream(device: torch.device | int | None = None) -> torch.cuda.Stream:
    """This process's warm-up side stream on `device` (the current device by default)."""
    index = None if device is None else torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    stream = _streams.get(index)
    if stream is None:
        stream = _streams[index] = torch.cuda.Stream(index)
    return stream


@contextmanager
def graph_capture(graph: torch.cuda.CUDAGraph, pool=None):
    """torch.cuda.graph(graph, pool=pool) with Python's cycle collector off inside, as it was after (the garbage waits
    for its next run)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    finally:
        if enabled:
            gc.enable()
