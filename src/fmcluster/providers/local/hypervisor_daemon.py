"""The substrate's hypervisor daemon (see fmcluster.providers.local.hypervisor): every few seconds, the emulator's
instances of the tenant against its hosts; when they differ, LocalProvider.boot's own path under the tenant's boot
lock. Started by `ensure_hypervisor`, stopped by `stop_hypervisor` (TERM: a boot under way is finished first).

    python -m fmcluster.providers.local.hypervisor_daemon --org=ORG --endpoint=URL [--interval=S]
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from fmcluster.nodes import LIVE_STATES
from fmcluster.providers.local import LocalProvider
from fmcluster.providers.local.hosts import load_hosts, substrate_root
from fmcluster.providers.local.hypervisor import (INTERVAL_S, MODULE, Plan, boot_lock, clear_halted, halted,
                                                  reconcile_plan, record)


class Daemon:
    def __init__(self, org: str, endpoint: str, interval_s: float) -> None:
        self.org, self.endpoint, self.interval_s = org, endpoint, interval_s
        self.stopping = False
        self.busy = False
        self._ec2: Any = None

    def log(self, line: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", flush=True)

    def on_term(self, *_: object) -> None:
        self.stopping = True
        if not self.busy:
            raise SystemExit(0)

    def instances(self) -> list[dict[str, Any]]:
        if self._ec2 is None:
            from fmcluster.model import load_tenant
            from fmcluster.stacks import aws

            tenant = load_tenant(self.org)
            self._ec2 = aws.client("ec2", tenant.region, self.endpoint, tenant.capabilities.provider.apis)
        found: list[dict[str, Any]] = []
        for page in self._ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "tag:fmcluster:org", "Values": [self.org]}]):
            found += [i for r in page["Reservations"] for i in r["Instances"]]
        return found

    def plan(self) -> Plan:
        marked = halted(self.org)
        instances = self.instances()
        plan = reconcile_plan(instances, {h.key for h in load_hosts(self.org)}, marked)
        live = {str(i["InstanceId"]) for i in instances if (i.get("State") or {}).get("Name") in LIVE_STATES}
        if marked - live:  # a halted instance terminated (replaced): its mark goes with it
            clear_halted(self.org, marked - live)
        return plan

    def reconcile(self) -> None:
        if not self.plan():
            return
        from fmcluster.model import load_tenant

        self.busy = True
        try:
            provider = LocalProvider(load_tenant(self.org))  # the spec as it is now
            with boot_lock(self.org):
                plan = self.plan()  # again, under the lock: a deploy's boot may just have done it
                if not plan:
                    return
                self.log(f"reconcile: boot {', '.join(plan.boot) or 'none'}; remove {', '.join(plan.remove) or 'none'}")
                result = provider.boot_locked(self.endpoint, self.log, keep_down=halted(self.org))
                record(self.org, result.started, result.removed)
                for note in result.notes:
                    self.log(f"note: {note}")
        finally:
            self.busy = False
            if self.stopping:
                raise SystemExit(0)

    def run(self) -> int:
        from fmcluster.providers.local.emulator import running_emulator

        signal.signal(signal.SIGTERM, self.on_term)
        self.log(f"started for '{self.org}' on {self.endpoint}, every {self.interval_s:g}s")
        while not self.stopping:
            emulator = running_emulator(self.org)
            if emulator is None or emulator.endpoint != self.endpoint:
                self.log("the tenant's emulator is gone (or another one runs): nothing to stand in for; exiting")
                return 0
            if not substrate_root(self.org).is_dir():
                self.log("the tenant's substrate is gone: exiting")
                return 0
            try:
                self.reconcile()
            except SystemExit:
                raise
            except Exception as err:  # noqa: BLE001 - a hypervisor keeps running; the next round tries again
                self.log(f"reconcile failed: {type(err).__name__}: {err}")
            time.sleep(self.interval_s)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--org", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--interval", type=float, default=INTERVAL_S)
    args = parser.parse_args(argv)
    return Daemon(args.org, args.endpoint, args.interval).run()


if __name__ == "__main__":
    sys.exit(main())
