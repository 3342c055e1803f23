"""Renders the benchmark results, bench/results/data/<bench>-<device>.jsonl (one line per run), as markdown.

    python bench/render_results.py           # writes the pages below from the data
    python bench/render_results.py --check   # writes nothing; exit status 1 and the stale pages' names if any
                                             # page differs from what the data renders

Pages, each generated (edit the data or this script, never the page):
  bench/results/<bench>-<device>.md    every run of one data file, newest first, each under a heading that is
                                       its run name (so bench/results/sd15-h200.md#2026-11-22-sd15-b792c64-h200
                                       links one run)
  bench/results/<bench>-<device>.png   the newest run of a pipeline benchmark (python -m rocm_sd bench) as a chart
  bench/results/README.md              the index: every data file, how many runs, the newest
  README.md, docs/results.md           only the blocks between `<!-- generated: NAME -->` and
                                       `<!-- /generated: NAME -->` (NAME: current, pipelines, kernels, index)
The data format is in rocm_sd/bench.py ("Result files") and docs/results.md.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rocm_sd import cli_args  # noqa: E402
from rocm_sd.bench import bar_chart, chart_title, engine_table, read_runs  # noqa: E402

# The speed-up column of benchmarks whose rows compare engines per case: (what groups rows into a case, the time
# column); the first row of a case is the baseline.
BASELINES = {"vae-decode": ("size", "decode_ms"), "text-encoder": ("model", "encode_ms"), "comfyui": ("call", "ms"),
             "comfyui-sdxl": ("call", "ms")}
# What the columns of a benchmark's table mean, said once per page.
INTROS = {
    "kernel": "Device time from graph replays over rotating inputs larger than L2. GB/s counts the least traffic any "
              "implementation needs; '% of copy' is against the 1 GiB device copy (read + write) measured in the same "
              "run; 'same-bytes copy' is a streaming copy kernel moving the op's bytes at this size, and "
              "'% same-bytes' its time over rocm_sd's. Columns '<path> ms' force one of the kernel's paths.",
    "attention": "FLOPs: 4 B H Lq Lk D. Device time from graph replays over rotating inputs; TFLOP/s in parentheses.",
    "pipeline": "End to end, one process, same weights, prompt and seed per engine: first call (compilation or capture "
                "included), then the median of the timed calls; PSNR and max latent difference against eager.",
}
PIPELINE_ENGINES = ("eager", "compile", "compile-reduce-overhead", "rocm_sd", "rocm_sd+compile")
MARKER = re.compile(r"(<!-- generated: (\w[\w-]*) -->\n).*?(<!-- /generated: \2 -->)", re.S)


def kind(runs: list[dict]) -> str:
    rows = [r for run in runs for r in run["results"]]
    if any("median_s" in r and "label" in r for r in rows):
        return "pipeline"
    if any("sdpa_ms" in r for r in rows):
        return "attention"
    if any("backend" in r and "pct_copy" in r for r in rows) and not any("problem" in r or "choice" in r for r in rows):
        return "kernel"
    return "table"


def cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, (dict, list)):
        return "`" + json.dumps(value, separators=(",", ":")).replace("|", "\\|") + "`"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in body]
    return "\n".join(lines)


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"


def plain_table(rows: list[dict], baseline: tuple[str, str] | None = None) -> str:
    """Every key of every row as a column, in order of first appearance; with `baseline` (case key, time key), a
    column 'vs first' = the case's first time over this row's."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    body, first = [], {}
    for r in rows:
        line = [r.get(k) for k in keys]
        if baseline:
            case, time = baseline
            first.setdefault(r.get(case), r.get(time))
            line.append(ratio(first[r.get(case)], r.get(time)))
        body.append(line)
    return table(keys + (["vs first of its " + baseline[0]] if baseline else []), body)


