"""Every benchmark section in one run, written as Markdown (`make bench`).

    .venv/bin/python bench/run_all.py [--quick] [--write docs/benchmarks.md] [--only 1,3]

Sections run one after another on this machine, each against the same local Redis, and
every ratio is taken between rows measured in the same section. The report starts with
the machine, the versions and the command, then a summary of every target.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    adaptive,
    asgi,
    calls,
    capacity,
    cluster,
    common,
    e2e,
    engine,
    exactness,
    memory,
    overrides,
    postgres,
    replay,
    request_path,
)
from bench.common import Section, table

SECTIONS = {
    "1": engine.run,
    "2": capacity.run,
    "3": e2e.run,
    "4": memory.run,
    "5": exactness.run,
    "6": replay.run,
    "7": cluster.run,
    "8": overrides.run,
    "9": request_path.run,
    "10": asgi.run,
    "11": adaptive.run,
    "12": calls.run,
    "13": postgres.run,
}


def report(sections: list[Section], command: str, seconds: float) -> str:
    checks = [(s.title.split(".")[0], c) for s in sections for c in s.checks]
    summary = table(
        ["§", "ratio", "measured", "target", ""],
        [[number, *c.row()] for number, c in checks],
        "llrrl",
    )
    parts = [
        "# Benchmarks",
        "Speed, memory and exactness of ratelimits beside the libraries a Django shop would "
        "otherwise use, measured side by side on one machine and one Redis in one run. "
        "Absolute figures drift on a shared machine; the ratios between rows of one table "
        "are what the targets are about, and every row of a table was measured in the same "
        "interleaved rounds. The scripts live in `bench/`; each section also runs alone "
        "(`.venv/bin/python bench/engine.py`, ... with `--quick` for a short run).",
        f"Produced by `{command}` on {datetime.date.today().isoformat()} in "
        f"{seconds / 60:.1f} minutes.",
        "## Machine and versions\n\n"
        + table(["", ""], [list(r) for r in common.machine()], "ll"),
        "## Summary of the targets\n\n" + summary,
        *[s.markdown() for s in sections],
    ]
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few, short repetitions")
    parser.add_argument("--write", metavar="PATH", help="write the Markdown report here")
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections, e.g. 1,4")
    opts = parser.parse_args(argv)
    chosen = [n.strip() for n in opts.only.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from 1-12")

    start = time.perf_counter()
    sections = []
    for number in chosen:
        print(f"section {number} ...", file=sys.stderr, flush=True)
        section = common.timed(SECTIONS[number], quick=opts.quick)
        print(f"section {number} done in {section.seconds:.0f} s", file=sys.stderr, flush=True)
        sections.append(section)
    command = "make bench" if opts.write and not opts.quick and opts.only == ",".join(
        SECTIONS) else "python bench/run_all.py " + " ".join(argv or sys.argv[1:])
    text = report(sections, command, time.perf_counter() - start)
    if opts.write:
        path = Path(opts.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
