"""The ops (torch.ops.rocm_sd.*) and the tuned choices they dispatch by register with torch when torch is there:
at once when torch is imported already, else the moment `import torch` completes, whoever imports it.

`import rocm_sd` stays light (a process that never imports torch, such as `python -m rocm_sd --help`, never pays
for it), and `import rocm_sd` followed by `torch.ops.rocm_sd.<op>` works in either import order."""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings


def register() -> None:
    from . import ops  # noqa: F401  (registers torch.ops.rocm_sd.*)
    from .tune import active  # noqa: F401  (the tuned choices the ops dispatch by)


class _RegisterAfter(importlib.abc.Loader):
    """torch's own loader, then register(); torch's module keeps its own loader afterwards."""

    def __init__(self, loader: importlib.abc.Loader, finder: "_TorchImport"):
        self.loader = loader
        self.finder = finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        try:
            register()
        except Exception as error:  # a broken rocm_sd must not break every later `import torch` of the process
            warnings.warn(f"rocm_sd: its ops did not register with torch ({type(error).__name__}: {error}); "
                          "torch.ops.rocm_sd.* is missing until `import rocm_sd.ops` succeeds", stacklevel=2)


class _TorchImport(importlib.abc.MetaPathFinder):
    """Answers for `torch` only, until torch's import completes: the spec the other finders give, with register()
    after its loader. It stays on sys.meta_path until then, so a mere lookup (importlib.util.find_spec("torch"), as
    diffusers' is_torch_available does) or a failed import does not use it up."""

    def __init__(self):
        self._asking = False  # while it asks the finders after it (importlib.util.find_spec runs them all again)

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self._asking:
            return None
        self._asking = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._asking = False
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterAfter(spec.loader, self)
        return spec


def register_with_torch() -> None:
    """register() now if torch is imported, else when its import completes."""
    if "torch" in sys.modules:
        register()
    elif not any(isinstance(finder, _TorchImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchImport())
