"""The subcommands' output: plain-text columns, counts and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[int]) -> str:
    """Plain-text columns: text left-aligned, the columns in `right` right-aligned."""
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def count(value: int) -> str:
    """A count with thousands separators."""
    return f"{value:,}"


def dumps(data: Any) -> str:
    """`data` as indented JSON, anything JSON lacks (a datetime) as its text."""
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)
