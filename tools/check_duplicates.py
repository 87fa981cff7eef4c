"""Fail when the package repeats itself: `make lint` runs this after the layer check.

It asks the `duplicates` command (on the development machines and CI; where it is not
installed this check says so and passes) for every pair of places in `ratelimits/` that
share six or more identical lines. Migrations are generated and left out. A pair alike
only in shape (same structure, other names) is shown but does not fail: it is a place to
look, not a verdict. An identical run fails: make one piece of code serve both places,
or, where the repetition is the point (two public functions with one upstream signature),
say so in a `# repeats: <why>` comment on the run or just above it, in either file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ratelimits"
#: `D3 engine/flows.py:24-33 ~ engine/flows.py:41-50 (+1 more run)`
ROW = re.compile(
    r"^D\d+ (?P<a>\S+):(?P<a0>\d+)-(?P<a1>\d+) ~ (?P<b>\S+):(?P<b0>\d+)-(?P<b1>\d+)(?P<tail>.*)$"
)
#: A comment that accepts a repetition, with its reason.
ACCEPTED = "# repeats:"
#: How many lines above a run its `# repeats:` comment may stand.
ABOVE = 3
GENERATED = ("migrations/",)


def rows(report: str) -> tuple[list[str], list[str]]:
    """The report's identical pairs and its same-shape pairs, generated files left out."""
    identical, shaped = [], []
    for line in report.splitlines():
        found = ROW.match(line)
        if found is None or any(
            found[side].startswith(GENERATED) for side in ("a", "b")
        ):
            continue
        if "shape" in found["tail"]:
            shaped.append(line)
        elif not accepted(found):
            identical.append(line)
    return identical, shaped


def accepted(found: re.Match[str]) -> bool:
    """Whether either side of the pair says why it repeats the other."""
    for side in ("a", "b"):
        lines = (PACKAGE / found[side]).read_text("utf-8").splitlines()
        first, last = int(found[side + "0"]), int(found[side + "1"])
        if any(ACCEPTED in text for text in lines[max(0, first - 1 - ABOVE):last]):
            return True
    return False


def main() -> int:
    command = shutil.which("duplicates")
    if command is None:
        print("check_duplicates: the `duplicates` command is not installed here; skipped")
        return 0
    report = subprocess.run(
        [command, "--repo", str(PACKAGE), "--most", "200", "--seconds", "120"],
        capture_output=True, text=True, check=False,
    ).stdout
    if "incomplete:" in report:
        print(report)
        print("check_duplicates: `duplicates` did not read the whole package")
        return 1
    identical, shaped = rows(report)
    for line in shaped:
        print(f"alike in shape (not an error): {line}")
    if identical:
        print("\n".join(identical))
        print(f"check_duplicates: {len(identical)} identical runs of 6+ lines in ratelimits/; "
              "make one piece of code serve both places")
        return 1
    print(f"check_duplicates: no identical runs ({len(shaped)} pairs alike in shape)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
