"""The Composable Kernel instance generator (ck_templates/): names, sources, registry. Compiling them is
a build check (tests/test_build.py)."""
import pytest

from ck_templates import generate
from ck_templates.instances import (ATTENTION_INSTANCES, CONV_BIAS_RESIDUAL_INSTANCES, GROUP_NORM_INSTANCES,
                                    LINEAR_GEGLU_INSTANCES, XDL_TILES, AttentionInstance, GroupNormInstance, XdlTile)


def test_names_encode_every_parameter_and_are_unique():
    names = [i.name for i in GROUP_NORM_INSTANCES]
    assert len(set(names)) == len(names)
    inst = GroupNormInstance("swish", 256, 1, 256, 1, 16, 8)
    assert inst.name == "ck_group_norm_swish_f16_b256_c1x256_s1x16_v8"
    assert {"swish", "pass"} == {i.act for i in GROUP_NORM_INSTANCES}


@pytest.mark.parametrize("bad", [dict(act="relu"), dict(m_cluster=2), dict(k_slice=4, vector=8)])
def test_inconsistent_instances_are_refused(bad):
    params = dict(act="swish", block=256, m_cluster=1, k_cluster=256, m_slice=1, k_slice=8, vector=8) | bad
    with pytest.raises(ValueError):
        GroupNormInstance(**params)


def test_attention_names_encode_every_parameter_and_are_unique():
    names = [i.name for i in ATTENTION_INSTANCES]
    assert len(set(names)) == len(names)
    inst = AttentionInstance(True, 128, 64, 32, 128, 1, 2, 4)
    assert inst.name == "ck_attention_f16_pad_b256_m128_n64_k32_o128_x32_w1x2x4"
    assert any(i.padded for i in ATTENTION_INSTANCES) and any(not i.padded for i in ATTENTION_INSTANCES)


@pytest.mark.parametrize("bad", [dict(k_per_block=16), dict(o_per_block=96), dict(n_xdl_per_wave=3),
                                 dict(o_xdl_per_wave=2)])
def test_inconsistent_attention_instances_are_refused(bad):
    params = dict(padded=True, m_per_block=128, n_per_block=64, k_per_block=32, o_per_block=128, m_xdl_per_wave=1,
                  n_xdl_per_wave=2, o_xdl_per_wave=4) | bad
    with pytest.raises(ValueError):
        AttentionInstance(**params)


def test_attention_sources_carry_the_tile_and_the_padding(tmp_path):
    start = len(GROUP_NORM_INSTANCES)
    paths = generate.write(str(tmp_path))[start:start + len(ATTENTION_INSTANCES)]
    for inst, path in zip(ATTENTION_INSTANCES, paths):
        text = open(path).read()
        assert path.endswith(f"{inst.name}.hip") and f"const char* {inst.name}(const AttentionArgs& a)" in text
        tile = f"{inst.block}, {inst.m_per_block}, {inst.n_per_block}, {inst.k_per_block}, {inst.o_per_block}, 32"
        assert tile in text
        assert ("GemmSpecialization::MNKOPadding" in text) == inst.padded
        assert "MaskingSpecialization::MaskDisabled" in text
    registry = (tmp_path / "ck_registry.h").read_text()
    assert registry.count('{"ck_attention_') == len(ATTENTION_INSTANCES)


def test_one_source_per_instance_and_a_registry(tmp_path):
    paths = generate.write(str(tmp_path))
    assert len(paths) == len(GROUP_NORM_INSTANCES) + len(ATTENTION_INSTANCES) + len(LINEAR_GEGLU_INSTANCES) + \
        len(CONV_BIAS_RESIDUAL_INSTANCES)
    for inst, path in zip(GROUP_NORM_INSTANCES, paths):
        text = open(path).read()
        assert path.endswith(f"{inst.name}.hip") and f"const char* {inst.name}(" in text
        assert f"{inst.block}, {inst.m_cluster}, {inst.k_cluster}, {inst.m_slice}, {inst.k_slice}" in text
        assert ("element_wise::Swish" in text) == (inst.act == "swish")
    registry = (tmp_path / "ck_registry.h").read_text()
    assert registry.count('{"ck_group_norm_') == len(GROUP_NORM_INSTANCES)


def test_generation_is_deterministic_and_leaves_unchanged_files_alone(tmp_path):
    first = generate.write(str(tmp_path))
    stamps = {p: (tmp_path / p).stat().st_mtime_ns for p in [p.split("/")[-1] for p in first]}
    second = generate.write(str(tmp_path))
    assert first == second
    assert stamps == {p: (tmp_path / p).stat().st_mtime_ns for p in stamps}


