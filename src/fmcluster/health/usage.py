"""GPU-, CPU- and node-hours per team and user, from Slurm's accounting (`invoke usage`, docs/users.md).

One sacct call on the cluster (the controller or login node, through the provider's ssh as `invoke slurm` runs
commands) lists every job allocation since a date; each line is one allocation:

    JobID|User|Account|ElapsedRaw|AllocTRES|State
    1042|alice|llm|3600|billing=16,cpu=16,gres/gpu=8,mem=64G,node=2|COMPLETED

The hours of a TRES are ElapsedRaw seconds × its allocated count / 3600, summed per (account, user); a team is
its Slurm account (fmcluster.users). A job counts whole (its time before --since too) when sacct lists it for the
window. Parsing fails closed: a line that is not exactly the six fields, an ElapsedRaw that is not a whole
number of seconds, or a counted TRES that is not a finite non-negative number is an error naming the line, never
a figure quietly left out.

Standard library only (it could run on a node as `python3 -m`); rendered as a table, JSON, or Prometheus text
(`fmcluster_usage_tres_seconds{org,team,user,tres}`, fmcluster.health.textfile's exposition).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from fmcluster.health.textfile import Exposition

FIELDS = ("JobID", "User", "Account", "ElapsedRaw", "AllocTRES", "State")
#: The TRES counted, in the order every rendering shows them (AllocTRES names, Slurm's tres.html).
TRES = ("gres/gpu", "cpu", "node")
#: In seconds, Prometheus' base unit (promtool's lint asks for it); a dashboard divides by 3600 for GPU-hours.
METRIC = "fmcluster_usage_tres_seconds"
METRIC_HELP = ("TRES-seconds (allocated count x elapsed time) of the Slurm jobs of an organization's team and user "
               "since the first of the month, from sacct")
#: One AllocTRES item: a TRES name (type[/name[:subname]]) and its value (a count; memory carries a unit).
TRES_ITEM = re.compile(r"([a-z_]+(?:/[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)?)?)=([^,=]+)")
SINCE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class UsageError(ValueError):
    """sacct's output or a --since that cannot be read; the message names the line or the value."""


def sacct_argv(since: str) -> list[str]:
    """The sacct command the report reads (every user's job allocations, no steps, no header, '|'-separated)."""
    return ["sacct", "--allusers", "--allocations", "--noheader", "--parsable2", f"--starttime={since}",
            "--endtime=now", f"--format={','.join(FIELDS)}"]


def sacct_command(since: str) -> str:
    """sacct_argv as one line for a remote shell, every word quoted."""
    return shlex.join(sacct_argv(since))


def check_since(since: str) -> str:
    """`since` when it is a real calendar date written YYYY-MM-DD, else UsageError (it reaches a command line)."""
    if not SINCE.fullmatch(since):
        raise UsageError(f"--since={since!r} is not a date written YYYY-MM-DD, e.g. 2026-12-01")
    try:
        dt.date.fromisoformat(since)
    except ValueError:
        raise UsageError(f"--since={since!r} is not a calendar date") from None
    return since


def default_since(today: dt.date) -> str:
    """The first day of the current month: a month's usage, as a budget is counted."""
    return today.replace(day=1).isoformat()


@dataclass
class Usage:
    """Hours per TRES and jobs of one (team, user)."""

    team: str
    user: str
    jobs: int = 0
    hours: dict[str, float] = field(default_factory=lambda: {t: 0.0 for t in TRES})


@dataclass(frozen=True)
class Job:
    job_id: str
    user: str
    account: str
    elapsed_s: int
    counts: dict[str, float]
    state: str


def parse_tres(text: str, where: str) -> dict[str, float]:
    """The counted TRES of one AllocTRES value (`billing=4,cpu=4,gres/gpu=8,mem=8G,node=2`); absent ones are 0.
    An empty value is a job that never ran (nothing allocated)."""
    counts = {t: 0.0 for t in TRES}
    if text == "":
        return counts
    for item in text.split(","):
        found = TRES_ITEM.fullmatch(item)
        if not found:
            raise UsageError(f"{where}: AllocTRES item {item!r} is not NAME=VALUE")
        name, value = found.groups()
        if name in counts:
            try:
                number = float(value)
            except ValueError:
                raise UsageError(f"{where}: {name}={value!r} is not a number") from None
            if not math.isfinite(number) or number < 0:
                raise UsageError(f"{where}: {name}={value!r} is not a finite non-negative count")
            counts[name] = number
    return counts


