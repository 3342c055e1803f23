"""comfy/samplers.py's schedule for a model's sampling (calculate_sigmas with the "normal" scheduler, which KSampler
uses by default), as at a125cd84."""
import math

import torch


def normal_scheduler(model_sampling, steps, sgm=False, floor=False):
    s = model_sampling
    start = s.timestep(s.sigma_max)
    end = s.timestep(s.sigma_min)

    append_zero = True
    if sgm:
        timesteps = torch.linspace(start, end, steps + 1)[:-1]
    else:
        if math.isclose(float(s.sigma(end)), 0, abs_tol=0.00001):
            steps += 1
            append_zero = False
        timesteps = torch.linspace(start, end, steps)

    sigs = []
    for x in range(len(timesteps)):
        ts = timesteps[x]
        sigs.append(float(s.sigma(ts)))

    if append_zero:
        sigs += [0.0]

    return torch.FloatTensor(sigs)


def calculate_sigmas(model_sampling, scheduler_name, steps):
    if scheduler_name != "normal":
        raise ValueError(f"the stand-in has only the 'normal' scheduler, not {scheduler_name}")
    return normal_scheduler(model_sampling, steps)
