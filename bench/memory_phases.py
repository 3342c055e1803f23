"""Peak memory of optimize()'s modes phase by phase on one random-weight pipeline: allocated after optimize(), the
first and second UNet-only calls (output_type="latent": the first captures the graphs and makes the measured
choices), then a whole call with the VAE decode; each mode on a freshly reverted pipeline, with and without graphs.

    python bench/memory_phases.py [sdxl|sd15|sd21] [steps] [modes] [graphs]

modes: comma-separated names of MODES (default fp16,fp8,fp8-noconvs); graphs: on, off or both (default both).

`python -m rocm_sd bench`'s peak column is different: it spans optimize() and every call of an engine that runs
after the other engines on the same pipeline.
"""
import gc
import json
import sys

import torch

import rocm_sd
from rocm_sd import bench, models

MODES = {"fp16": {}, "fp8": bench.MODES["rocm_sd-fp8"], "fp8-noconvs": {"precision": "fp8", "precision_convs": False},
         "deepcache": bench.MODES["rocm_sd-deepcache"]}
GRAPHS = {"on": (True,), "off": (False,), "both": (True, False)}


def main(model: str, steps: int, modes: list[str], graphs_choice: str) -> None:
    size = models.default_size(model)
    pipe = models.build_sd_pipeline(model, "cuda", torch.float16)
    kw = models.prompt_kwargs(pipe, "a watercolor painting of a lighthouse at dawn")

    def call(output_type: str) -> tuple[int, int]:
        """(allocated before, peak during) one pipeline call, MB."""
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            pipe(**kw, num_inference_steps=steps, height=size, width=size, output_type=output_type,
                 generator=torch.Generator("cuda").manual_seed(0))
        torch.cuda.synchronize()
        return round(base / 2**20), round(torch.cuda.max_memory_allocated() / 2**20)

    print("| graphs | mode | before optimize MB | after optimize MB | first UNet call: before, peak | second: before, "
          "peak | whole call: before, peak | after revert MB |")
    print("|---|---|---:|---:|---|---|---|---:|")
    for graphs in GRAPHS[graphs_choice]:
        for mode in (MODES[name] for name in modes):
            gc.collect()
            before = round(torch.cuda.memory_allocated() / 2**20)
            rocm_sd.optimize(pipe, cuda_graph=graphs, **mode)
            after = round(torch.cuda.memory_allocated() / 2**20)
            first, second, whole = call("latent"), call("latent"), call("np")
            text = bench.mode_text(mode) or "fp16"
            rocm_sd.revert(pipe)
            gc.collect()
            torch.cuda.empty_cache()
            reverted = round(torch.cuda.memory_allocated() / 2**20)
            print(f"| {graphs} | {text} | {before} | {after} | {first[0]}, {first[1]} | {second[0]}, {second[1]} | "
                  f"{whole[0]}, {whole[1]} | {reverted} |", flush=True)
    print(json.dumps({"model": model, "steps": steps, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: no GPU visible to torch {torch.__version__}; this measures GPU memory")
    args = sys.argv[1:] + [None] * 4
    modes = (args[2] or "fp16,fp8,fp8-noconvs").split(",")
    unknown = [m for m in modes if m not in MODES] + ([args[3]] if args[3] and args[3] not in GRAPHS else [])
    if unknown:
        sys.exit(f"{sys.argv[0]}: unknown mode or graphs choice {', '.join(unknown)}; modes: {', '.join(MODES)}; "
                 f"graphs: {', '.join(GRAPHS)}")
    main(args[0] or "sdxl", int(args[1] or 30), modes, args[3] or "both")
