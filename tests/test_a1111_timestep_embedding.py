"""The SDXL UNet's timestep embedding in the webui (patch/a1111_graph.py): generative-models' own copies its
frequencies from the CPU on every call, which a graph capture refuses; rocm_sd's gives the same bits without a copy
per call, installed where the webui's hijack (a CondFunc) calls it."""
from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from rocm_sd.patch import a1111_graph
from rocm_sd.patch.core import PatchRecord


def sgm_timestep_embedding(timesteps, dim, max_period=10000, repeat_only=False):
    """generative-models (sgm/modules/diffusionmodules/util.py, as the webui v1.10.1 checks it out), verbatim."""
    if not repeat_only:
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half
                          ).to(device=timesteps.device)
        args = timesteps[:, None].float() * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    else:
        embedding = timesteps[:, None].repeat(1, dim)
    return embedding


class CondFunc:
    """The webui's modules/sd_hijack_utils.CondFunc, reduced to what the site lookup sees: a lambda closing over an
    instance whose private __orig_func is the hijacked function."""

    def __new__(cls, holder, name, sub_func):
        self = super().__new__(cls)
        self.__orig_func, self.__sub_func = getattr(holder, name), sub_func
        setattr(holder, name, lambda *args, **kwargs: self(*args, **kwargs))
        return self

    def __call__(self, *args, **kwargs):
        return self.__sub_func(self.__orig_func, *args, **kwargs)


@pytest.fixture
def sgm(monkeypatch):
    util = types.ModuleType("sgm.modules.diffusionmodules.util")
    util.timestep_embedding = sgm_timestep_embedding
    openaimodel = types.ModuleType("sgm.modules.diffusionmodules.openaimodel")
    openaimodel.timestep_embedding = util.timestep_embedding
    monkeypatch.setitem(sys.modules, util.__name__, util)
    monkeypatch.setitem(sys.modules, openaimodel.__name__, openaimodel)
    return util, openaimodel


def devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dim", [320, 1280, 256, 7])
def test_same_bits_as_generative_models(sgm, device, dim):
    t = torch.tensor([999.0, 500.5, 1.0, 0.0], device=device)
    for repeat_only in (False, True):
        ours = a1111_graph.sgm_timestep_embedding(t, dim, repeat_only=repeat_only)
        theirs = sgm_timestep_embedding(t, dim, repeat_only=repeat_only)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def test_found_inside_the_webuis_hijack_and_put_back(sgm):
    util, openaimodel = sgm
    hijack = CondFunc(openaimodel, "timestep_embedding", lambda orig, *a, **k: orig(*a, **k).to(torch.float16))
    holder, name = a1111_graph.sgm_timestep_embedding_site()
    assert holder is hijack and getattr(holder, name) is util.timestep_embedding
    record = PatchRecord(flags={})
    record.set_attr(holder, name, a1111_graph.sgm_timestep_embedding)
    t = torch.tensor([10.0, 20.0])
    out = openaimodel.timestep_embedding(t, 320)  # through the hijack: cast to fp16 as the webui's sub function does
    assert out.dtype == torch.float16 and torch.equal(out, sgm_timestep_embedding(t, 320).half())
    record.revert()
    assert getattr(holder, name) is util.timestep_embedding


def test_found_as_the_module_global_without_a_hijack(sgm):
    _, openaimodel = sgm
    assert a1111_graph.sgm_timestep_embedding_site() == (openaimodel, "timestep_embedding")


def test_not_found_when_something_else_is_there(sgm):
    _, openaimodel = sgm
    openaimodel.timestep_embedding = lambda *a, **k: None  # another version's own function: left alone
    assert a1111_graph.sgm_timestep_embedding_site() is None


@pytest.mark.gpu
def test_captures_where_generative_models_cannot(sgm):
    t = torch.tensor([999.0, 1.0], device="cuda")
    a1111_graph.sgm_timestep_embedding(t, 320)  # the first call per size and device copies the frequencies
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = a1111_graph.sgm_timestep_embedding(t, 320)
    t.copy_(torch.tensor([500.0, 2.0]))
    graph.replay()
    assert torch.equal(out, sgm_timestep_embedding(t, 320))
