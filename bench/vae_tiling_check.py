"""2048x2048 tiled VAE decode (vae.enable_tiling()) eager vs rocm_sd.optimize: time, peak memory, PSNR.

    python bench/vae_tiling_check.py
"""
import time, torch, rocm_sd
from rocm_sd import models
pipe = models.build_sd_pipeline("sd15", "cuda", torch.float16)
pipe.vae.enable_tiling()
z = torch.randn(1, 4, 256, 256, device="cuda", dtype=torch.float16)  # 2048 x 2048 image
def decode():
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        img = pipe.vae.decode(z, return_dict=False)[0]
    torch.cuda.synchronize(); return img, time.perf_counter() - t
torch.cuda.reset_peak_memory_stats()
ref, t_ref = decode(); ref, t_ref = decode()
peak_ref = torch.cuda.max_memory_allocated() / 2**30
rocm_sd.optimize(pipe)
torch.cuda.reset_peak_memory_stats()
out, t_first = decode(); out, t_opt = decode()
peak_opt = torch.cuda.max_memory_allocated() / 2**30
mse = ((out.float() - ref.float()) / 2).pow(2).mean().item()
import math
print(f"2048x2048 tiled VAE decode: eager {t_ref:.3f} s peak {peak_ref:.2f} GiB | rocm_sd first {t_first:.3f} s, then {t_opt:.3f} s, peak {peak_opt:.2f} GiB | PSNR {10*math.log10(1/mse) if mse else float('inf'):.1f} dB")
print("report vae:", rocm_sd.report(pipe)["vae"])
