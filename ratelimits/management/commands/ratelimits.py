"""`manage.py ratelimits status | reset | replay | export | import`: look at, reset, try
out and move policies.

manage.py ratelimits status [--json]
manage.py ratelimits reset <policy> --key <identity>
manage.py ratelimits replay <access-log> [--format auto|combined|json] [--top N]
                            [--policy NAME ...] [--skip-bad] [--progress] [--jobs N]
                            [--json]
manage.py ratelimits export [--output FILE]
manage.py ratelimits import FILE [--dry-run] [--delete-missing]
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import sys
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

NO_TRAFFIC = "—"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[int]) -> str:
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


def _share(share: float | None) -> str:
    return NO_TRAFFIC if share is None else f"{100 * share:.1f}%"


def _n(value: int) -> str:
    return f"{value:,}"


def _policy_named(name: str) -> Any:
    """The Policy row called `name`; CommandError naming it and the similar names."""
    from ratelimits.models import Policy

    policy = Policy.objects.filter(name=name).first()
    if policy is not None:
        return policy
    names = list(Policy.objects.order_by("name").values_list("name", flat=True))
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    if close:
        hint = f"did you mean {', '.join(close)}?"
    elif names:
        shown = ", ".join(names[:10]) + (", …" if len(names) > 10 else "")
        hint = f"the policies are: {shown}"
    else:
        hint = "there are no policies yet"
    raise CommandError(f"no policy named {name!r}; {hint}")


def _compile(policy: Any) -> Any:
    from ratelimits.pipeline.resolver import compile_policy

    try:
        return compile_policy(policy)
    except (ValueError, TypeError) as exc:
        raise CommandError(f"policy {policy.name!r} is invalid: {exc}") from exc


class Command(BaseCommand):
    help = ("Rate-limit policies: their last hour (status), reset a client, replay a log, "
            "export and import them as JSON.")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")

        status = sub.add_parser("status", help="Every policy with its last hour of traffic.")
        status.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

        reset = sub.add_parser("reset", help="Forget one client's state under one policy.")
        reset.add_argument("policy", help="The policy name.")
        reset.add_argument(
            "--key",
            help="The client identity as logs and `status` show it (ip:203.0.113.9, user:7, "
            "header:k-123); the bare value works too (203.0.113.9, 7).",
        )

        replay = sub.add_parser(
            "replay",
            help="Run the current policies over an access log: what would they refuse?",
        )
        replay.add_argument(
            "log",
            help="Access log: combined/common log format or JSON "
            "lines, plain or gzip; '-' reads standard input.",
        )
        replay.add_argument(
            "--format",
            choices=("auto", "combined", "json"),
            default="auto",
            help="Log format (default: detected from the first line).",
        )
        replay.add_argument(
            "--top",
            type=int,
            default=5,
            metavar="N",
            help="Top offenders shown per policy (default 5).",
        )
        replay.add_argument(
            "--policy",
            nargs="+",
            action="extend",
            default=[],
            metavar="NAME",
            help="Replay only these policies (an 'off' one is replayed as shadow).",
        )
        replay.add_argument(
            "--skip-bad",
            action="store_true",
            help="Skip malformed lines (counted) instead of stopping.",
        )
        replay.add_argument(
            "--progress",
            action="store_true",
            help="Show progress on stderr even when it is not a terminal.",
        )
        replay.add_argument(
            "--jobs",
            type=int,
            metavar="N",
            help="Processes to split a large log file by client across (default: one per "
            "idle CPU, at most 4; one for a small file, standard input, or policies with "
            "a global, query or mixed key).",
        )
        replay.add_argument("--json", action="store_true", help="Print JSON instead of text.")

        export = sub.add_parser("export", help="Write every policy as JSON (for `import`).")
        export.add_argument("--output", "-o", metavar="FILE",
                            help="Write to FILE instead of standard output.")

        load = sub.add_parser(
            "import",
            help="Create and update policies from a file `export` wrote: every policy "
            "validated first, then all applied in one transaction, or none.",
        )
        load.add_argument("file", help="The JSON file; '-' reads standard input.")
        load.add_argument("--dry-run", action="store_true",
                          help="Print what would change; write nothing.")
        load.add_argument("--delete-missing", action="store_true",
                          help="Also delete the policies the file does not name.")

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, f"_{options['subcommand']}")(**options)

    # -- export, import -------------------------------------------------------------------

    def _export(self, *, output: str | None = None, **_: Any) -> None:
        from ratelimits.ops import policy_files

        content = policy_files.export_policies()
        text = policy_files.dumps(content)
        if output is None:
            self.stdout.write(text, ending="")
            return
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
        self.stderr.write(f"Wrote {len(content['policies'])} policies to {output}.")

    def _import(self, *, file: str, dry_run: bool = False, delete_missing: bool = False,
                **_: Any) -> None:
        from ratelimits.ops import policy_files

        try:
            if file == "-":
                text = sys.stdin.read()
            else:
                with open(file, encoding="utf-8") as f:
                    text = f.read()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}") from exc
        try:
            changes = policy_files.plan_import(policy_files.read(text),
                                               delete_missing=delete_missing)
        except policy_files.PolicyFileError as exc:
            raise CommandError(f"{file} is refused, nothing was changed:\n{exc}") from exc
        for change in changes:
            self.stdout.write(change.describe())
        done = {"create": "created", "update": "updated", "delete": "deleted",
                "unchanged": "unchanged"}
        summary = ", ".join(f"{n} {done[a]}" for a in done
                            if (n := sum(c.action == a for c in changes))) or "no policies"
        if dry_run:
            self.stdout.write(f"Dry run, nothing written; it would leave {summary}.")
            return
        policy_files.apply(changes)
        self.stdout.write(f"Imported: {summary}.")

    # -- status ---------------------------------------------------------------------------

    def _status(self, *, json: bool = False, **_: Any) -> None:
        from ratelimits.models import Policy
        from ratelimits.ops import observe

        policies = list(Policy.objects.order_by("-priority", "name"))  # the admin's order
        error = None
        try:
            counts = observe.last_hour([p.name for p in policies])
        except Exception as exc:  # the store is down: still show the policies
            error, counts = f"{type(exc).__name__}: {exc}", {}
        rows = []
        for p in policies:
            c = counts.get(p.name)
            rows.append(
                {
                    "name": p.name,
                    "mode": p.mode,
                    "algorithm": p.algorithm,
                    "rate": p.human_rate(),
                    "limit": p.limit,
                    "floor": p.floor,
                    "period": p.period,
                    "burst": p.burst,
                    "cost": p.cost,
                    "max_wait": p.max_wait,
                    "warmup": p.warmup,
                    "key": p.key,
                    "path": p.path or "*",
                    "methods": p.method_list,
                    "scope": p.scope,
                    "last_hour": None
                    if c is None
                    else {
                        "admitted": c.admitted,
                        "rejected": c.rejected,
                        "would_reject": c.would_reject,
                        "spared": c.spared,
                        "refused_share": c.refused_share,
                        # an adaptive policy's samples: the mean limit and latency
                        "mean_limit": c.mean_limit,
                        "latency_ms": c.latency_ms,
                    },
                }
            )
        if error:
            self.stderr.write(f"Could not read the counters ({error}); figures shown as ?.")
        if json:
            self.stdout.write(_dumps({"policies": rows, "error": error}))
            return
        if not rows:
            self.stdout.write("No policies. Add some in the admin (Rate limits → Policies).")
            return

        def figures(row: dict[str, Any]) -> list[str]:
            h = row["last_hour"]
            if h is None:
                return ["?"] * 4
            return [
                _n(h["admitted"]),
                _n(h["rejected"]),
                _n(h["would_reject"]),
                _share(h["refused_share"]),
            ]

        self.stdout.write(
            _table(
                [
                    "policy",
                    "mode",
                    "algorithm",
                    "rate",
                    "key",
                    "path",
                    "admitted",
                    "rejected",
                    "would reject",
                    "refused",
                ],
                [
                    [
                        r["name"],
                        r["mode"],
                        r["algorithm"],
                        r["rate"],
                        r["key"],
                        r["path"],
                        *figures(r),
                    ]
                    for r in rows
                ],
                right={6, 7, 8, 9},
            )
        )
        from ratelimits.pipeline import store

        if store.is_shared():
            self.stdout.write("Figures: the last 60 minutes, all processes (the store's counters).")
        else:
            self.stdout.write(
                "Figures: none to read. Without a Redis cache each server process counts in its "
                "own memory, which a command cannot see; the admin's pages (served by those "
                "processes) show them, or set up Redis (RATELIMITS['CACHE'])."
            )

    # -- reset ----------------------------------------------------------------------------

    def _reset(self, *, policy: str, key: str | None = None, **_: Any) -> None:
        from ratelimits.ops.reset import reset_client
        from ratelimits.pipeline import store

        row = _policy_named(policy)
        _compile(row)
        if not store.is_shared():
            raise CommandError(
                "the limits are counted inside each server process (RATELIMITS['CACHE'] is "
                "not a Redis cache), which a management command cannot reach; restart the "
                "server processes to forget them"
            )
        if key is None or not key.strip():
            raise CommandError(
                f"reset needs --key <identity>: ratelimits never scans Redis for all the "
                f"clients of a policy. {self._recent(row.name)}"
            )
        try:
            identity = reset_client(row, key)
        except ValueError as exc:
            raise CommandError(f"--key {key!r}: {exc}") from exc
        self.stdout.write(
            f"Reset {identity} under policy {row.name} ({row.human_rate()}, "
            f"{row.algorithm}): its next request starts afresh."
        )

    def _recent(self, name: str) -> str:
        from ratelimits.ops import observe
        from ratelimits.pipeline.identity import display_identity

        try:
            recent = observe.offenders(name, 5)
        except Exception:
            return ""
        if not recent:
            return "It refused no client in the last two hours."
        shown = ", ".join(f"{display_identity(who)} ({n:,})" for who, n in recent)
        return (
            f"Clients it refused most in the last two hours: {shown}. "
            f"{observe.OFFENDERS_NOTE}"
        )

    # -- replay ---------------------------------------------------------------------------

    def _replay(
        self,
        *,
        log: str,
        format: str,
        top: int,
        policy: list[str],
        skip_bad: bool,
        progress: bool,
        jobs: int | None,
        json: bool,
        **_: Any,
    ) -> None:
        from ratelimits.conf import get_config
        from ratelimits.ops.replay import LogError, replay_file

        if top < 0:
            raise CommandError("--top must be 0 or more")
        if jobs is not None and jobs < 1:
            raise CommandError("--jobs must be 1 or more")
        compiled, invalid = self._replay_policies(policy)
        bar = _progress_bar(self.stderr) if progress or sys.stderr.isatty() else None
        try:
            report = replay_file(
                log,
                compiled,
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
        if invalid:
            report = dataclasses.replace(
                report, skipped_policies=report.skipped_policies + tuple(invalid)
            )
        if json:
            self.stdout.write(_dumps(dataclasses.asdict(report)))
        else:
            self.stdout.write(_replay_text(report, top))

    def _replay_policies(self, names: list[str]) -> tuple[list[Any], list[tuple[str, str]]]:
        """The policies to replay, in the resolver's order, and those that are invalid."""
        from ratelimits.models import Mode, Policy
        from ratelimits.pipeline.resolver import compile_policy

        if names:
            rows = [_policy_named(n) for n in dict.fromkeys(names)]
        else:
            rows = list(Policy.objects.exclude(mode=Mode.OFF))
        compiled, invalid = [], []
        for row in rows:
            try:
                c = compile_policy(row)
            except (ValueError, TypeError) as exc:
                invalid.append((row.name, f"invalid: {exc}"))
                continue
            if c.mode == "off":  # named explicitly: observe it, never let it block
                c = dataclasses.replace(c, template=dataclasses.replace(c.template, shadow=True))
            compiled.append(c)
        compiled.sort(key=lambda p: (-p.priority, -p.pattern.specificity, p.name))
        return compiled, invalid


