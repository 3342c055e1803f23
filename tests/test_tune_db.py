"""The tuning database: keyed per device, validated, atomic, locked, never loses results."""
from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from rocm_sd import config
from rocm_sd.ops.spec import problem_key
from rocm_sd.tune.db import TuningDB, default_location
from rocm_sd.tune.device_keys import DeviceKey

MI300X = DeviceKey("hip", "gfx942:sramecc+:xnack-", 304, 64)
RX7900 = DeviceKey("hip", "gfx1100", 48, 32)
VALID = {"rocm_sd": "0.1.0", "kernels": "abc123", "runtime": "HIP 6.4", "driver": "60400", "torch": "2.13.0"}
GN = problem_key("group_norm", "float16", "nhwc", N=2, C=320, HW=4096, G=32, act="silu")


def db(tmp_path, device=MI300X, validators=VALID, **kw) -> TuningDB:
    return TuningDB(device, validators, location=tmp_path, defaults_dir=tmp_path / "shipped", **kw)


def test_file_named_by_device_and_valid_everywhere(tmp_path):
    assert db(tmp_path).path.name == "gfx942_sramecc+_xnack-_304cu_w64.json"
    assert DeviceKey("cuda", "sm_90", 132, 32).file_stem == "sm_90_132sm_w32"


def test_record_then_reload(tmp_path):
    first = db(tmp_path)
    assert first.lookup(GN) is None and len(first) == 0
    first.record(GN, {"choice": "rocm_sd:split", "ms": 0.012, "runners_up": [["torch", 0.05]]})
    again = db(tmp_path)
    assert again.lookup(GN)["choice"] == "rocm_sd:split" and "measured" in again.lookup(GN)
    assert not list(tmp_path.glob("*.tmp"))


def test_another_device_does_not_see_the_results(tmp_path):
    db(tmp_path).record(GN, {"choice": "rocm_sd:split"})
    assert db(tmp_path, device=RX7900).lookup(GN) is None


def test_one_file_for_several_devices_is_never_misused(tmp_path):
    single = tmp_path / "tune.json"
    TuningDB(MI300X, VALID, location=single, defaults_dir=None).record(GN, {"choice": "rocm_sd:split"})
    other = TuningDB(RX7900, VALID, location=single, defaults_dir=None)
    assert other.lookup(GN) is None and "device arch" in other.notes[0]


def test_stale_validators_ignore_the_file_with_the_reason(tmp_path):
    db(tmp_path).record(GN, {"choice": "rocm_sd:split"})
    newer = dict(VALID, torch="2.14.0")
    stale = db(tmp_path, validators=newer)
    assert stale.lookup(GN) is None
    assert "torch '2.13.0' (now '2.14.0')" in stale.notes[0] and "ROCM_SD_TUNE_ACCEPT_STALE" in stale.notes[0]
    assert db(tmp_path, validators=newer, accept_stale=True).lookup(GN)["choice"] == "rocm_sd:split"
    with config.override(tune_accept_stale=True):
        assert db(tmp_path, validators=newer).lookup(GN) is not None


def test_another_software_version_keeps_its_own_table_in_the_same_file(tmp_path):
    db(tmp_path).record(GN, {"choice": "rocm_sd:split"})
    newer = db(tmp_path, validators=dict(VALID, kernels="def456"))
    newer.record(GN, {"choice": "torch"})
    assert not list(tmp_path.glob("*.json.*-*"))  # nothing set aside: both tables live in the one file
    assert db(tmp_path).lookup(GN)["choice"] == "rocm_sd:split"
    assert db(tmp_path, validators=dict(VALID, kernels="def456")).lookup(GN)["choice"] == "torch"


def test_alternating_software_versions_lose_no_result(tmp_path):
    """ComfyUI's torch and the CLI's tuning into one database in turn: each write once set the other's file
    aside under a name stamped to the second, so most results were overwritten."""
    versions = [VALID, dict(VALID, torch="2.14.0")]
    for i in range(20):
        db(tmp_path, validators=versions[i % 2]).record(problem_key("op", "float16", "nhwc", i=i), {"choice": f"c{i}"})
    for v, validators in enumerate(versions):
        mine = db(tmp_path, validators=validators)
        assert sorted(mine.results) == sorted(problem_key("op", "float16", "nhwc", i=i) for i in range(v, 20, 2))
        assert not mine.notes


