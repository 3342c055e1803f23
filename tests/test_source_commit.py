"""Result rows record rocm_sd's own source commit, never the commit of a repository that happens to enclose the
package (an exported copy or an installed package inside another project's checkout)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import rocm_sd

PACKAGE = Path(rocm_sd.__file__).resolve().parent


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def recorded_commits(source_root):
    """run_meta()'s commit with rocm_sd imported from source_root, run from there: without $ROCM_SD_COMMIT, with
    it set, and with it empty (one process: importing rocm_sd costs seconds)."""
    # An editable install's finder (pip install -e of a checkout: CI's) answers `import rocm_sd` before sys.path is
    # searched; without it the copy at the front of sys.path is the one imported.
    code = ("import os, sys; sys.path.insert(0, os.getcwd())\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__]\n"
            "import rocm_sd, rocm_sd.bench as b\n"
            "assert rocm_sd.__file__.startswith(os.getcwd()), rocm_sd.__file__\n"
            "for value in (None, '0123abc', ''):\n"
            "    os.environ.pop('ROCM_SD_COMMIT', None) if value is None else os.environ.update(ROCM_SD_COMMIT=value)\n"
            "    print(b.run_meta('cpu', 'x')['commit'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=source_root, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[-3:]


def test_an_exported_copy_inside_another_repository_does_not_take_its_commit(tmp_path):
    stranger = tmp_path / "project"
    stranger.mkdir()
    git(stranger, "init", "-q")
    (stranger / "notes.txt").write_text("someone else's work\n")
    git(stranger, "add", "notes.txt")
    git(stranger, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q", "-m", "theirs")
    stranger_commit = git(stranger, "rev-parse", "HEAD")
    export = stranger / "vendor" / "rocm_sd_export"
    shutil.copytree(PACKAGE, export / "rocm_sd", ignore=shutil.ignore_patterns("__pycache__"))

    commits = recorded_commits(export)
    assert stranger_commit not in commits
    assert commits == ["unknown", "0123abc", "unknown"]


def test_a_checkout_records_its_own_head_unless_told_the_commit(monkeypatch):
    from rocm_sd.version import SOURCE_ROOT, git_commit

    monkeypatch.delenv("ROCM_SD_COMMIT", raising=False)
    try:
        top = git(SOURCE_ROOT, "rev-parse", "--show-toplevel")
    except (OSError, subprocess.CalledProcessError):
        top = None
    if top is None or Path(top).resolve() != SOURCE_ROOT:  # a copy without git metadata: nothing to compare
        assert git_commit() == "unknown"
    else:
        assert git_commit() == git(SOURCE_ROOT, "rev-parse", "HEAD")
    monkeypatch.setenv("ROCM_SD_COMMIT", "0123abc")  # a device copy's tree, whatever git metadata came with it
    assert git_commit() == "0123abc"