def kernel_table(rows: list[dict]) -> str:
    """torch against rocm_sd per shape (and layout), one line per case; other rows (the copy ceiling, eager-call
    timings) after it."""
    cases, other = {}, []
    for r in rows:
        if "backend" in r and "ms" in r:
            cases.setdefault((r.get("op"), r.get("shape"), r.get("layout"), r.get("dtype")), {})[r["backend"]] = r
        else:
            other.append(r)
    forced = list(dict.fromkeys(b for case in cases.values() for b in case if b not in ("torch", "rocm_sd")))
    has_layout = any(key[2] for key in cases)
    header = (["op", "shape"] + (["layout"] if has_layout else []) + ["dtype", "torch ms", "rocm_sd ms", "speed-up",
              "rocm_sd GB/s", "% of copy", "same-bytes copy ms", "% same-bytes", "path"] + [f"{b} ms" for b in forced])
    body = []
    for (op, shape, layout, dtype), case in cases.items():
        t, k = case.get("torch", {}), case.get("rocm_sd", {})
        body.append([op, shape] + ([layout] if has_layout else []) +
                    [dtype, t.get("ms"), k.get("ms"), ratio(t.get("ms"), k.get("ms")), k.get("gbps"), k.get("pct_copy"),
                     k.get("same_bytes_copy_ms"), k.get("pct_same_bytes_copy"), k.get("path")] +
                    [case[b]["ms"] if b in case else None for b in forced])
    text = table(header, body)
    copy = [r for r in other if r.get("op") == "copy"]
    rest = [r for r in other if r.get("op") != "copy"]
    if copy:
        text = f"Copy ceiling ({copy[0].get('shape')}, read + write): {copy[0].get('gbps')} GB/s.\n\n" + text
    return text + ("\n\n" + plain_table(rest) if rest else "")


def attention_table(rows: list[dict]) -> str:
    def with_tflops(ms, shape):
        if ms is None:
            return "-"
        batch, q_len, kv_len, heads, dim = shape
        return f"{ms} ({4 * batch * heads * q_len * kv_len * dim / ms / 1e9:.0f})"

    body = [[r.get("shape"), r.get("dtype"), with_tflops(r.get("sdpa_ms"), r["shape"]), r.get("heuristic"),
             with_tflops(r.get("heuristic_ms"), r["shape"]), r.get("best"), with_tflops(r.get("best_ms"), r["shape"]),
             r.get("best_vs_sdpa")] for r in rows]
    text = table(["B, Lq, Lk, H, D", "dtype", "SDPA ms (TF/s)", "heuristic", "heuristic ms (TF/s)", "best instance",
                  "best ms (TF/s)", "SDPA / best"], body)
    names = list(dict.fromkeys(n for r in rows for n in r.get("instances_ms", {})))
    if names:
        shapes = [",".join(map(str, r["shape"])) if isinstance(r["shape"], list) else r["shape"] for r in rows]
        text += "\n\nEvery instance, ms:\n\n" + table(["instance"] + shapes,
                                                      [[n] + [r.get("instances_ms", {}).get(n) for r in rows]
                                                       for n in names])
    return text


def run_section(run: dict, page_kind: str) -> str:
    short = run["commit"][:7] if re.fullmatch(r"[0-9a-f]{8,40}", run["commit"]) else run["commit"]
    facts = [f"date {run['date']}", f"device {run['device']}", f"commit `{short}`"]
    facts += [f"{k} `{run[k]}`" for k in ("torch",) if k in run]
    lines = [f"### {run['run']}", "", " · ".join(facts) + "  ", f"command: `{run['command']}`"]
    if "commit_note" in run:
        lines[-1] += "  "
        lines.append(f"commit note: {run['commit_note']}")
    skip = {"run", "bench", "date", "device", "commit", "command", "torch", "commit_note", "note", "results",
            "profiles"}
    for key, value in run.items():
        if key not in skip:
            shown = cell(value) if not isinstance(value, (dict, list)) or len(json.dumps(value)) < 300 else \
                f"({len(value)} entries, in the data file)"
            lines[-1] += "  "
            lines.append(f"{key}: {shown}")
    if run.get("note"):
        lines += ["", run["note"]]
    rows = run["results"]
    if rows:
        render = {"pipeline": engine_table, "kernel": kernel_table, "attention": attention_table}.get(page_kind)
        lines += ["", render(rows) if render else plain_table(rows, BASELINES.get(run["bench"]))]
    for label, text in run.get("profiles", {}).items():
        lines += ["", f"<details><summary>Profile of {run.get('profiled', 'one generation')}, {label}</summary>", "", "```", text, "```", "",
                  "</details>"]
    return "\n".join(lines)


def page(name: str, runs: list[dict]) -> str:
    page_kind = kind(runs)
    newest = runs[-1]
    lines = [f"# {name}: {runs[0]['bench']} on {newest['device']}", "",
             f"Generated by `python bench/render_results.py` from [data/{name}.jsonl](data/{name}.jsonl): "
             f"{len(runs)} run{'s' * (len(runs) != 1)}, newest first. Do not edit; edit the data.", ""]
    if page_kind in INTROS:
        lines += [INTROS[page_kind], ""]
    if page_kind == "pipeline":
        lines += [f"![newest run]({name}.png)", ""]
    for run in reversed(runs):
        lines += [run_section(run, page_kind), ""]
    return "\n".join(lines)


