"""The Composable Kernel instance generator (ck_templates/): names, sources, registry. Compiling them is
a build check (tests/test_build.py)."""
import pytest

from ck_templates import generate
from ck_templates.instances import (ATTENTION_INSTANCES, ATTENTION_WMMA_INSTANCES, ATTENTION_XDL_INSTANCES,
                                    CONV_BIAS_RESIDUAL_INSTANCES, GROUP_NORM_INSTANCES, LINEAR_GEGLU_INSTANCES,
                                    WMMA_CONV_TILES, WMMA_GEMM_TILES, XDL_TILES, AttentionInstance,
                                    AttentionWmmaInstance, GroupNormInstance, WmmaTile, XdlTile)

# A CDNA and an RDNA3 / RDNA4 target each: every instance is generated for one of them.
TARGETS = ["gfx942", "gfx1100", "gfx1201"]


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
    assert any(i.padded for i in ATTENTION_XDL_INSTANCES) and any(not i.padded for i in ATTENTION_XDL_INSTANCES)
    wmma = AttentionWmmaInstance(128, 64, 128, 80, 80, 64, 8, 5, k_threads=2)
    assert wmma.name == "ck_attention_f16_wmma_pad_b128_m64_n128_k80_o80_t64_x16_r8x5_c2"
    assert all("_wmma_" in i.name for i in ATTENTION_WMMA_INSTANCES)
    assert all("_wmma_" not in i.name for i in ATTENTION_XDL_INSTANCES)


@pytest.mark.parametrize("bad", [dict(k_per_block=16), dict(o_per_block=96), dict(n_xdl_per_wave=3),
                                 dict(o_xdl_per_wave=2)])
def test_inconsistent_attention_instances_are_refused(bad):
    params = dict(padded=True, m_per_block=128, n_per_block=64, k_per_block=32, o_per_block=128, m_xdl_per_wave=1,
                  n_xdl_per_wave=2, o_xdl_per_wave=4) | bad
    with pytest.raises(ValueError):
        AttentionInstance(**params)


@pytest.mark.parametrize("bad", [dict(block=128), dict(n_repeat=4), dict(o_per_block=96), dict(k_per_block=44),
                                 dict(n_tile=48)])
def test_inconsistent_wmma_attention_instances_are_refused(bad):
    params = dict(block=256, m_per_block=128, n_per_block=128, k_per_block=64, o_per_block=64, n_tile=64,
                  n_repeat=8, o_repeat=4, k_threads=8) | bad
    with pytest.raises(ValueError):
        AttentionWmmaInstance(**params)


def test_wmma_attention_sources_carry_the_tile_and_refuse_unpacked_tensors(tmp_path):
    # CK's 8-wave example tile: 256 threads, 128 queries x 128 keys, K 64, O 64, key tile 64, 1 x 8 x 4 repeats.
    inst = ATTENTION_WMMA_INSTANCES[0]
    text = generate.attention_source(inst)
    assert "DeviceBatchedGemmSoftmaxGemmPermute_Wmma_CShuffle<" in text and "MNKOPadding" in text
    assert "1, 256,\n    128, 128, 64, 8, 8, 64, 64, 8, 16, 16, 16,\n    1, 8, 4," in text
    assert "S<2, 128, 1>" in text and "S<8, 32, 1>" in text and "S<2, 16, 8>, S<0, 2, 1>, S<0, 2, 1>, 1, 1, 1" in text
    assert "S<1, 128, 1, 2>, 8, MaskingSpecialization::MaskDisabled" in text
    assert text.count("packed_bshd(") == 4 and "MakeArgument(" in text and "MakeArgumentPointer" not in text


def test_attention_sources_carry_the_tile_and_the_padding(tmp_path):
    start = len(GROUP_NORM_INSTANCES)
    paths = generate.write(str(tmp_path), ["gfx942"])[start:start + len(ATTENTION_XDL_INSTANCES)]
    for inst, path in zip(ATTENTION_XDL_INSTANCES, paths):
        text = open(path).read()
        assert path.endswith(f"{inst.name}.hip") and f"const char* {inst.name}(const AttentionArgs& a)" in text
        tile = f"{inst.block}, {inst.m_per_block}, {inst.n_per_block}, {inst.k_per_block}, {inst.o_per_block}, 32"
        assert tile in text
        assert ("GemmSpecialization::MNKOPadding" in text) == inst.padded
        assert "MaskingSpecialization::MaskDisabled" in text
    registry = (tmp_path / "ck_registry.h").read_text()
    assert registry.count('{"ck_attention_') == len(ATTENTION_XDL_INSTANCES)


