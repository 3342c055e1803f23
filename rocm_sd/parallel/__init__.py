"""Several GPUs through torch.distributed, launched by torchrun: prompts over GPUs (data parallel), each
image's guidance halves over a pair of GPUs (cfg), or each diffusion-transformer step's image tokens over all
GPUs (seq). See mesh.py for the modes, rounds.py for how work is dealt and failures stop the job, lookout.py
for the failures no collective can carry, cfg.py for the split UNet step, seq.py for the split transformer
step, generate.py for the command."""
from .cfg import disable_cfg_parallel, enable_cfg_parallel
from .generate import Job, prepare, run
from .mesh import Mesh, init, shutdown
from .rounds import JobFailed
from .seq import disable_sequence_parallel, enable_sequence_parallel

__all__ = ["Mesh", "init", "shutdown", "Job", "prepare", "run", "JobFailed", "enable_cfg_parallel",
           "disable_cfg_parallel", "enable_sequence_parallel", "disable_sequence_parallel"]