def _dumps(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "?"
    moment = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _replay_text(report: Any, top: int) -> str:
    from ratelimits.pipeline.identity import display_identity

    out = [
        f"Replayed {report.source} ({report.format}): {report.lines:,} lines, "
        f"{report.requests:,} requests from {_when(report.first)} to {_when(report.last)}, "
        f"in {report.seconds:.1f} s.",
    ]
    for name, why in report.skipped_policies:
        out.append(f"Not replayed: {name}: {why}.")
    if report.policies:
        rows = []
        for p in report.policies:
            rows.append(
                [
                    p.name,
                    p.mode,
                    _n(p.matched),
                    _n(p.refused),
                    _share(p.refused_share),
                    _n(p.peak_second),
                    _n(p.peak_minute),
                ]
            )
        out += [
            "",
            _table(
                ["policy", "mode", "matched", "would reject", "share", "peak/s", "peak/min"],
                rows,
                right={2, 3, 4, 5, 6},
            ),
        ]
        out.append(
            "would reject: requests this policy refused (enforce) or would have "
            "(shadow); peak: most matched requests in one second / any 60 seconds."
        )
    else:
        out.append("No policy could be replayed.")
    for p in report.policies:
        if p.unidentified:
            out.append(
                f"{p.name}: {p.unidentified:,} matching requests had no identity "
                f"(anonymous, or no valid client IP) and were not counted."
            )
        if top and p.offenders:
            out += ["", f"Top offenders of {p.name}:"]
            out.append(
                _table(
                    ["client", "refused"],
                    [[display_identity(who), _n(n)] for who, n in p.offenders],
                    right={1},
                )
            )
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
    if notes:
        out += ["", *notes]
    return "\n".join(out)


def _progress_bar(stream: Any) -> Any:
    """A tqdm bar over the bytes of the log (its rate and the time left), on `stream`;
    called as `bar(bytes_read, size)`."""
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
