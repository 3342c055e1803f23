"""modules.processing (stand-in): StableDiffusionProcessingTxt2Img and process_images as v1.10.1 (82a973c0) has
them, a txt2img reduced to its model calls: the text encoder (get_learned_conditioning) for the prompts and negative
prompts, `steps` UNet evaluations through sd_model.apply_model with cond and uncond batched (sd_samplers_cfg_denoiser
with opts.batch_cond_uncond, its default), and decode_first_stage per image (decode_latent_batch); with a script runner (p.scripts), its before_process, process_before_every_sampling
and postprocess callbacks, as Forge's processing calls them. Each processing
object is kept in `runs` (with whether it was closed)."""
import torch

runs = []


class Processed:
    def __init__(self, p, images):
        self.images, self.width, self.height = images, p.width, p.height


class StableDiffusionProcessingTxt2Img:
    def __init__(self, sd_model=None, prompt="", negative_prompt="", steps=50, width=512, height=512, batch_size=1,
                 n_iter=1, sampler_name=None, cfg_scale=7.0, do_not_save_samples=False, do_not_save_grid=False,
                 **kwargs):
        self.sd_model, self.prompt, self.negative_prompt, self.steps = sd_model, prompt, negative_prompt, steps
        self.width, self.height, self.batch_size, self.n_iter = width, height, batch_size, n_iter
        self.sampler_name, self.cfg_scale = sampler_name, cfg_scale
        self.do_not_save_samples, self.do_not_save_grid, self.closed = do_not_save_samples, do_not_save_grid, False
        self.scripts = None

    def close(self):
        self.closed = True


def process_images(p) -> Processed:
    runs.append(p)
    if p.scripts is not None:
        p.scripts.before_process(p)
    model = p.sd_model
    cond = model.get_learned_conditioning([p.prompt] * p.batch_size)
    uncond = model.get_learned_conditioning([p.negative_prompt] * p.batch_size)
    x = torch.randn(p.batch_size, 4, p.height // 8, p.width // 8)
    if p.scripts is not None:  # as Forge's sample() calls it (and A1111's since v1.9)
        p.scripts.process_before_every_sampling(p, x=x, noise=x, c=cond, uc=uncond)
    for _ in range(p.n_iter * p.steps):
        out = model.apply_model(torch.cat([x, x]), torch.full((2 * p.batch_size,), 999), torch.cat([cond, uncond]))
        x = x - 0.1 * out[:p.batch_size]
    processed = Processed(p, [model.decode_first_stage(x[i:i + 1])[0] for i in range(p.batch_size)])
    if p.scripts is not None:
        p.scripts.postprocess(p, processed)
    return processed
