"""Writes optimize()'s flag table (rocm_sd/patch/flags.py's FLAGS, where each flag is documented) into
docs/usage.md between its generated markers:

    python docs/flags_table.py
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
START = "<!-- generated: optimize flags (docs/flags_table.py, from rocm_sd/patch/flags.py's FLAGS) -->"
END = "<!-- /generated -->"


def render(text: str) -> str:
    from rocm_sd.patch.flags import flags_table

    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"docs/usage.md has no {START} ... {END} block")
    return pattern.sub(lambda _: f"{START}\n{flags_table()}\n{END}", text)


if __name__ == "__main__":
    usage = ROOT / "docs" / "usage.md"
    usage.write_text(render(usage.read_text()))
    print(f"wrote the flag table into {usage}")