def test_one_source_per_instance_and_a_registry(tmp_path):
    paths = generate.write(str(tmp_path), TARGETS)
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
    first = generate.write(str(tmp_path), TARGETS)
    stamps = {p: (tmp_path / p).stat().st_mtime_ns for p in [p.split("/")[-1] for p in first]}
    second = generate.write(str(tmp_path), TARGETS)
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
    monkeypatch.setattr(attention, "ck_instances", lambda device=None: ["ck_attention_a", "ck_attention_b"])
    assert {"ck:ck_attention_a", "ck:ck_attention_b"} <= set(problems.OPS["attention"].candidates(q, q, q, 0.125))
    assert not any(c.startswith("ck:") for c in problems.OPS["attention"].candidates(*[q.bfloat16()] * 3, 0.125))


def test_a_tuned_ck_attention_instance_is_dispatched_to(monkeypatch):
    import importlib

    import torch

    from rocm_sd import dispatch

    attention = importlib.import_module("rocm_sd.ops.attention")
    calls = []
    monkeypatch.setattr(dispatch, "tuned_choice", lambda device, key_fn: "ck:ck_attention_a")
    monkeypatch.setattr(attention, "attention_ck", lambda name, *a: calls.append(name) or torch.zeros_like(a[0]))
    q = torch.randn(1, 16, 2, 40, dtype=torch.float16)
    monkeypatch.setattr(attention, "ck_instances", lambda device=None: ["ck_attention_a"])
    attention.SPEC.plans.clear()
    attention.attention.call(q, q, q, 0.125)
    assert calls == ["ck_attention_a"] and dispatch.stats()["attention"] == {"rocm_sd": 1}

    monkeypatch.setattr(attention, "ck_instances", lambda device=None: [])  # a CK build's database, used without CK
    attention.SPEC.plans.clear()
    out = attention.attention.call(q, q, q, 0.125)  # rocm_sd's own kernel would run; on the CPU, PyTorch
    attention.SPEC.plans.clear()
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
    paths = generate.write(str(tmp_path), TARGETS)[len(GROUP_NORM_INSTANCES) + len(ATTENTION_INSTANCES):]
    instances = LINEAR_GEGLU_INSTANCES + CONV_BIAS_RESIDUAL_INSTANCES
    assert len(paths) == len(instances)
    for inst, path in zip(instances, paths):
        text = open(path).read()
        xdl = isinstance(inst.tile, XdlTile)
        assert path.endswith(f"{inst.name}.hip")
        assert ("#define CK_USE_WMMA 1" in text) == (not xdl)
        if inst in LINEAR_GEGLU_INSTANCES:
            assert f"const char* {inst.name}(const LinearGegluArgs& a)" in text
            assert "AddGelu" in text and "AddMultiply" in text
            if xdl:
                assert inst.tile.template_args() in text and "DeviceGemmMultipleD_Xdl_CShuffle<" in text
            else:  # the gate GEMM has one D tensor, the hidden one two: a vector width each, and E's
                assert inst.tile.gemm_args(1) in text and inst.tile.gemm_args(2) in text
                assert "DeviceGemmMultipleD_Wmma_CShuffleV3<" in text and text.count("a.n, 1, PassThrough{}") == 2
        else:
            assert f"const char* {inst.name}(const ConvBiasResidualArgs& a)" in text
            assert "BiasResidualScale" in text and "NHWGC, GKYXC" in text
            assert (inst.tile.template_args() if xdl else inst.tile.conv_args()) in text
            assert ("DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle<" if xdl else
                    "DeviceGroupedConvFwdMultipleD_Wmma_CShuffle<") in text
    registry = (tmp_path / "ck_registry.h").read_text()
    assert registry.count('{"ck_linear_geglu_') == len(LINEAR_GEGLU_INSTANCES)
    assert registry.count('{"ck_conv_bias_residual_') == len(CONV_BIAS_RESIDUAL_INSTANCES)


def test_wmma_tiles_derive_ck_transfer_layouts_as_its_tables_pair_them():
    # CK's gemm_add_multiply WMMA v3 table: 256 threads, 128x128x32, 4x2 repeats -> A/B cluster S<4, 64, 1>,
    # epilogue S<1, 32, 1, 8>, vectors S<8, 8, 8>; 64 threads, 32x64x64, 2x2 -> S<4, 16, 1>, S<1, 16, 1, 4>.
    # Its grouped conv forward table: 64 threads, 32x64x32, 1x4 -> S<4, 16, 1>, S<1, 32, 1, 2>.
    big, small, conv = WMMA_GEMM_TILES[0], WMMA_GEMM_TILES[2], WMMA_CONV_TILES[2]
    assert (big.ab_cluster, big.out_cluster) == ("S<4, 64, 1>", "S<1, 32, 1, 8>")
    assert (small.ab_cluster, small.out_cluster) == ("S<4, 16, 1>", "S<1, 16, 1, 4>")
    assert (conv.ab_cluster, conv.out_cluster) == ("S<4, 16, 1>", "S<1, 32, 1, 2>")
    assert big.gemm_args(2).startswith("256, 128, 128, 32, 8, 8, 16, 16, 4, 2, S<4, 64, 1>, S<1, 0, 2>, S<1, 0, 2>, "
                                       "2, 8, 8, 1,")
    assert big.gemm_args(2).endswith("1, 1, S<1, 32, 1, 8>, S<8, 8, 8>, ::ck::BlockGemmPipelineScheduler::Intrawave, "
                                     "::ck::BlockGemmPipelineVersion::v1")
    assert big.gemm_args(1).count("S<8, 8>") == 1
    assert conv.conv_args() == ("1, 64, 32, 64, 32, 8, 16, 16, 1, 4, S<4, 16, 1>, S<1, 0, 2>, S<1, 0, 2>, 2, 8, 8, 1, "
                                "S<4, 16, 1>, S<1, 0, 2>, S<1, 0, 2>, 2, 8, 8, 1, 1, 1, S<1, 32, 1, 2>, 8")
    assert all(t.tag.startswith("wmma_") for t in WMMA_GEMM_TILES + WMMA_CONV_TILES)
    assert len({t.tag for t in WMMA_GEMM_TILES}) == len(WMMA_GEMM_TILES)