def test_two_devices_sharing_one_file_keep_both_tables(tmp_path):
    single = tmp_path / "tune.json"
    TuningDB(MI300X, VALID, location=single, defaults_dir=None).record(GN, {"choice": "mi300"})
    TuningDB(RX7900, VALID, location=single, defaults_dir=None).record(GN, {"choice": "rx7900"})
    assert TuningDB(MI300X, VALID, location=single, defaults_dir=None).lookup(GN)["choice"] == "mi300"
    assert TuningDB(RX7900, VALID, location=single, defaults_dir=None).lookup(GN)["choice"] == "rx7900"


def test_two_tables_for_one_device_and_software_are_merged_on_read_and_written_as_one(tmp_path):
    """A hand- or sync-merged file: reads took the last table, writes the first, so results vanished."""
    path = db(tmp_path).path
    keys = [problem_key("op", "float16", "nhwc", i=i) for i in range(4)]
    table = {"device": MI300X.as_dict(), "validators": VALID, "written": "2026-01-01T00:00:00"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 2, "tables": [
        {**table, "results": {keys[0]: {"choice": "a", "measured": "2026-01-01T00:00:00"},
                              keys[2]: {"choice": "newer", "measured": "2026-03-01T00:00:00"}}},
        {**table, "results": {keys[1]: {"choice": "b", "measured": "2026-01-02T00:00:00"},
                              keys[2]: {"choice": "older", "measured": "2026-02-01T00:00:00"}}}]}))
    first = db(tmp_path)
    assert [first.lookup(k)["choice"] for k in keys[:3]] == ["a", "b", "newer"]
    first.record(keys[3], {"choice": "d"})
    [written] = json.loads(path.read_text())["tables"]
    assert sorted(written["results"]) == sorted(keys)
    again = db(tmp_path)
    assert [again.lookup(k)["choice"] for k in keys] == ["a", "b", "newer", "d"] and not again.notes


def test_a_format_1_file_is_read_and_kept_as_a_table(tmp_path):
    path = db(tmp_path).path
    path.write_text(json.dumps({"format": 1, "device": MI300X.as_dict(), "validators": VALID,
                                "results": {GN: {"choice": "old"}}}))
    assert db(tmp_path).lookup(GN)["choice"] == "old"
    other = problem_key("op", "float16", "nhwc", i=1)
    db(tmp_path, validators=dict(VALID, torch="2.14.0")).record(other, {"choice": "new"})
    assert json.loads(path.read_text())["format"] == 2
    assert db(tmp_path).lookup(GN)["choice"] == "old"


@pytest.mark.parametrize("content", ["{not json", "", '{"format": 1, "results": []}', '["a list"]',
                                     '{"format": 99, "device": {}, "validators": {}, "results": {}}',
                                     '{"format": 1, "device": {}, "validators": {}, "results": {"k": 3}}'])
def test_a_corrupt_file_is_set_aside_and_tuning_starts_fresh(tmp_path, content):
    path = db(tmp_path).path
    path.write_text(content)
    fresh = db(tmp_path)
    assert fresh.lookup(GN) is None and "moved to" in fresh.notes[0]
    assert [p.read_text() for p in tmp_path.glob("*.json.corrupt-*")] == [content]
    fresh.record(GN, {"choice": "torch"})
    assert db(tmp_path).lookup(GN)["choice"] == "torch"


def test_binary_garbage_is_corrupt_not_a_crash(tmp_path):
    db(tmp_path).path.write_bytes(b"\xff\xfe\x00garbage")
    assert db(tmp_path).lookup(GN) is None


def test_user_results_win_over_shipped_defaults(tmp_path):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    other = problem_key("group_norm", "float16", "nchw", N=1, C=128, HW=65536, G=32, act="none")
    (shipped / f"{MI300X.file_stem}.json").write_text(json.dumps({
        "format": 1, "device": MI300X.as_dict(), "validators": {"rocm_sd": "0.0.1"},
        "results": {GN: {"choice": "shipped"}, other: {"choice": "shipped"}}}))
    mine = db(tmp_path)
    assert mine.lookup(GN)["choice"] == "shipped"  # shipped defaults need no validator match
    mine.record(GN, {"choice": "mine"})
    assert mine.lookup(GN)["choice"] == "mine" and mine.lookup(other)["choice"] == "shipped"


