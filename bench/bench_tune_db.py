"""Tuning-database writes under contention: W processes record R results each into one database, either one
locked save per result (TuningDB.record outside a batch) or batched (TuningDB.batched, as the tuner saves).
Prints wall time and the longest single save per mode; no GPU needed (the database is plain files).

    python bench/bench_tune_db.py --writers 8 --records 200
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rocm_sd.bench import append_run, run_meta  # noqa: E402
from rocm_sd.tune.db import TuningDB, problem_key  # noqa: E402
from rocm_sd.tune.device_keys import DeviceKey  # noqa: E402

DEVICE = DeviceKey("hip", "gfx942:sramecc+:xnack-", 304, 64)
VALIDATORS = {"rocm_sd": "bench", "kernels": "bench", "runtime": "bench", "driver": "bench", "torch": "bench"}
# A tuner measures a problem in roughly a second; the writers here record as fast as they can, the worst case.
BATCH_INTERVAL_S = 1.0


def _writer(folder: str, worker: int, records: int, batched: bool, out) -> None:
    db = TuningDB(DEVICE, VALIDATORS, location=Path(folder), defaults_dir=None)
    longest = 0.0
    with db.batched(BATCH_INTERVAL_S) if batched else contextlib.nullcontext():
        for i in range(records):
            start = time.perf_counter()
            db.record(problem_key("op", "float16", "nhwc", worker=worker, i=i), {"choice": "torch", "ms": 0.01})
            longest = max(longest, time.perf_counter() - start)
        start = time.perf_counter()
    out.put(max(longest, time.perf_counter() - start))  # the batch's last save happens on leaving the block


def run(writers: int, records: int, batched: bool) -> dict:
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        procs = [ctx.Process(target=_writer, args=(folder, w, records, batched, results)) for w in range(writers)]
        for p in procs:
            p.start()
        longest = max(results.get() for _ in procs)
        for p in procs:
            p.join()
        wall = time.perf_counter() - start
        saved = len(TuningDB(DEVICE, VALIDATORS, location=Path(folder), defaults_dir=None))
    return {"mode": "batched" if batched else "per record", "writers": writers, "records_each": records,
            "wall_s": round(wall, 2), "longest_save_s": round(longest, 3), "saved": saved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    rows = [run(args.writers, args.records, batched) for batched in (False, True)]
    lines = ["| mode | writers | records each | wall s | longest save s | results saved |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['mode']} | {r['writers']} | {r['records_each']} | {r['wall_s']} | {r['longest_save_s']} | "
              f"{r['saved']} |" for r in rows]
    print("\n".join(lines))
    if args.out_dir:
        meta = run_meta(f"CPU, {os.cpu_count()} cores ({platform.node()})", " ".join(["python"] + sys.argv))
        path, written = append_run(args.out_dir, "tune_db-contention", meta, rows)
        print(f"appended run {written['run']} to {path}")


if __name__ == "__main__":
    main()