@pytest.mark.parametrize("bad", [dict(m_repeat=2), dict(block=128), dict(k_per_block=16)])
def test_inconsistent_wmma_tiles_are_refused(bad):
    with pytest.raises(ValueError):
        WmmaTile(**(dict(block=256, m_per_block=128, n_per_block=128, k_per_block=32, m_repeat=4, n_repeat=2,
                         lds_pad=True) | bad))


@pytest.mark.parametrize("targets, families", [(["gfx90a", "gfx942:sramecc+:xnack-"], {None, "xdl"}),
                                               (["gfx1100", "gfx1201"], {None, "wmma"}),
                                               (["gfx1030"], {None}),
                                               (["gfx942", "gfx1151"], {None, "xdl", "wmma"})])
def test_each_family_is_generated_and_registered_for_its_targets_only(tmp_path, targets, families):
    """XDL instances for CDNA targets, WMMA ones for RDNA3/4, GroupNorm for all: the sources, the registry's
    target lists (what _C lists per GPU arch) and the groups CMake compiles for which targets agree."""
    every = GROUP_NORM_INSTANCES + ATTENTION_INSTANCES + LINEAR_GEGLU_INSTANCES + CONV_BIAS_RESIDUAL_INSTANCES
    expected = [i for i in every if i.family in families]
    paths = generate.write(str(tmp_path), targets)
    assert [p.rsplit("/", 1)[-1] for p in paths] == [f"{i.name}.hip" for i in expected]
    registry = (tmp_path / "ck_registry.h").read_text()
    cmake = (tmp_path / "ck_sources.cmake").read_text()
    built = {None: targets, "xdl": [t for t in targets if t.split(":")[0] in ("gfx90a", "gfx942")],
             "wmma": [t for t in targets if t.split(":")[0] in ("gfx1100", "gfx1151", "gfx1201")]}
    for inst in expected:
        assert f'"{inst.name}", ' in registry and f'"{";".join(built[inst.family])}", &{inst.name}}}' in registry
    groups = [group for family, group in ((None, "plain"), ("xdl", "xdl"), ("wmma", "wmma")) if family in families]
    assert f"set(ROCM_SD_CK_GROUPS {' '.join(groups)})" in cmake
    for family in families:
        group = family or "plain"
        sources = ";".join(p for p, i in zip(paths, expected, strict=True) if i.family == family)
        assert f'set(ROCM_SD_CK_{group}_TARGETS "{";".join(built[family])}")' in cmake
        assert f'set(ROCM_SD_CK_{group}_SOURCES "{sources}")' in cmake


def test_ck_listings_ask_for_the_arch_of_the_gpu_they_are_for(monkeypatch):
    """_C lists the instances with code for an arch; the ops ask for their tensors' GPU, and for every instance in
    the build without one (hosts_ck, `rocm_sd info`)."""
    import types

    import torch

    from rocm_sd import _ext, platform
    from rocm_sd.ops import _common

    monkeypatch.setattr(_ext, "_C", types.SimpleNamespace(ck_attention_instances=lambda arch: [f"for {arch!r}"]))
    monkeypatch.setattr(platform, "device_arch", lambda device: {0: "gfx1100", 1: "gfx942"}[device.index])
    assert _common.ck_listing("ck_attention_instances", torch.device("cuda", 0)) == ["for 'gfx1100'"]
    assert _common.ck_listing("ck_attention_instances", torch.device("cuda", 1)) == ["for 'gfx942'"]
    assert _common.ck_listing("ck_attention_instances", torch.device("cpu")) == ["for ''"]
    assert _common.ck_listing("ck_attention_instances") == ["for ''"]
    assert _common.ck_listing("ck_linear_geglu_instances", torch.device("cuda", 0)) == []  # not in this _C