def parse_sacct(text: str) -> list[Job]:
    """Every line of sacct's output (sacct_argv) as a Job; UsageError naming the first line that is not one."""
    jobs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"sacct line {number}"
        parts = line.split("|")
        if len(parts) != len(FIELDS):
            raise UsageError(f"{where} has {len(parts)} fields, not {len(FIELDS)} ({'|'.join(FIELDS)}): {line[:200]!r}")
        job_id, user, account, elapsed, tres, state = parts
        if not elapsed.isascii() or not elapsed.isdigit():
            raise UsageError(f"{where}: ElapsedRaw {elapsed!r} is not a whole number of seconds")
        jobs.append(Job(job_id, user, account, int(elapsed), parse_tres(tres, where), state))
    return jobs


def summarize(jobs: Iterable[Job]) -> list[Usage]:
    """Hours per TRES and job count per (team = Slurm account, user), sorted by team then user."""
    table: dict[tuple[str, str], Usage] = {}
    for job in jobs:
        usage = table.setdefault((job.account, job.user), Usage(job.account, job.user))
        usage.jobs += 1
        for tres in TRES:
            usage.hours[tres] += job.elapsed_s * job.counts[tres] / 3600
    return [table[key] for key in sorted(table)]


def totals(rows: Sequence[Usage]) -> dict[str, float]:
    return {tres: sum(r.hours[tres] for r in rows) for tres in TRES}


def _cell(text: str) -> str:
    """A name as a table cell: printable, one line (a Slurm name is data, never a terminal control)."""
    shown = "".join(c if c.isprintable() else "?" for c in text)
    return shown or "-"


def render_table(rows: Sequence[Usage], org: str, since: str) -> str:
    header = ("team", "user", "GPU-h", "CPU-h", "jobs")
    cells = [header] + [(_cell(r.team), _cell(r.user), f"{r.hours['gres/gpu']:.1f}", f"{r.hours['cpu']:.1f}",
                         str(r.jobs)) for r in rows]
    total = totals(rows)
    cells.append(("total", "", f"{total['gres/gpu']:.1f}", f"{total['cpu']:.1f}", str(sum(r.jobs for r in rows))))
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    right = (False, False, True, True, True)

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)).rstrip()

    out = [f"usage of {_cell(org)} since {since} (Slurm accounting; hours = allocated count × elapsed time)",
           line(header), "  ".join("-" * w for w in widths)]
    out += [line(c) for c in cells[1:-1]]
    out += ["  ".join("-" * w for w in widths), line(cells[-1])]
    return "\n".join(out) + "\n"


def render_json(rows: Sequence[Usage], org: str, since: str) -> str:
    teams: dict[str, dict[str, float]] = {}
    for r in rows:
        team = teams.setdefault(r.team, {t: 0.0 for t in TRES})
        for tres in TRES:
            team[tres] += r.hours[tres]
    document = {
        "org": org, "since": since, "tres": list(TRES), "unit": "hours",
        "rows": [{"team": r.team, "user": r.user, "jobs": r.jobs, "hours": {t: round(r.hours[t], 6) for t in TRES}}
                 for r in rows],
        "teams": {name: {t: round(v, 6) for t, v in hours.items()} for name, hours in sorted(teams.items())},
        "total": {t: round(v, 6) for t, v in totals(rows).items()},
    }
    return json.dumps(document, indent=1, allow_nan=False) + "\n"


def render_prometheus(rows: Sequence[Usage], org: str) -> str:
    """`fmcluster_usage_tres_seconds{org,team,user,tres}`, one sample per row and TRES."""
    exposition = Exposition()
    exposition.declare(METRIC, METRIC_HELP)
    for r in rows:
        for tres in TRES:
            exposition.add(METRIC, METRIC_HELP, round(r.hours[tres] * 3600, 3),
                           {"org": org, "team": r.team, "user": r.user, "tres": tres})
    return exposition.render() if rows else f"# HELP {METRIC} {METRIC_HELP}\n# TYPE {METRIC} gauge\n"


