"""The attention kernel's self-check (rocm_sd/ops/attention_self_check.py) and its cache file, on a CPU: a fake
kernel (SDPA in the inputs' dtype, or a wrong one) stands in for the GPU's."""
import json
import logging

import pytest
import torch

from rocm_sd import _ext
from rocm_sd.ops import attention_self_check
from rocm_sd.ops.attention import attention_ref

DEVICE = torch.device("cpu")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    path = tmp_path / "attention_self_check.json"
    monkeypatch.setattr(attention_self_check, "cache_path", lambda: path)
    monkeypatch.setattr(_ext, "build_info", lambda: {"platform": "hip", "targets": "gfx1100", "source_hash": "abc"})
    attention_self_check.forget()
    yield path
    attention_self_check.forget()


class Kernel:
    """attention_kernel's signature; counts launches; `wrong` scales the scores by 1.5 (a plausible, wrong result)."""

    def __init__(self, wrong=False):
        self.launches, self.wrong = 0, wrong

    def __call__(self, q, k, v, scale, out=None, instance=""):
        self.launches += 1
        y = attention_ref(q, k, v, scale * (1.5 if self.wrong else 1.0))
        return y if out is None else out.copy_(y)


def check(kernel, dtype=torch.float16, head_dim=40) -> dict:
    return attention_self_check.result(DEVICE, dtype, head_dim, kernel, attention_ref)


def stored(path) -> dict:
    data = json.loads(path.read_text())
    assert data["format"] == attention_self_check.FORMAT
    return {entry["identity"]["build"]["source_hash"]: entry["checks"] for entry in data["devices"].values()}


def test_a_passed_check_is_kept_and_read_back(cache):
    kernel = Kernel()
    assert check(kernel)["ok"] and kernel.launches == len(attention_self_check.CASES)
    assert check(kernel)["ok"] and kernel.launches == 3  # this process's answer
    attention_self_check.forget()  # as a new process
    assert check(kernel)["ok"] and kernel.launches == 3  # the file's answer: not run again
    entry = stored(cache)["abc"]["float16 d40"]
    assert entry["ok"] is True and entry["error"] == "" and entry["seconds"] >= 0
    assert check(kernel, torch.bfloat16)["ok"] and check(kernel, head_dim=64)["ok"] and kernel.launches == 9
    assert set(stored(cache)["abc"]) == {"float16 d40", "bfloat16 d40", "float16 d64"}


def test_changed_kernel_sources_check_again(cache, monkeypatch):
    kernel = Kernel()
    check(kernel)
    attention_self_check.forget()
    monkeypatch.setattr(_ext, "build_info", lambda: {"platform": "hip", "targets": "gfx1100", "source_hash": "def"})
    assert check(kernel)["ok"] and kernel.launches == 6
    assert set(stored(cache)) == {"abc", "def"}  # the other build's entry is kept


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[]", b'{"format": 99, "devices": {}}',
                                     b'{"format": 1, "devices": {"x": 3}}', b'{"format": 1, "devices": []}'],
                         ids=["malformed", "not-utf8", "a-list", "other-format", "bad-device", "bad-devices"])
def test_a_corrupt_file_reads_as_absent_and_is_replaced(cache, content):
    cache.write_bytes(content)
    kernel = Kernel()
    assert check(kernel)["ok"] and kernel.launches == 3
    assert stored(cache)["abc"]["float16 d40"]["ok"] is True


def test_a_corrupt_entry_is_checked_again(cache):
    kernel = Kernel()
    check(kernel)
    data = json.loads(cache.read_text())
    checks = next(iter(data["devices"].values()))["checks"]
    checks["float16 d40"] = {"ok": "yes"}
    cache.write_text(json.dumps(data))
    attention_self_check.forget()
    assert check(kernel)["ok"] and kernel.launches == 6


def test_a_failed_check_is_kept_and_warns_once_per_process(cache, caplog):
    kernel = Kernel(wrong=True)
    with caplog.at_level(logging.WARNING, logger="rocm_sd"):
        first = check(kernel)
        assert check(kernel) is first
    assert not first["ok"]
    assert "(batch, q_len, kv_len, heads, head_dim) (1, 2048, 197, 1, 40): max error" in first["error"]
    assert kernel.launches == 1  # the first wrong case decides
    warnings = [r.getMessage() for r in caplog.records if "self-check" in r.getMessage()]
    assert len(warnings) == 1 and "GPU 0 (cpu, cpu)" in warnings[0] and "head dim 40" in warnings[0]
    assert attention_self_check.failed(DEVICE, torch.float16, 40)
    assert not attention_self_check.failed(DEVICE, torch.float16, 64)  # not asked: nothing known
    attention_self_check.forget()
    assert not check(Kernel())["ok"]  # the stored failure holds for this build: not run again
    assert stored(cache)["abc"]["float16 d40"]["ok"] is False


def test_a_kernel_that_raises_fails_the_check(cache):
    def raising(*args, **kwargs):
        raise RuntimeError("hipErrorNoBinaryForGpu")

    entry = check(raising)
    assert not entry["ok"] and entry["error"].endswith("RuntimeError: hipErrorNoBinaryForGpu")


def test_an_unwritable_cache_warns_once_and_checks(monkeypatch, tmp_path, caplog):
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    monkeypatch.setattr(attention_self_check, "cache_path", lambda: blocked / "attention_self_check.json")
    monkeypatch.setattr(attention_self_check, "_unwritable", set())
    attention_self_check.forget()
    kernel = Kernel()
    with caplog.at_level(logging.WARNING, logger="rocm_sd"):
        assert check(kernel)["ok"] and check(kernel, head_dim=64)["ok"]
    warnings = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1 and str(blocked) in warnings[0]
    attention_self_check.forget()
