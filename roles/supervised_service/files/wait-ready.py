#!/usr/bin/env python3
"""Wait until a supervised daemon is ready; start it again (plain-process mode) whenever it died meanwhile.

    wait-ready.py --timeout S --log FILE [--pidfile FILE --start-argv FILE] -- READY_COMMAND

READY_COMMAND (one shell command line) succeeding means ready. Some daemons exit at once when a peer they need
is not ready yet (slurmd whose controller does not list it yet); systemd restarts those by Restart=on-failure,
and in plain-process mode this script does the same from the argv the supervised_service role recorded.
Exit 0 when ready (prints how long it took and how many starts), 1 after the timeout with the log's tail.
Written by the supervised_service role; standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

#: Between two readiness checks: a restarted slurmctld answers within a second or two, and a membership change
#: waits for it (the checks are one short command each).
POLL_S = 0.5


def alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--pidfile", type=Path)
    parser.add_argument("--start-argv", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = " ".join(args.command).removeprefix("-- ")
    started, starts, last = time.monotonic(), 0, ""
    while True:
        done = subprocess.run(command, shell=True, capture_output=True, text=True)  # noqa: S602 - the role's command
        if done.returncode == 0:
            print(f"ready after {time.monotonic() - started:.1f}s ({starts} restart(s))")
            return 0
        last = (done.stdout + done.stderr).strip()[-300:]
        if time.monotonic() - started > args.timeout:
            break
        if args.pidfile and args.start_argv and not alive(args.pidfile):
            subprocess.run(json.loads(args.start_argv.read_text()), check=False)
            starts += 1
        time.sleep(POLL_S)
    tail = args.log.read_text(errors="replace").splitlines()[-20:] if args.log.is_file() else ["(no log)"]
    print(f"not ready after {args.timeout:.0f}s and {starts} restart(s); last check said: {last}\n"
          f"log {args.log}:\n" + "\n".join(tail), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
