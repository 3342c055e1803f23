"""Conditioning without tokenizer files (none can be downloaded here): deterministic token ids from a prompt's words,
and the device a text encoder's inputs go to. Shared by the UNet (models.py) and transformer (dit_models.py)
builders."""
from __future__ import annotations

import hashlib

import torch


def prompt_token_ids(prompt: str, vocab_size: int, length: int = 77) -> torch.Tensor:
    """Deterministic token ids for a prompt (no tokenizer files can be downloaded here): one id per word
    from its hash, between CLIP's begin and end markers, padded with the end marker."""
    bos, eos = vocab_size - 2, vocab_size - 1
    words = [int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little") % (vocab_size - 2)
             for w in prompt.lower().split()][: length - 2]
    ids = [bos] + words + [eos] * (length - 1 - len(words))
    return torch.tensor([ids])


def input_device(pipe, module) -> torch.device:
    """Where `module`'s inputs go: the pipeline's execution device when diffusers knows one (with CPU offload the
    weights sit on the CPU or the meta device between calls and accelerate's hooks bring them to it)."""
    device = getattr(pipe, "_execution_device", None)
    return torch.device(device) if device is not None else module.device
