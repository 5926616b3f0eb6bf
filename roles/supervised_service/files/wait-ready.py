#!/usr/bin/env python3
"""Wait until a daemon systemd supervises is ready.

    wait-ready.py --timeout S --unit NAME -- READY_COMMAND

READY_COMMAND (one shell command line) succeeding means ready. Some daemons exit at once when a peer they need
is not ready yet (slurmd whose controller does not list it yet); their unit starts them again
(Restart=always), and this script waits. A daemon that exits often enough spends its unit's restart budget
(StartLimitBurst within StartLimitIntervalSec) and systemd stops starting it (result start-limit-hit): the converge
waiting here is deliberate, so this script clears the failed state and starts the unit again, within --timeout. Exit 0 when ready (prints how long it took), 1 after the
timeout with the last check's output and the unit's journal (`journalctl -u NAME -n 25 --no-pager`).
Written by the supervised_service role; standard library only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

#: Between two readiness checks: a restarted slurmctld answers within a second or two, and a membership change
#: waits for it (the checks are one short command each).
POLL_S = 0.5
JOURNAL_LINES = 25


def journal(unit: str) -> str:
    argv = ["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"(cannot read it: {err})"
    return (done.stdout or done.stderr).strip() or "(empty)"


def restart_if_budget_spent(unit: str) -> bool:
    """Start `unit` again when systemd gave up on it after its restart budget; True when it did."""
    argv = ["systemctl", "show", "--property=ActiveState", "--property=Result", unit]
    try:
        shown = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    if props.get("ActiveState") != "failed" or props.get("Result") != "start-limit-hit":
        return False
    for verb in (["reset-failed"], ["start", "--no-block"]):
        subprocess.run(["systemctl", *verb, unit], capture_output=True, timeout=30, check=False)
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--unit", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = " ".join(args.command).removeprefix("-- ")
    started, last, again = time.monotonic(), "", 0
    while True:
        done = subprocess.run(command, shell=True, capture_output=True, text=True)  # noqa: S602 - the role's command
        if done.returncode == 0:
            print(f"ready after {time.monotonic() - started:.1f}s"
                  + (f" (started again {again} time(s) after its restart budget was spent)" if again else ""))
            return 0
        last = (done.stdout + done.stderr).strip()[-300:]
        again += restart_if_budget_spent(args.unit)
        if time.monotonic() - started > args.timeout:
            break
        time.sleep(POLL_S)
    print(f"{args.unit} not ready after {args.timeout:.0f}s; last check said: {last or '(nothing)'}\n"
          f"journalctl -u {args.unit} -n {JOURNAL_LINES} --no-pager:\n{journal(args.unit)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
