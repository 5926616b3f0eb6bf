#!/usr/bin/env python3
"""Print how long a local stacks deploy takes: cold (fresh emulator, every stack created), warm (no-op).

Runs in a temporary copy of inventories/, so the real tenants are untouched.
Usage: PYTHONPATH=src .venv/bin/python scripts/bench_stacks.py [org]   (default: demo)
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # signalling.NodesSignal: the nodes' CreationPolicy signals, no node booted


def main(org: str = "demo") -> None:
    with tempfile.TemporaryDirectory(prefix="fmc-bench-") as tmp:
        shutil.copytree(ROOT / "inventories", Path(tmp) / "inventories",
                        ignore=shutil.ignore_patterns("generated", "hosts.yml"))
        os.environ["FMCLUSTER_ROOT"] = tmp
        from fmcluster.model import load_tenant
        from fmcluster.providers.registry import provider_for
        from fmcluster.schedulers.registry import scheduler_for
        from fmcluster.stacks.api import deploy_stacks
        from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator
        from signalling import NodesSignal

        tenant = load_tenant(org)
        if not tenant.capabilities.provider.emulated_apis:
            raise SystemExit(f"{org} is a provider-{tenant.provider} tenant; this measures the local emulator only")
        try:
            start = time.monotonic()
            endpoint = ensure_emulator(org).endpoint
            nodes = NodesSignal(tenant.region, endpoint)
            image = provider_for(tenant).image_parameter
            cold = deploy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), out=lambda _: None, while_waiting=nodes,
                                 image_parameter=image)
            cold_s = time.monotonic() - start
            start = time.monotonic()
            warm = deploy_stacks(tenant, endpoint, scheduler=scheduler_for(tenant), out=lambda _: None, while_waiting=nodes,
                                 image_parameter=image)
            warm_s = time.monotonic() - start
        finally:
            stop_emulator(org)
        print(f"{org}: cold deploy (emulator start + {len(cold.changed)} stacks created, every node signalling at "
              f"once): {cold_s:.1f} s")
        print(f"{org}: warm deploy (emulator reused, {len(warm.skipped)} stacks unchanged): {warm_s:.1f} s")
        print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main(*sys.argv[1:2])