def test_a_miss_takes_the_nearest_tuned_shape_of_the_same_problem(tmp_path):
    mine = db(tmp_path)
    small = problem_key("group_norm", "float16", "nhwc", N=2, C=320, HW=1024, G=32, act="silu")
    mine.record(small, {"choice": "small"})
    mine.record(GN, {"choice": "large"})
    near_large = problem_key("group_norm", "float16", "nhwc", N=2, C=320, HW=3600, G=32, act="silu")
    assert mine.lookup(near_large)["choice"] == "large"
    assert mine.lookup(problem_key("group_norm", "float16", "nhwc", N=2, C=320, HW=900, G=32, act="silu"))["choice"] \
        == "small"
    # Another dtype, layout or activation is another problem: no guess.
    assert mine.lookup(problem_key("group_norm", "bfloat16", "nhwc", N=2, C=320, HW=4096, G=32, act="silu")) is None
    assert mine.lookup(problem_key("group_norm", "float16", "nhwc", N=2, C=320, HW=4096, G=32, act="none")) is None


def test_location_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with config.override(tune_db=None):  # the tests' own database folder (conftest) set aside
        assert default_location() == tmp_path / "xdg" / "rocm_sd" / "tune"
    with config.override(tune_db=str(tmp_path / "mine")):
        assert default_location() == tmp_path / "mine"
        assert TuningDB(MI300X, VALID).path.parent == tmp_path / "mine"


def test_an_unwritable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    with pytest.raises(RuntimeError, match="cannot write the tuning database .*ROCM_SD_TUNE_DB"):
        TuningDB(MI300X, VALID, location=blocker / "sub", defaults_dir=None).record(GN, {"choice": "x"})


def _writer(folder: str, worker: int, n: int, batch_interval_s: float | None) -> None:
    target = TuningDB(MI300X, VALID, location=__import__("pathlib").Path(folder), defaults_dir=None)
    with target.batched(batch_interval_s) if batch_interval_s is not None else __import__("contextlib").nullcontext():
        for i in range(n):
            target.record(problem_key("op", "float16", "nhwc", worker=worker, i=i), {"choice": f"{worker}-{i}"})


