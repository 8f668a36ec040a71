"""The README's two commands, read from README.md: what `.ci/run` runs and what tests/test_dependencies.py holds.

    python3 scripts/readme_commands.py install   # the `pip install ...` part of the first command (up to `&&`)
    python3 scripts/readme_commands.py tests     # the test command (the second bash block's first line)

One reader for both, so CI cannot run something other than what the test checks the README says (issue 70). Only the
standard library: CI calls it before any environment exists.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands(readme: Path = README) -> dict[str, str]:
    """{"install": the first bash block's `pip install` line cut at `&&`, "tests": the second block's first line}."""
    blocks = re.findall(r"^```bash\n(.*?)^```", readme.read_text(encoding="utf-8"), re.S | re.M)
    if len(blocks) < 2:
        raise SystemExit(f"{readme}: fewer than two ```bash blocks; the README's first two are its two commands")
    install = next((ln.split(" && ")[0] for ln in blocks[0].splitlines() if ln.startswith("pip install ")), None)
    tests = next((ln for ln in blocks[1].splitlines() if ln.strip()), None)
    if install is None or tests is None:
        raise SystemExit(f"{readme}: no `pip install` line in its first bash block, or no command in its second")
    return {"install": install, "tests": tests}


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("install", "tests"):
        raise SystemExit("usage: python3 scripts/readme_commands.py install|tests")
    print(readme_commands()[sys.argv[1]])
