"""The Composable Kernel instance generator (ck_templates/): names, sources, registry. Compiling them is
a build check (tests/test_build.py)."""
import pytest

from ck_templates import generate
from ck_templates.instances import GROUP_NORM_INSTANCES, GroupNormInstance


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


def test_one_source_per_instance_and_a_registry(tmp_path):
    paths = generate.write(str(tmp_path))
    assert len(paths) == len(GROUP_NORM_INSTANCES)
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
