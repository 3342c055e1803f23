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
