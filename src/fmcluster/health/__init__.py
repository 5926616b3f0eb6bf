"""Node health: one program, checks as data (src/fmcluster/data/health_checks.yml and xid.yml).

Standard library only, Python 3.9 or newer: the node_health role installs this package onto every node and
Slurm runs it with the node's system python3 as root (HealthCheckProgram, the Prolog of GPU jobs); fmcluster
imports the same modules for triage and for `invoke doctor`. Modules:

    model      check specs, results, reports, actions (none < drain < reboot < replace)
    probe      running commands under a deadline and reading files, the only I/O the checks do
    facts      what the inventory and the instance catalog say this node must have (decides what applies)
    system     munge, mounts, disk, memory             gpu    nvidia-smi -q -x, dcgmi discovery / diag
    xid        XIDs in the kernel log, classified       efa    EFA devices and port states in sysfs
    checks     the check functions, by name             engine runs the checks that apply, fail closed
    slurm      parsing scontrol/sinfo/squeue output; drain and resume commands
    node       the node program: run, report, drain or resume
    cluster    the controller's pass for nodes that cannot drain themselves
    metrics    Slurm state as a node_exporter textfile   triage  unhealthy nodes and what they need
    cli        `fmcluster-health` (python3 -m fmcluster.health)
Modules that need PyYAML or the tenant model (data, inventory, docs) are used by fmcluster only, never on nodes.
"""

from __future__ import annotations

#: Every drain reason the health program writes starts with this; nothing else is resumed by it.
REASON_PREFIX = "fmcluster-health:"
