"""comfy.utils: dotted attribute access as ModelPatcher uses it for object patches."""


def get_attr(obj, attr: str):
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def set_attr(obj, attr: str, value):
    """Set a dotted attribute; returns the previous value (ComfyUI keeps it to undo the patch)."""
    *path, last = attr.split(".")
    for name in path:
        obj = getattr(obj, name)
    previous = getattr(obj, last)
    setattr(obj, last, value)
    return previous
