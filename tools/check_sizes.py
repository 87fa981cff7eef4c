"""Fail when a module of the package is too long: `make lint` runs this after the check
for repetitions.

No module of `ratelimits/` has more than `MOST` lines. A module that grows past it is
split by responsibility, into modules a reader would look for apart, not cut in halves; a
module on the request path keeps what a request runs, so that a request enters no more
modules than before (`bench/calls.py --walk`).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ratelimits"
#: The most lines a module may have.
MOST = 500
RULE = f"no module of the ratelimits package over {MOST} lines"


def too_long() -> list[tuple[str, int]]:
    """Each module of the package past `MOST` lines, with its count, by path."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        count = len(path.read_text("utf-8").splitlines())
        if count > MOST:
            found.append((path.relative_to(ROOT).as_posix(), count))
    return found


def main() -> int:
    found = too_long()
    for path, count in found:
        print(f"{path}: {count} lines, past {MOST}: {RULE}; split it by responsibility")
    if found:
        return 1
    print(f"module sizes: every module of ratelimits/ holds {MOST} lines or fewer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
