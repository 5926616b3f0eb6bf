"""How many tasks run a module in a node's converge, per role: first converge and second (steady state).

    sudo PYTHONPATH=src .venv/bin/python benchmarks/converge_tasks.py

Boots one harness host (the role tests' pristine node image, systemd as PID 1, apt through its VPC's package
source), converges it twice, then once more with --check --diff, with the roles every node runs before Slurm
(playbooks/baseline.yml's, then common, munge, node_exporter, node_convergence) and prints, per role, the tasks and loop items that ran a module
(benchmarks/callback/module_tasks.py) and ansible-playbook's own CPU seconds (the controller's side: the module
runs are the host's processes, reached over ssh, and this machine's cgroups do not separate them). Each executed
module task costs the node ~0.26 CPU-s whatever it reports (BENCHMARKS.md, "Where `.ci/run`'s time goes").
Removes the host afterwards.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fmcluster.providers.local.hosts import host_run  # noqa: E402
from role_helpers import converge_hosts, systemd_hosts  # noqa: E402

ORG, VPC = "b-tasks", "10.95.77.0/24"
VARIABLES = {"security_updates_package_blacklist": ["slurm"]}
PLAY = [
    {"name": "baseline", "hosts": "all", "become": True, "gather_subset": ["min"], "vars": VARIABLES, "tasks": [
        {"ansible.builtin.include_role": {"name": "common", "tasks_from": "package_manager.yml"}},
        {"ansible.builtin.include_role": {"name": "security_updates"}},
        {"ansible.builtin.include_role": {"name": "imds_guard"}},
        {"ansible.builtin.include_role": {"name": "operator_access"}}]},
    {"name": "every node", "hosts": "all", "become": True, "gather_subset": ["min"], "vars": VARIABLES,
     "roles": ["common", "munge", "node_exporter", "node_convergence"]},
]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="converge-tasks-") as scratch:
        tmp = Path(scratch)
        counts = tmp / "counts.jsonl"
        os.environ.update({"ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "benchmarks/callback"),
                           "ANSIBLE_CALLBACKS_ENABLED": "module_tasks", "FMCLUSTER_MODULE_TASKS_OUT": str(counts)})
        with systemd_hosts(ORG, VPC, 1, tmp) as (inventory, hosts):
            host = hosts[0]
            key = host_run(host, ["sh", "-c", "mkdir -p /etc/fmcluster/secrets && head -c 1024 /dev/urandom "
                                  "> /etc/fmcluster/secrets/munge-key && chmod 0400 /etc/fmcluster/secrets/munge-key"])
            assert key.returncode == 0, key.stderr
            for label, extra in (("first", ()), ("second", ()), ("check", ("--check", "--diff"))):
                before = children_cpu()
                code, changed, out = converge_hosts(inventory, PLAY, tmp, *extra)
                cpu = children_cpu() - before
                if code != 0:
                    print(out[-4000:])
                    return 1
                runs = json.loads(counts.read_text().splitlines()[-1])["hosts"][host.hostname]
                total = sum(ran for ran, _ in runs.values())
                print(f"{label} converge: changed={changed[host.hostname]} module tasks={total}, "
                      f"ansible-playbook {cpu:.1f} CPU-s")
                for role, (ran, skipped) in sorted(runs.items()):
                    print(f"  {role:20} ran {ran:3}  skipped {skipped:3}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