def _engines(run: dict) -> dict[str, dict]:
    return {r["engine"]: r for r in run["results"] if r.get("label") == r.get("engine") and "median_s" in r}


def pipeline_table(runs: list[tuple[str, dict]]) -> str:
    """One line per run (data file name, run): its engines' median seconds (columns of engines no run has are left
    out), rocm_sd against eager, and rocm_sd's first call."""
    def seconds(value):
        return f"{value:.3f}" if isinstance(value, (int, float)) else value

    present = [e for e in PIPELINE_ENGINES if any(e in _engines(run) for _, run in runs)]
    body = []
    for name, run in runs:
        engines = _engines(run)
        r = next(iter(engines.values()))
        rocm = engines.get("rocm_sd", {})
        body.append([f"{r['model']} {r['width']}x{r['height']}, {r['steps']} steps, batch {r['batch']}", run["device"],
                     run["date"], f"[{run['commit'][:7]}](bench/results/{name}.md#{run['run']})"] +
                    [seconds(engines.get(e, {}).get("median_s")) for e in present] +
                    [ratio(engines.get("eager", {}).get("median_s"), rocm.get("median_s")),
                     seconds(rocm.get("first_s"))])
    return table(["model", "device", "date", "run"] + [f"{e} s" for e in present] +
                 ["rocm_sd vs eager", "rocm_sd first call s"], body)


def current_block(data: dict[str, list[dict]]) -> str:
    """Per pipeline data file, the newest run that timed eager and rocm_sd with default flags at batch 1."""
    newest = []
    for name, runs in data.items():
        if kind(runs) != "pipeline":
            continue
        full = [run for run in runs if {"eager", "rocm_sd"} <= _engines(run).keys()
                and _engines(run)["rocm_sd"].get("batch") == 1]
        if full:
            newest.append((name, full[-1]))
    return pipeline_table(newest)


def pipelines_block(data: dict[str, list[dict]]) -> str:
    """Every run of every pipeline benchmark, oldest first: the end-to-end history."""
    return pipeline_table([(name, run) for name, runs in data.items() if kind(runs) == "pipeline"
                           for run in runs if _engines(run)])


def _span(values: list[float], unit: str) -> str:
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low:.2f}{unit}" if round(low, 2) == round(high, 2) else f"{low:.2f}-{high:.2f}{unit}"


def summary(runs: list[dict]) -> str:
    """One line on the newest run."""
    rows, page_kind = runs[-1]["results"], kind(runs)
    if not rows:
        return "no rows: the run's facts and note say what it measured"
    if page_kind == "kernel":
        by_case = {}
        for r in rows:
            if "backend" in r and "ms" in r:
                by_case.setdefault((r.get("shape"), r.get("layout")), {})[r["backend"]] = r
        pairs = [c for c in by_case.values() if "torch" in c and "rocm_sd" in c]
        speedups = [c["torch"]["ms"] / c["rocm_sd"]["ms"] for c in pairs]
        return (f"rocm_sd {_span(speedups, 'x')} torch, at most {max(c['rocm_sd'].get('pct_copy', 0) for c in pairs)}% "
                f"of the copy ceiling")
    if page_kind == "attention":
        return f"best instance {_span([r.get('best_vs_sdpa') for r in rows], 'x')} SDPA"
    if page_kind == "pipeline" and _engines(runs[-1]):
        engines = _engines(runs[-1])
        return ", ".join(f"{e} {r['median_s']:.3f} s" for e, r in engines.items())
    bench = runs[-1]["bench"]
    if bench in BASELINES:
        case, time = BASELINES[bench]
        cases = {}
        for r in rows:
            cases.setdefault(r.get(case), []).append(r)
        return "; ".join(f"{name}: {max((c[0][time] / r[time], r['engine']) for r in c[1:])[1]} "
                         f"{max(c[0][time] / r[time] for r in c[1:]):.2f}x {c[0]['engine']}"
                         for name, c in cases.items() if len(c) > 1)
    if any("speedup_vs_1gpu" in r for r in rows):
        return ", ".join(f"{r['model']} {r['mode']} on {r['gpus']} GPUs {r['speedup_vs_1gpu']:.2f}x"
                         for r in rows if r["gpus"] > 1)
    if any("speedup_step" in r for r in rows):
        base = {(r["model"], r["size"]): r["engine"] for r in rows if r["speedup_step"] == 1.0}
        return "; ".join(f"{r['model']} {r['size']}: {r['engine']} {r['speedup_step']:.2f}x "
                         f"{base.get((r['model'], r['size']), 'baseline')} per step"
                         for r in rows if r["speedup_step"] != 1.0)
    return f"{len(rows)} rows"