def collect(org: str, textfile: str, slurm_conf: str = "", now: Callable[[], float] | None = None) -> bool:
    """One round of the controller's usage collector: this month's usage as the node_exporter textfile, with
    `fmcluster_usage_up` 1; when sacct fails or answers garbage, only `fmcluster_usage_up 0` (never last round's
    figures passed off as current). Returns whether sacct answered."""
    import os
    import subprocess
    import time

    from fmcluster.health.textfile import write_atomic

    env = {**os.environ, **({"SLURM_CONF": slurm_conf} if slurm_conf else {})}

    def run(command: str) -> tuple[int, str, str]:
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=120, check=False, env=env)
        return done.returncode, done.stdout, done.stderr

    up_help = "1 when sacct answered this collection round (the usage series are current), else 0 and none."
    try:
        rows = read(run, default_since(dt.date.today()))
        text = render_prometheus(rows, org)
        ok = True
    except (UsageError, OSError, subprocess.TimeoutExpired):
        text, ok = "", False
    stamp = (now or time.time)()
    text += (f"# HELP fmcluster_usage_up {up_help}\n# TYPE fmcluster_usage_up gauge\nfmcluster_usage_up {int(ok)}\n"
             "# HELP fmcluster_usage_last_update_timestamp_seconds When the usage collector last ran.\n"
             "# TYPE fmcluster_usage_last_update_timestamp_seconds gauge\n"
             f"fmcluster_usage_last_update_timestamp_seconds {round(stamp, 3)}\n")
    write_atomic(textfile, text)
    return ok


def collect_forever(org: str, textfile: str, every: float, slurm_conf: str = "", rounds: int | None = None) -> int:
    """collect() every `every` seconds (`rounds` times, for tests; None: until stopped)."""
    import time

    done = 0
    while rounds is None or done < rounds:
        collect(org, textfile, slurm_conf)
        done += 1
        if rounds is None or done < rounds:
            time.sleep(every)
    return 0


#: Runs one command line where sacct answers (the cluster's login or controller node): (exit status, stdout, stderr).
Run = Callable[[str], tuple[int, str, str]]


def read(run: Run, since: str) -> list[Usage]:
    """The usage since `since` (YYYY-MM-DD), read through `run`; UsageError when sacct fails or answers garbage."""
    code, stdout, stderr = run(sacct_command(check_since(since)))
    if code != 0:
        said = (stderr or stdout).strip().splitlines()
        raise UsageError(f"`sacct` failed ({code}): {said[-1][:300] if said else 'no output'}")
    return summarize(parse_sacct(stdout))


def main(argv: Sequence[str] | None = None) -> int:
    """`python3 -m fmcluster.health.usage --org=X`: the report where sacct runs (the controller), e.g. as a node_exporter
    textfile (--format=prometheus --output=/var/lib/node_exporter/textfile/usage.prom, written atomically)."""
    import argparse
    import subprocess
    import sys

    from fmcluster.health.textfile import write_atomic

    parser = argparse.ArgumentParser(prog="python3 -m fmcluster.health.usage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--org", required=True, help="the organization, as the metric's org label")
    parser.add_argument("--since", default="", help="YYYY-MM-DD (default: the first of this month)")
    parser.add_argument("--format", choices=("table", "json", "prometheus"), default="table")
    parser.add_argument("--output", default="", help="write here (atomically) instead of printing")
    args = parser.parse_args(argv)

    def run(command: str) -> tuple[int, str, str]:
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=120, check=False)
        return done.returncode, done.stdout, done.stderr

    try:
        since = check_since(args.since) if args.since else default_since(dt.date.today())
        rows = read(run, since)
    except (UsageError, OSError, subprocess.TimeoutExpired) as err:
        print(f"usage: {err}", file=sys.stderr)
        return 1
    text = (render_prometheus(rows, args.org) if args.format == "prometheus" else
            render_json(rows, args.org, since) if args.format == "json" else render_table(rows, args.org, since))
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