@pytest.mark.parametrize("batch_interval_s", [None, 0.05], ids=["each-record-saved", "batched"])
def test_concurrent_writers_lose_nothing(tmp_path, batch_interval_s):
    """Several processes (torchrun ranks, ComfyUI and the CLI) record at once: every result survives."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 50, batch_interval_s)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    final = db(tmp_path)
    assert len(final) == 200 and not final.notes
    assert final.lookup(problem_key("op", "float16", "nhwc", worker=3, i=49))["choice"] == "3-49"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_chose_anywhere_says_whether_a_backend_won_any_problem_of_an_op(tmp_path):
    # What rocm_sd.attention asks to skip its op where the kernel can never be chosen.
    tuned = db(tmp_path)
    assert not tuned.chose_anywhere("group_norm", "rocm_sd")
    tuned.record(GN, {"choice": "torch"})
    assert not tuned.chose_anywhere("group_norm", "rocm_sd") and tuned.chose_anywhere("group_norm", "torch")
    tuned.record(problem_key("group_norm", "float16", "nhwc", N=1, C=512, HW=16384, G=32, act="silu"),
                 {"choice": "rocm_sd:split"})
    assert tuned.chose_anywhere("group_norm", "rocm_sd") and not tuned.chose_anywhere("group_norm_x", "rocm_sd")
    assert not tuned.chose_anywhere("attention", "rocm_sd")


def test_the_shipped_hopper_defaults_load_for_their_device_only(tmp_path):
    """rocm_sd/tune/defaults/sm_90_132sm_w32.json (measured on the lent H200; H100 SXM has the same key):
    read for that device whatever this software's validators are, ignored for any other device, and every
    choice names a backend dispatch knows."""
    from rocm_sd.tune.db import DEFAULTS_DIR

    hopper = DeviceKey("cuda", "sm_90", 132, 32)
    shipped = TuningDB(hopper, VALID, location=tmp_path, defaults_dir=DEFAULTS_DIR)
    assert len(shipped.defaults) >= 100 and not shipped.notes and not shipped.results
    sd15_self_attention = problem_key("attention", "float16", "bshd", B=2, H=8, Lq=4096, Lk=4096, D=40)
    assert shipped.lookup(sd15_self_attention)["choice"].startswith("torch")  # SDPA (cuDNN) measured faster there
    from rocm_sd.ops.quantize import FORMATS

    # an op's choice names a backend; a linear_8bit or conv_8bit problem's is torch (fp16) or the 8-bit format
    assert all(r["choice"].split(":")[0] in ("torch", "rocm_sd", "ck")
               or (key.startswith(("linear_8bit|", "conv_8bit|")) and r["choice"] in FORMATS)
               for key, r in shipped.defaults.items())
    assert any(key.startswith("linear_8bit|") and r["choice"] == "e4m3fn" for key, r in shipped.defaults.items())
    assert any(key.startswith("conv_8bit|") and r["choice"] == "e4m3fn" for key, r in shipped.defaults.items())
    other = TuningDB(DeviceKey("cuda", "sm_90", 114, 32), VALID, location=tmp_path, defaults_dir=DEFAULTS_DIR)
    assert not other.defaults  # an H100 PCIe (114 SMs) has its own key: no file shipped
    assert not TuningDB(MI300X, VALID, location=tmp_path, defaults_dir=DEFAULTS_DIR).defaults


def test_shipped_defaults_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("ROCM_SD_TUNE_DEFAULTS", "0")
    assert config._from_env().tune_defaults is False


def test_chose_anywhere_tells_variants_from_the_plain_backend(tmp_path):
    mine = db(tmp_path)
    attention = problem_key("attention", "float16", "bshd", B=2, H=8, Lq=4096, Lk=4096, D=40)
    mine.record(attention, {"choice": "torch"})
    assert mine.chose_anywhere("attention", "torch") and not mine.chose_anywhere("attention", "torch", True)
    mine.record(attention.replace("Lk=4096", "Lk=77"), {"choice": "torch:efficient"})
    assert mine.chose_anywhere("attention", "torch", variants_only=True)
    assert not mine.chose_anywhere("group_norm", "torch")


class _FrozenClock:
    """datetime with a now() that never moves: every set-aside happens in the same microsecond."""
    class datetime(__import__("datetime").datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 11, 23, 12, 0, 0, 0)


def test_set_asides_in_the_same_instant_never_overwrite_each_other(tmp_path, monkeypatch):
    import rocm_sd.tune.db as db_module

    monkeypatch.setattr(db_module, "datetime", _FrozenClock)
    contents = [f"{{broken {i}" for i in range(3)]
    for content in contents:
        db(tmp_path).path.write_text(content)
        db(tmp_path)
    assert sorted(p.read_text() for p in tmp_path.glob("*.json.corrupt-*")) == contents


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000,
                                     '{"format": 1, "device": {}, "results": {}, "n": ' + "9" * 5000 + "}"],
                         ids=["nested-100000-deep", "integer-of-5000-digits"])
def test_json_too_deep_or_numbers_too_long_are_corrupt_not_a_crash(tmp_path, content):
    db(tmp_path).path.write_text(content)
    fresh = db(tmp_path)
    assert fresh.lookup(GN) is None and "moved to" in fresh.notes[0]
    assert [p.read_text() for p in tmp_path.glob("*.json.corrupt-*")] == [content]


@pytest.mark.parametrize("choice", [5, "", None, ["torch"]])
def test_a_result_without_a_string_choice_makes_the_file_corrupt(tmp_path, choice):
    """Dispatch reads the choice as a string on every call: a bad one must never reach it."""
    path = db(tmp_path).path
    path.write_text(json.dumps({"format": 1, "device": MI300X.as_dict(), "validators": VALID,
                                "results": {GN: {"choice": choice}}}))
    fresh = db(tmp_path)
    assert fresh.lookup(GN) is None and "no choice" in fresh.notes[0]
    with pytest.raises(ValueError, match="choice"):
        fresh.record(GN, {"choice": choice})


def test_a_reader_waits_for_the_lock_before_moving_a_corrupt_file_aside(tmp_path, monkeypatch):
    """A reader that saw a corrupt file must not rename what a writer puts there meanwhile: it takes the lock,
    reads again, and moves the file only if it is still corrupt."""
    import threading

    from filelock import FileLock

    import rocm_sd.tune.db as db_module

    monkeypatch.setattr(db_module, "READ_LOCK_TIMEOUT_S", 30.0)
    path = db(tmp_path).path
    path.write_text("{half-written by someone")
    loaded = {}
    with FileLock(str(path) + ".lock"):  # a writer is at work
        reader = threading.Thread(target=lambda: loaded.setdefault("db", db(tmp_path)))
        reader.start()
        reader.join(timeout=1.0)
        assert reader.is_alive() and path.read_text() == "{half-written by someone"  # not renamed under the writer
        path.write_text(json.dumps({"format": 1, "device": MI300X.as_dict(), "validators": VALID,
                                    "results": {GN: {"choice": "fresh"}}}))
    reader.join(timeout=30)
    assert loaded["db"].lookup(GN)["choice"] == "fresh" and not list(tmp_path.glob("*.corrupt-*"))


def test_a_directory_at_the_database_path_is_not_renamed(tmp_path):
    folder_named_json = tmp_path / "tune.json"
    folder_named_json.mkdir()
    reader = TuningDB(MI300X, VALID, location=folder_named_json, defaults_dir=None)
    assert reader.lookup(GN) is None and "not a regular file" in reader.notes[0]
    with pytest.raises(RuntimeError, match="tune.json.*not a regular file"):
        reader.record(GN, {"choice": "torch"})
    assert folder_named_json.is_dir() and list(tmp_path.iterdir()) == [folder_named_json] + \
        [p for p in tmp_path.iterdir() if p.name.endswith(".lock")]


def _record_until_killed(folder: str, acknowledged: str) -> None:
    target = TuningDB(MI300X, VALID, location=__import__("pathlib").Path(folder), defaults_dir=None)
    with open(acknowledged, "a") as log:
        for i in range(10**9):
            key = problem_key("op", "float16", "nhwc", pid=os.getpid(), i=i)
            target.record(key, {"choice": "torch"})
            log.write(key + "\n")  # written only once record() has returned: the result counts as saved
            log.flush()


def test_killed_writers_leave_no_partial_files_and_lose_nothing_saved(tmp_path):
    import random
    import signal
    import time

    ctx = multiprocessing.get_context("fork")  # no re-import per writer: 20 kills stay fast
    acknowledged = tmp_path / "acknowledged.txt"
    folder = tmp_path / "db"
    rng = random.Random(0)
    for _ in range(20):
        writer = ctx.Process(target=_record_until_killed, args=(str(folder), str(acknowledged)))
        writer.start()
        time.sleep(rng.uniform(0.05, 0.3))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
    assert len([p for p in os.listdir(folder) if p.endswith(".tmp")]) <= 1
    saved = db(folder)
    assert not saved.notes
    assert set(acknowledged.read_text().split()) <= set(saved.results)
    saved.record(GN, {"choice": "torch"})
    assert not [p for p in os.listdir(folder) if p.endswith(".tmp")]


def test_a_batch_saves_once_per_interval_and_on_leaving_the_block(tmp_path, monkeypatch):
    import rocm_sd.tune.db as db_module

    writes = []
    real_write = db_module.write_json_atomically
    monkeypatch.setattr(db_module, "write_json_atomically", lambda *a, **k: (writes.append(1), real_write(*a, **k)))
    tuner = db(tmp_path)
    keys = [problem_key("op", "float16", "nhwc", i=i) for i in range(50)]
    with tuner.batched(interval_s=3600):
        for key in keys:
            tuner.record(key, {"choice": "torch"})
        assert tuner.lookup(keys[7])["choice"] == "torch" and not writes  # visible at once, saved later
    assert len(writes) == 1 and sorted(db(tmp_path).results) == sorted(keys)
    with pytest.raises(KeyboardInterrupt):
        with tuner.batched(interval_s=3600):
            tuner.record(GN, {"choice": "rocm_sd"})
            raise KeyboardInterrupt  # Ctrl-C during tuning: what was measured is still saved
    assert db(tmp_path).lookup(GN)["choice"] == "rocm_sd"
    writes.clear()
    with tuner.batched(interval_s=0):
        for key in keys[:5]:
            tuner.record(key, {"choice": "rocm_sd"})
    assert len(writes) == 5
