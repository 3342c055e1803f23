"""Documentation generated from the code stays what the code says."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_documented_flag_table_is_optimizes_own():
    """optimize()'s flags are documented once, in rocm_sd/patch/flags.py's FLAGS; docs/usage.md shows that table
    (python docs/flags_table.py writes it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("flags_table", ROOT / "docs" / "flags_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    usage = (ROOT / "docs" / "usage.md").read_text()
    assert module.render(usage) == usage, "docs/usage.md's flag table is stale: run python docs/flags_table.py"


def _build_requires():
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]


def _code_blocks(markdown):
    """The lines of each fenced block of a markdown page."""
    blocks, block = [], None
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                blocks.append(block)
                block = None
        elif block is not None:
            block.append(line)
    return blocks


def test_every_install_without_build_isolation_installs_the_build_requirements_first():
    """`pip install --no-build-isolation` builds with what the environment has: a host app's venv (ComfyUI's,
    A1111's) lacks scikit-build-core and pybind11, and the install fails with ModuleNotFoundError. Every command
    block that gives it installs pyproject.toml's build requirements, at their pinned versions, on a line before."""
    requires = _build_requires()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "integrations").rglob("*.md"))]
    checked = 0
    for page in pages:
        for lines in _code_blocks(page.read_text()):
            for i, line in enumerate(lines):
                if "--no-build-isolation" not in line or not line.lstrip().startswith("pip install"):
                    continue
                before = "\n".join(lines[:i])
                missing = [r for r in requires if f'"{r}"' not in before]
                assert not missing, f"{page.relative_to(ROOT)}: `{line.strip()}` without {missing} installed before it"
                checked += 1
    assert checked >= 3, "the README's, docs/comfyui.md's and the ComfyUI node's install blocks were not found"
