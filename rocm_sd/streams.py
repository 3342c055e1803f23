"""The side stream that warm-up calls before a graph capture run on: one per device, for the process.

torch gives every (BLAS handle, stream) pair its own cuBLAS / hipBLAS workspace (32 MiB on Hopper) and keeps it for
the life of the process. A new stream per capture (or per timed candidate in the tuner) therefore left a workspace
allocated for good after every capture, which revert() could not return: one stream per device pays it once.
"""
from __future__ import annotations

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