def test_ck_reasons_name_what_the_instances_cannot_take():
    import torch

    from rocm_sd.ops.group_norm import ck_reasons

    x = torch.empty(2, 64, 8, 8, dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.ones(64, dtype=torch.float16)
    assert ck_reasons(x, w, w, None) == []
    assert ck_reasons(x.contiguous(), w, w, None) == ["CK instances take 4-D channels_last input"]
    assert ck_reasons(x.float(), w, w, None) == ["CK instances take fp16 input, weight and bias"]
    assert ck_reasons(x, None, w, None) == ["CK instances take fp16 input, weight and bias"]
    assert ck_reasons(x, w, w, torch.zeros(2, 64)) == ["CK instances have no input bias"]


def test_ck_attention_reasons_and_tuner_candidates(monkeypatch):
    import importlib

    import torch

    attention = importlib.import_module("rocm_sd.ops.attention")
    from rocm_sd.tune import problems

    q = torch.empty(2, 77, 8, 40, dtype=torch.float16)
    assert attention.ck_reasons(q, q, q, 0.125) == []
    assert "CK attention instances take float16, not torch.bfloat16" in attention.ck_reasons(*[q.bfloat16()] * 3, 0.125)
    assert attention.ck_instances() == []  # CPU build: no CK
    monkeypatch.setattr(problems, "attention_ck_instances", lambda: ["ck_attention_a", "ck_attention_b"])
    assert {"ck:ck_attention_a", "ck:ck_attention_b"} <= set(problems._attention_candidates(q, q, q, 0.125))
    assert not any(c.startswith("ck:") for c in problems._attention_candidates(*[q.bfloat16()] * 3, 0.125))


def test_a_tuned_ck_attention_instance_is_dispatched_to(monkeypatch):
    import importlib

    import torch

    from rocm_sd import dispatch

    attention = importlib.import_module("rocm_sd.ops.attention")
    calls = []
    monkeypatch.setattr(attention, "tuned_choice_for", lambda *a: "ck:ck_attention_a")
    monkeypatch.setattr(attention, "attention_ck", lambda name, *a: calls.append(name) or torch.zeros_like(a[0]))
    q = torch.randn(1, 16, 2, 40, dtype=torch.float16)
    monkeypatch.setattr(attention, "ck_instances", lambda: ["ck_attention_a"])
    attention._plans.clear()
    attention.attention.call(q, q, q, 0.125)
    assert calls == ["ck_attention_a"] and dispatch.stats()["attention"] == {"rocm_sd": 1}

    monkeypatch.setattr(attention, "ck_instances", lambda: [])  # a database from a CK build, used without CK
    attention._plans.clear()
    out = attention.attention.call(q, q, q, 0.125)  # rocm_sd's own kernel would run; on the CPU, PyTorch
    attention._plans.clear()
    assert calls == ["ck_attention_a"]
    torch.testing.assert_close(out, attention.attention_ref(q, q, q, 0.125))


def test_tuned_choices_naming_a_ck_instance():
    from rocm_sd import dispatch

    assert dispatch.ck_instance("ck:ck_attention_a") == "ck_attention_a"
    assert [dispatch.ck_instance(c) for c in (None, "torch", "rocm_sd:split", "ck:", "ck")] == [None] * 5


def test_xdl_tiles_derive_ck_transfer_layouts_as_its_tables_pair_them():
    # CK's f16 GEMM / grouped conv forward tables: 256 threads, 256x128x32, 4x2 XDL per wave -> A/B cluster
    # S<4, 64, 1>, epilogue S<1, 32, 1, 8>; 128 threads, 128x64x32, 2x2 -> S<4, 32, 1>, S<1, 32, 1, 4>.
    big, small = XdlTile(256, 256, 128, 32, 4, 2), XdlTile(128, 128, 64, 32, 2, 2)
    assert (big.ab_cluster, big.out_cluster) == ("S<4, 64, 1>", "S<1, 32, 1, 8>")
    assert (small.ab_cluster, small.out_cluster) == ("S<4, 32, 1>", "S<1, 32, 1, 4>")
    assert big.template_args().startswith("1, 256, 256, 128, 32, 8, 8, 32, 32, 4, 2, S<4, 64, 1>")
    assert big.template_args().endswith("1, 1, S<1, 32, 1, 8>, 8")
    assert len({t.tag for t in XDL_TILES}) == len(XDL_TILES)


@pytest.mark.parametrize("bad", [dict(m_xdl_per_wave=2), dict(block=128), dict(k_per_block=12)])
def test_inconsistent_xdl_tiles_are_refused(bad):
    with pytest.raises(ValueError):
        XdlTile(**(dict(block=256, m_per_block=256, n_per_block=128, k_per_block=32, m_xdl_per_wave=4,
                        n_xdl_per_wave=2) | bad))


def test_gemm_and_conv_sources_carry_the_tile_and_their_epilogues(tmp_path):
    paths = generate.write(str(tmp_path))[len(GROUP_NORM_INSTANCES) + len(ATTENTION_INSTANCES):]
    instances = LINEAR_GEGLU_INSTANCES + CONV_BIAS_RESIDUAL_INSTANCES
    assert len(paths) == len(instances)
    for inst, path in zip(instances, paths):
        text = open(path).read()
        assert path.endswith(f"{inst.name}.hip") and inst.tile.template_args() in text
        if inst in LINEAR_GEGLU_INSTANCES:
            assert f"const char* {inst.name}(const LinearGegluArgs& a)" in text
            assert "AddGelu" in text and "AddMultiply" in text and "DeviceGemmMultipleD_Xdl_CShuffle" in text
        else:
            assert f"const char* {inst.name}(const ConvBiasResidualArgs& a)" in text
            assert "BiasResidualScale" in text and "NHWGC, GKYXC" in text
    registry = (tmp_path / "ck_registry.h").read_text()
    assert registry.count('{"ck_linear_geglu_') == len(LINEAR_GEGLU_INSTANCES)
    assert registry.count('{"ck_conv_bias_residual_') == len(CONV_BIAS_RESIDUAL_INSTANCES)
