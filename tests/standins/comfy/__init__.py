"""Stand-in of ComfyUI's `comfy` package (tests/standins/README.md)."""
