"""Does PyTorch TunableOp (GEMM algorithm search) speed up the optimized pipeline on this GPU?

    python bench/bench_tunableop.py [--model sd15] [--size 512] [--steps 50] [--rounds 3]

1. Tunes: the optimized pipeline without graphs (so no tuning runs inside a capture) runs 2 steps and the
   decode with TunableOp tuning on; the results file is written.
2. Times, in alternating rounds: the optimized, graph-captured pipeline with TunableOp off (vendor default
   algorithms) and with TunableOp on in use-only mode reading the file (graphs re-captured each round).
Prints a table: median seconds per image per round and mode, and the GEMM problems TunableOp tuned.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rocm_sd  # noqa: E402
from rocm_sd import models  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sd15")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tunable = torch.cuda.tunable
    pipe = models.build_sd_pipeline(args.model, "cuda", torch.float16)
    conditioning = models.prompt_kwargs(pipe, "a photo of a cat")

    def run(steps):
        with torch.no_grad():
            return pipe(**conditioning, num_inference_steps=steps, height=args.size, width=args.size,
                        generator=torch.Generator("cuda").manual_seed(0), output_type="latent").images

    results = os.path.join(tempfile.mkdtemp(), "tunableop.csv")
    tunable.set_filename(results)
    tunable.enable(True)
    tunable.tuning_enable(True)
    rocm_sd.optimize(pipe, cuda_graph=False)
    start = time.perf_counter()
    run(2)
    torch.cuda.synchronize()
    tune_s = time.perf_counter() - start
    tunable.tuning_enable(False)  # the results stay in memory for the use-only rounds below
    tuned = tunable.get_results()
    rocm_sd.revert(pipe)
    print(f"TunableOp tuned {len(tuned)} GEMM problems in {tune_s:.1f} s ({torch.cuda.get_device_name()})")

    times = {"off": [], "on": []}
    for round_ in range(args.rounds):
        for mode in ("off", "on"):
            tunable.enable(mode == "on")
            rocm_sd.optimize(pipe)
            run(args.steps)  # captures
            samples = []
            for _ in range(args.repeats):
                torch.cuda.synchronize()
                start = time.perf_counter()
                run(args.steps)
                torch.cuda.synchronize()
                samples.append(time.perf_counter() - start)
            rocm_sd.revert(pipe)
            times[mode].append(statistics.median(samples))
            print(f"round {round_ + 1} TunableOp {mode}: {times[mode][-1]:.4f} s")
    print("| TunableOp | " + " | ".join(f"round {i + 1}" for i in range(args.rounds)) + " | median |")
    print("|---|" + "---:|" * (args.rounds + 1))
    for mode, values in times.items():
        print(f"| {mode} | " + " | ".join(f"{v:.4f}" for v in values) + f" | {statistics.median(values):.4f} |")
    for row in tuned[:60]:
        print("tuned:", row)


if __name__ == "__main__":
    main()
