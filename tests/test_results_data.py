"""The benchmark results as data (bench/results/data/*.jsonl, rocm_sd/bench.py "Result files") and their renderer
(bench/render_results.py): every committed run is complete and rendered, appends never lose a run, and a broken
data file is named in a one-line error."""
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rocm_sd.bench import RUN_KEYS, ResultsError, append_run, read_runs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DATA_FILES = sorted((RESULTS / "data").glob("*.jsonl"))
sys.path.insert(0, str(ROOT / "bench"))
import render_results  # noqa: E402

META = {"date": "2026-12-01", "device": "NVIDIA H200", "torch": "2.11.0+cu130", "commit": "0123456789abcdef",
        "command": "python -m rocm_sd bench"}


def test_there_are_data_files():
    assert len(DATA_FILES) >= 10, "bench/results/data/ lost its runs"


@pytest.mark.parametrize("path", DATA_FILES, ids=[p.name for p in DATA_FILES])
def test_every_run_says_when_where_what_and_how(path):
    runs = read_runs(path)
    assert runs, f"{path.name} is empty"
    names = [run["run"] for run in runs]
    assert len(set(names)) == len(names), f"{path.name}: a run name twice"
    for run in runs:
        assert all(isinstance(run[k], str) and run[k] for k in RUN_KEYS), run["run"]
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", run["date"]), run["run"]
        assert re.fullmatch(r"[0-9a-f]{7,40}(\+wt)?", run["commit"]), f"{run['run']}: commit {run['commit']!r}"
        assert isinstance(run["results"], list), run["run"]
        assert path.stem.startswith(run["bench"] + "-"), f"{run['run']} is filed under {path.name}"
    assert [run["date"] for run in runs] == sorted(run["date"] for run in runs), f"{path.name}: not oldest first"


def test_the_renderer_renders_every_run_of_every_data_file(tmp_path):
    shutil.copytree(RESULTS / "data", tmp_path / "bench" / "results" / "data")
    (tmp_path / "README.md").write_text("before\n<!-- generated: current -->\nstale\n<!-- /generated: current -->\n"
                                        "after\n")
    files = render_results.render(tmp_path)
    for path in DATA_FILES:
        page = files[tmp_path / "bench" / "results" / f"{path.stem}.md"].decode()
        for run in read_runs(path):
            assert f"\n### {run['run']}\n" in page, f"{path.stem}.md lacks {run['run']}"
    index = files[tmp_path / "bench" / "results" / "README.md"].decode()
    assert all(f"[{path.stem}]({path.stem}.md)" in index for path in DATA_FILES)
    readme = files[tmp_path / "README.md"].decode()
    assert readme.startswith("before\n") and readme.endswith("after\n") and "stale" not in readme
    assert "| sd15 512x512, 50 steps, batch 1 | NVIDIA H100 80GB HBM3 |" in readme


def test_the_committed_pages_are_what_the_data_renders():
    # The charts are left out: their bytes depend on the Pillow version that drew them.
    stale = [path for path in render_results.stale(render_results.render(ROOT)) if path.suffix != ".png"]
    assert not stale, f"run `python bench/render_results.py`: out of date: {[str(p.relative_to(ROOT)) for p in stale]}"


def test_appending_keeps_every_run_and_names_each_once(tmp_path):
    path, first = append_run(tmp_path, "sd15", META, [{"engine": "eager", "median_s": 1.0}], note="first")
    assert path == tmp_path / "data" / "sd15-h200.jsonl"
    assert first["run"] == "2026-12-01-sd15-0123456-h200" and first["note"] == "first"
    _, second = append_run(tmp_path, "sd15", META, [{"engine": "rocm_sd", "median_s": float("inf")}])
    assert second["run"] == "2026-12-01-sd15-0123456-h200-2"
    assert read_runs(path) == [first, second]
    assert not list(path.parent.glob("*.tmp"))


def test_concurrent_appends_lose_nothing(tmp_path):
    def writer(i):
        for j in range(5):
            append_run(tmp_path, "attention", {**META, "commit": f"{i:07x}"}, [{"writer": i, "n": j}])

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = read_runs(tmp_path / "data" / "attention-h200.jsonl")
    assert sorted((r["results"][0]["writer"], r["results"][0]["n"]) for r in runs) == \
        [(i, j) for i in range(6) for j in range(5)]
    assert len({r["run"] for r in runs}) == 30


@pytest.mark.parametrize("content, says", [
    ('{"run": "a", "bench": "sd15", "date": "2026-12-01"\n', "line 1: not JSON"),
    ('[1, 2]\n', "line 1: a list, not a JSON object"),
    (json.dumps({"run": "r", "bench": "sd15", "date": "2026-12-01", "device": "x", "commit": "abc1234",
                 "results": []}) + "\n", "line 1: run 'r' has no command"),
])
def test_a_broken_data_file_is_named_and_never_overwritten(tmp_path, content, says):
    path = tmp_path / "data" / "sd15-h200.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps({"run": "ok", "bench": "sd15", **META, "results": []}) + "\n" + content)
    says = says.replace("line 1", "line 2")
    with pytest.raises(ResultsError, match=re.escape(f"{path}, {says}")):
        read_runs(path)
    with pytest.raises(ResultsError, match=re.escape(str(path))):
        append_run(tmp_path, "sd15", META, [])
    assert path.read_text().endswith(content)  # untouched
    (tmp_path / "bench" / "results").mkdir(parents=True)
    path.parent.rename(tmp_path / "bench" / "results" / "data")
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "render_results.py"), "--root", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "sd15-h200.jsonl, line 2" in line, line
