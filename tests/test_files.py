"""rocm_sd.files: atomic writes give their files the permissions any other writer would (0o666 less the umask)."""
import os
import stat
import sys

import pytest

from rocm_sd.files import write_atomically, write_json_atomically

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")


@pytest.fixture(params=[0o022, 0o002, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


@pytest.mark.parametrize("lock_held", [False, True])
def test_atomic_writes_honour_the_umask(tmp_path, umask, lock_held):
    write_atomically(tmp_path / "image.png", lambda f: f.write(b"png"), durable=False, lock_held=lock_held)
    write_json_atomically(tmp_path / "run.json", {"a": 1}, lock_held=lock_held)
    for name in ("image.png", "run.json"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o666 & ~umask, name
    assert sorted(os.listdir(tmp_path)) == ["image.png", "run.json"]


def test_a_failed_write_leaves_nothing(tmp_path):
    def fail(f):
        f.write(b"half")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        write_atomically(tmp_path / "x", fail)
    assert os.listdir(tmp_path) == []
