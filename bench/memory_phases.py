"""Peak memory of optimize()'s modes phase by phase on one random-weight pipeline: allocated after optimize(), the
first and second UNet-only calls (output_type="latent": the first captures the graphs and makes the measured
choices), then a whole call with the VAE decode; each mode on a freshly reverted pipeline, with and without graphs.

    python bench/memory_phases.py [sdxl|sd15|sd21] [steps]

`python -m rocm_sd bench`'s peak column is different: it spans optimize() and every call of an engine that runs
after the other engines on the same pipeline.
"""
import json
import sys

import torch

import rocm_sd
from rocm_sd import models

MODES = [{}, {"precision": "fp8"}, {"precision": "fp8", "precision_convs": False}]


def main(model: str, steps: int) -> None:
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

    print("| graphs | mode | after optimize MB | first UNet call: before, peak | second: before, peak | whole call: "
          "before, peak |")
    print("|---|---|---:|---|---|---|")
    for graphs in (True, False):
        for mode in MODES:
            rocm_sd.optimize(pipe, cuda_graph=graphs, **mode)
            after = round(torch.cuda.memory_allocated() / 2**20)
            first, second, whole = call("latent"), call("latent"), call("np")
            text = ", ".join(f"{k}={v}" for k, v in mode.items()) or "fp16"
            print(f"| {graphs} | {text} | {after} | {first[0]}, {first[1]} | {second[0]}, {second[1]} | "
                  f"{whole[0]}, {whole[1]} |", flush=True)
            rocm_sd.revert(pipe)
            torch.cuda.empty_cache()
    print(json.dumps({"model": model, "steps": steps, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"{sys.argv[0]}: no GPU visible to torch {torch.__version__}; this measures GPU memory")
    main(sys.argv[1] if len(sys.argv) > 1 else "sdxl", int(sys.argv[2]) if len(sys.argv) > 2 else 30)
