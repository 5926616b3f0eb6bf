"""Converge fan-out benchmark: the same playbook over 8, 16 and 32 local namespace hosts, with Ansible's
defaults versus fmcluster's tuned ansible.cfg (forks, pipelining, ControlPersist, fact caching), side by side.

    sudo .venv/bin/python benchmarks/fanout.py [--sizes 8 16 32]

Prints a table of wall-clock seconds (cold: first run; warm: the run after it) and the ratio defaults/tuned.
Creates its own throwaway tenant (org `fanout`, subnet 10.91.0.0/24) and removes every node afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

SPEC = """tenant:
  schema_version: 1
  org: fanout
  provider: local
  region: ap-northeast-1
  availability_zone: ap-northeast-1a
  scheduler: slurm-ec2
  controller: {{instance_type: m5.xlarge}}
  login: {{instance_type: m5.xlarge, count: 0}}
  queues:
    - {{name: cpu, instance_type: c5.2xlarge, count: {count}}}
  network: {{local_subnet: 10.91.0.0/24}}
  storage:
    lustre: {{storage_capacity_gib: 1200}}
"""


def run_playbook(inventory: Path, config: Path, env: dict[str, str]) -> float:
    argv = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", f"{inventory}/", str(ROOT / "benchmarks" / "fanout.yml")]
    started = time.monotonic()
    result = subprocess.run(argv, env={**env, "ANSIBLE_CONFIG": str(config)}, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode:
        raise SystemExit(f"playbook failed with {config.name}:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    return elapsed


def measure(count: int, workdir: Path) -> dict[str, float]:
    from fmcluster.converge import ansible_env
    from fmcluster.inventory import write_inventory
    from fmcluster.localnodes import nodes_down, nodes_up
    from fmcluster.model import load_tenant

    spec = workdir / "inventories" / "fanout" / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(SPEC.format(count=count))
    tenant = load_tenant("fanout", workdir)
    figures: dict[str, float] = {}
    try:
        nodes = nodes_up(tenant, out=lambda _: None)
        write_inventory(tenant, nodes)
        inventory = workdir / "inventories" / "fanout" / "generated"
        env = ansible_env(tenant)
        for label, config in (("defaults", ROOT / "benchmarks" / "ansible-defaults.cfg"), ("tuned", ROOT / "ansible.cfg")):
            shutil.rmtree(ROOT / ".cache" / "ansible-facts", ignore_errors=True)
            subprocess.run(["pkill", "-f", f"ControlPath={env['ANSIBLE_SSH_CONTROL_PATH_DIR']}"], check=False)
            figures[f"{label}_cold"] = run_playbook(inventory, config, env)
            figures[f"{label}_warm"] = run_playbook(inventory, config, env)
    finally:
        nodes_down(tenant, out=lambda _: None)
        shutil.rmtree("/tmp/fmcluster-fanout/fanout", ignore_errors=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32])
    args = parser.parse_args()
    print(f"fan-out benchmark on {os.cpu_count()} cores; playbook benchmarks/fanout.yml (facts + 5 tasks per host)")
    print(f"{'hosts':>5} | {'defaults cold':>13} | {'tuned cold':>10} | {'ratio':>5} | {'defaults warm':>13} | {'tuned warm':>10} | {'ratio':>5}")
    with tempfile.TemporaryDirectory(prefix="fmcluster-fanout-") as tmp:
        os.environ["FMCLUSTER_ROOT"] = tmp
        for count in args.sizes:
            f = measure(count, Path(tmp))
            hosts = count + 1  # the compute nodes and the controller
            print(f"{hosts:>5} | {f['defaults_cold']:>12.1f}s | {f['tuned_cold']:>9.1f}s | "
                  f"{f['defaults_cold'] / f['tuned_cold']:>5.2f} | {f['defaults_warm']:>12.1f}s | "
                  f"{f['tuned_warm']:>9.1f}s | {f['defaults_warm'] / f['tuned_warm']:>5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
