"""modules.devices (stand-in): the webui's device and the UNet's and VAE's compute dtypes (as with --use-cpu all)."""
import torch

device = torch.device("cpu")
dtype_unet = torch.float32
dtype_vae = torch.float32