def index_block(data: dict[str, list[dict]], prefix: str) -> str:
    body = [[f"[{name}]({prefix}{name}.md)", runs[0]["bench"], runs[-1]["device"], len(runs),
             f"[{runs[-1]['run']}]({prefix}{name}.md#{runs[-1]['run']})", summary(runs)]
            for name, runs in sorted(data.items())]
    return table(["page", "benchmark", "device", "runs", "newest run", "newest run in a line"], body)


def index_page(data: dict[str, list[dict]]) -> str:
    return "\n".join([
        "# Benchmark results", "",
        "Generated by `python bench/render_results.py`; do not edit. Every GPU number of this repository is here, from "
        "NVIDIA H100 / H200 GPUs running the HIP sources through the CUDA compat header: no AMD GPU has run this code. "
        "How the files work, and the history in words: [docs/results.md](../../docs/results.md).", "",
        "- `data/<bench>-<device>.jsonl`: the data, one JSON object a line, one line a run (appended by the "
        "benchmarks).",
        "- `<bench>-<device>.md`: every run of one data file, rendered.",
        "- `notes/`: runs kept as prose (profiles, experiments, GPU test ledgers): what they measured has no data "
        "file.",
        "- `amd-resources-*.{md,json}`: AMD code-object resource tables written by `tests/test_build_rocm.py`.", "",
        index_block(data, ""), ""])


def load(data_dir: Path) -> dict[str, list[dict]]:
    return {path.stem: runs for path in sorted(data_dir.glob("*.jsonl")) if (runs := read_runs(path))}


def chart_png(runs: list[dict]) -> bytes | None:
    newest = runs[-1]
    if kind(runs) != "pipeline" or not any("median_s" in r for r in newest["results"]):
        return None
    out = io.BytesIO()
    bar_chart(newest["results"], out, chart_title(newest))
    return out.getvalue()


def fill_blocks(text: str, blocks: dict[str, str]) -> str:
    def replace(match):
        name = match.group(2)
        return match.group(1) + blocks[name] + "\n" + match.group(3) if name in blocks else match.group(0)

    return MARKER.sub(replace, text)


def render(root: Path) -> dict[Path, bytes]:
    """Every generated file under `root` (a checkout) and its content, from root/bench/results/data."""
    results = root / "bench" / "results"
    data = load(results / "data")
    files: dict[Path, bytes] = {}
    for name, runs in data.items():
        files[results / f"{name}.md"] = page(name, runs).encode()
        png = chart_png(runs)
        if png is not None:
            files[results / f"{name}.png"] = png
    files[results / "README.md"] = index_page(data).encode()
    for doc, prefix in ((root / "README.md", "bench/results/"), (root / "docs" / "results.md", "../bench/results/")):
        if doc.exists():
            blocks = {"current": current_block(data), "pipelines": pipelines_block(data),
                      "index": index_block(data, prefix)}
            blocks = {k: v.replace("](bench/results/", f"]({prefix}") for k, v in blocks.items()}
            files[doc] = fill_blocks(doc.read_text(encoding="utf-8"), blocks).encode()
    return files


def stale(files: dict[Path, bytes]) -> list[Path]:
    return [path for path, content in files.items() if not path.exists() or path.read_bytes() != content]


def main(args: argparse.Namespace) -> int:
    files = render(Path(args.root))
    changed = stale(files)
    if args.check:
        for path in changed:
            print(f"out of date: {os.path.relpath(path)} (python bench/render_results.py rewrites it)", file=sys.stderr)
        return 1 if changed else 0
    for path in changed:
        path.write_bytes(files[path])
        print(f"wrote {os.path.relpath(path)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python bench/render_results.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_args.command(parser, main)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is out of date")
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose bench/results/data is rendered")
    return parser


if __name__ == "__main__":
    sys.exit(cli_args.main(build_parser(), None))
