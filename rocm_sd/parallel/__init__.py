"""Several GPUs through torch.distributed, launched by torchrun: prompts over GPUs (data parallel), each
image's guidance halves over a pair of GPUs (cfg), each diffusion-transformer step's image tokens over all
GPUs (seq), or each UNet step's rows over all GPUs (patch). See mesh.py for the modes, rounds.py for how work is
dealt and failures stop the job, lookout.py for the failures no collective can carry, cfg.py for the split UNet
step, seq.py for the split transformer step, patch.py for the UNet split by rows (DistriFusion), vae_split.py
for the VAE decode over an image's ranks, generate.py for the command (arguments.py its arguments). The names below are imported at their first use: `python -m rocm_sd generate --help` reads
arguments.py without importing torch."""
from .._lazy import lazy_attributes

__all__ = ["Mesh", "init", "shutdown", "Job", "prepare", "run", "JobFailed", "enable_cfg_parallel",
           "disable_cfg_parallel", "enable_sequence_parallel", "disable_sequence_parallel", "enable_vae_split",
           "disable_vae_split", "enable_patch_parallel", "disable_patch_parallel"]
__getattr__, __dir__ = lazy_attributes(__name__, {
    "Mesh": ".mesh", "init": ".mesh", "shutdown": ".mesh", "Job": ".generate", "prepare": ".generate",
    "run": ".generate", "JobFailed": ".rounds", "enable_cfg_parallel": ".cfg", "disable_cfg_parallel": ".cfg",
    "enable_sequence_parallel": ".seq", "disable_sequence_parallel": ".seq", "enable_vae_split": ".vae_split",
    "disable_vae_split": ".vae_split", "enable_patch_parallel": ".patch", "disable_patch_parallel": ".patch"})
