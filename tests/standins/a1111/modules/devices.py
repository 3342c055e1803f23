"""modules.devices (stand-in): the webui's device and the UNet's compute dtype (as with --use-cpu all)."""
import torch

device = torch.device("cpu")
dtype_unet = torch.float32
