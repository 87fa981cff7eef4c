"""`manage.py ratelimits replay <access-log> [--format auto|combined|json] [--top N]
[--policy NAME ...] [--skip-bad] [--progress] [--jobs N] [--json]`: what would the
current policies have refused, and whom?"""

from __future__ import annotations

import dataclasses
import datetime
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ratelimits.conf import get_config
from ratelimits.management.subcommands.lookup import policy_named
from ratelimits.management.subcommands.subcommand import Subcommand
from ratelimits.management.subcommands.text import count, dumps, table
from ratelimits.matching.identity import display_identity
from ratelimits.ops.dashboard import percent
from ratelimits.ops.replay import LogError, Report, replay_file
from ratelimits.ops.replay.selection import Selection, enabled_policies, select


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument(
        "log",
        help="Access log: combined/common log format or JSON "
        "lines, plain or gzip; '-' reads standard input.",
    )
    parser.add_argument(
        "--format",
        choices=("auto", "combined", "json"),
        default="auto",
        help="Log format (default: detected from the first line).",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=5,
        metavar="N",
        help="Top offenders shown per policy (default 5).",
    )
    parser.add_argument(
        "--policy",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="Replay only these policies (an 'off' one is replayed as shadow).",
    )
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="Skip malformed lines (counted) instead of stopping.",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="Show progress on stderr even when it is not a terminal.",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="Processes to split a large log file by client across (default: one per "
        "idle CPU, at most 4; one for a small file, standard input, or policies with "
        "a global, query or mixed key).",
    )
    parser.add_argument("--json", action="store_true", help="Print JSON instead of text.")


def handle(
    command: BaseCommand,
    *,
    log: str,
    format: str,
    top: int,
    policy: list[str],
    skip_bad: bool,
    progress: bool,
    jobs: int | None,
    json: bool,
    **_: object,
) -> None:
    if top < 0:
        raise CommandError("--top must be 0 or more")
    if jobs is not None and jobs < 1:
        raise CommandError("--jobs must be 1 or more")
    selection = _selection(policy)
    bar = _progress_bar(command.stderr) if progress or sys.stderr.isatty() else None
    try:
        report = replay_file(
            log,
            selection.policies,
            ipv6_prefix=get_config()["IPV6_PREFIX"],
            fmt=format,
            skip_bad=skip_bad,
            top=top,
            progress=bar,
            jobs=jobs,
        )
    except LogError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot read {log}: {exc.strerror or exc}") from None
    finally:
        if bar is not None:
            bar.close()
    if selection.invalid:
        report = dataclasses.replace(
            report, skipped_policies=report.skipped_policies + selection.invalid
        )
    if json:
        command.stdout.write(dumps(dataclasses.asdict(report)))
    else:
        command.stdout.write(_text(report, top))


def _selection(names: list[str]) -> Selection:
    """The policies named (each once), or every enabled one when none is."""
    if names:
        return select([policy_named(n) for n in dict.fromkeys(names)])
    return select(enabled_policies())


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "?"
    moment = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _text(report: Report, top: int) -> str:
    """The report as text: the log, a table of the policies, their top offenders, notes."""
    out = [
        f"Replayed {report.source} ({report.format}): {report.lines:,} lines, "
        f"{report.requests:,} requests from {_when(report.first)} to {_when(report.last)}, "
        f"in {report.seconds:.1f} s.",
    ]
    for name, why in report.skipped_policies:
        out.append(f"Not replayed: {name}: {why}.")
    out += _policies_table(report)
    out += _offenders(report, top)
    notes = _notes(report)
    if notes:
        out += ["", *notes]
    return "\n".join(out)


def _policies_table(report: Report) -> list[str]:
    if not report.policies:
        return ["No policy could be replayed."]
    rows = [
        [p.name, p.mode, count(p.matched), count(p.refused), percent(p.refused_share),
         count(p.peak_second), count(p.peak_minute)]
        for p in report.policies
    ]
    return [
        "",
        table(
            ["policy", "mode", "matched", "would reject", "share", "peak/s", "peak/min"],
            rows,
            right={2, 3, 4, 5, 6},
        ),
        "would reject: requests this policy refused (enforce) or would have "
        "(shadow); peak: most matched requests in one second / any 60 seconds.",
    ]


def _offenders(report: Report, top: int) -> list[str]:
    """Per policy: the requests it could not count, and its top offenders."""
    out = []
    for p in report.policies:
        if p.unidentified:
            out.append(
                f"{p.name}: {p.unidentified:,} matching requests had no identity "
                f"(anonymous, or no valid client IP) and were not counted."
            )
        if top and p.offenders:
            out += ["", f"Top offenders of {p.name}:"]
            out.append(
                table(
                    ["client", "refused"],
                    [[display_identity(who), count(n)] for who, n in p.offenders],
                    right={1},
                )
            )
    return out


def _notes(report: Report) -> list[str]:
    """What the replay left out of the log, and why."""
    notes = []
    if report.no_request:
        notes.append(
            f"{report.no_request:,} lines carried no request a Django view would see "
            '(e.g. "-" or a TLS probe) and were not replayed.'
        )
    if report.out_of_order:
        notes.append(
            f"{report.out_of_order:,} lines were older than a line before them and "
            "were replayed at the latest time seen."
        )
    if report.bad_lines:
        first = ", ".join(str(n) for n in report.bad_examples)
        more = ", …" if report.bad_lines > len(report.bad_examples) else ""
        lines = "line" if report.bad_lines == 1 else "lines"
        notes.append(f"{report.bad_lines:,} malformed {lines} skipped ({lines} {first}{more}).")
    return notes


def _progress_bar(stream: Any) -> Any:
    """A tqdm bar over the bytes of the log (its rate and the time left), on `stream`;
    called as `bar(bytes_read, size)`."""
    # Only --progress needs it, and it takes ~40 ms to import: not on every subcommand.
    from tqdm import tqdm

    class Bar(tqdm):  # type: ignore[type-arg]  # tqdm is generic only in its stubs
        def __call__(self, done: int, total: int | None) -> None:
            if total is not None and self.total != total:
                self.total = total
            self.update(done - self.n)

    # The command's stderr wrapper ends every write with a newline; tqdm redraws one line.
    out = getattr(stream, "_out", stream)
    return Bar(desc="replay", total=None, unit="B", unit_scale=True, file=out,
               dynamic_ncols=True, leave=True, mininterval=0.2)


SUBCOMMAND = Subcommand(
    name="replay",
    help="Run the current policies over an access log: what would they refuse?",
    add_arguments=add_arguments,
    handle=handle,
)
