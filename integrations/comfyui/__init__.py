"""rocm_sd for ComfyUI: copy or symlink this folder into ComfyUI/custom_nodes/ (README.md here)."""
from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
