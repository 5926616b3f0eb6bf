"""Local stand-in for what SageMaker HyperPod does on one of its instances (fmcluster.providers.local.emulator_hyperpod writes
it into the instance's user data with its settings; docs/local-nodes.md, "HyperPod stand-in").

HyperPod boots its AMI, which ships Slurm and munge under /opt/slurm with their systemd units; its agent writes the
resource config (/opt/ml/config/resource_config.json), the cluster's munge key and, on the controller group,
/opt/slurm/etc/slurm.conf (nodes and partitions from the instance groups' SlurmConfig). What comes next depends on
the group's LifeCycleConfig (CloudFormation's AWS::SageMaker::Cluster schema, ClusterLifeCycleConfig): with
OnInitComplete ("Extended mode") HyperPod configures its default software, Slurm started on every node (slurmctld on
the controller group, a configless slurmd elsewhere), and then runs the script, "after the AMI-based initialization
is complete" (SageMaker API reference, ClusterLifeCycleConfig); with OnCreate ("Customer Managed mode") it runs the
script and the script starts Slurm itself (AWS's base-config start_slurm.sh). Either way it downloads the group's
SourceS3Uri and runs the script from there as root, logging to /var/log/provision. The local image is a pristine
Debian 12: this program does each of those steps, the AMI's part with Debian's Slurm packages laid out as HyperPod's
AMI lays its own (binaries reached through /opt/slurm/bin and /opt/slurm/sbin, configuration in /opt/slurm/etc),
and then runs the script exactly so. The lifecycle script and everything after it are the tenant's own, unchanged.

Standard library only (it runs before anything is installed). Usage: hyperpod_agent.py SETTINGS_JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RESOURCE_CONFIG = Path("/opt/ml/config/resource_config.json")
SLURM_PREFIX = Path("/opt/slurm")
#: The lifecycle hooks, in the order of ClusterLifeCycleConfig (mutually exclusive): which one a group names decides
#: whether HyperPod starts Slurm before the script (OnInitComplete) or leaves it to the script (OnCreate).
HOOKS = ("OnInitComplete", "OnCreate")
#: Where HyperPod stages a group's lifecycle bundle and runs its script from: /tmp/<bucket>/<prefix>/ (awsome-distributed-ai,
#: https://github.com/awslabs/awsome-distributed-ai/blob/main/1.architectures/5.sagemaker-hyperpod/tools/devops-agent/docs/hyperpod-mental-model.md,
#: "LCS bundle staging"): under /tmp, so gone after a reboot; a lifecycle script finds its files beside itself.
STAGING_ROOT = Path("/tmp")
PROVISION_LOG = Path("/var/log/provision/provisioning.log")
S3_CLIENT = "/usr/local/sbin/fmcluster-s3"
#: Debian 12's packages of the Slurm (22.05) and munge the stand-in's "AMI" carries.
PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
#: The Slurm programs HyperPod's AMI has under /opt/slurm/bin and /opt/slurm/sbin (Debian's, linked there).
CLIENTS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "sdiag", "sinfo",
           "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger")
DAEMONS = ("slurmctld", "slurmd")
#: Share of the machine's memory each node offers Slurm (every local host sees the whole machine).
MEMORY_SHARE = 0.9

UNITS = {
    # The AMI's units: slurmd reads $SLURMD_OPTIONS, which the lifecycle sets to --conf-server (configless).
    "slurmctld": ("Slurm controller daemon (HyperPod AMI layout, local stand-in)",
                  f"{SLURM_PREFIX}/sbin/slurmctld -D -s $SLURMCTLD_OPTIONS", "slurmctld"),
    "slurmd": ("Slurm node daemon (HyperPod AMI layout, local stand-in)",
               f"{SLURM_PREFIX}/sbin/slurmd -D -s $SLURMD_OPTIONS", "slurmd"),
}


def log(message: str) -> None:
    print(f"fmcluster hyperpod stand-in: {message}", flush=True)


def run(argv: list[str], **kwargs: Any) -> None:
    subprocess.run(argv, check=True, **kwargs)


def node_type(settings: dict[str, Any], group: str) -> str:
    """The group's SlurmConfig NodeType (Controller, Login, Compute), as HyperPod reads it."""
    found: dict[str, Any] = next((g for g in settings["slurm_groups"] if g["name"] == group), {})
    return str(found.get("NodeType") or "Compute")


def write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def machine() -> tuple[int, int]:
    """CPUs and the MiB each node offers Slurm (every node of the stand-in shares this machine)."""
    kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal:"))
    return os.cpu_count() or 1, int(kib // 1024 * MEMORY_SHARE)


def slurm_node_name(address: str) -> str:
    """The Slurm node name HyperPod gives an instance: ip-N-N-N-N from its CustomerIpAddress (awsome-distributed-ai,
    5.sagemaker-hyperpod/tools/devops-agent/docs/hyperpod-mental-model.md: slurm.conf's NodeName); the resource
    config names no hostname."""
    return "ip-" + address.replace(".", "-")


def slurm_conf(settings: dict[str, Any]) -> str:
    """What HyperPod's agent writes on the controller group: the controller, and each compute group's nodes in the
    partitions its SlurmConfig names (configless: the other nodes' slurmd fetch it)."""
    config = settings["resource_config"]
    types = {g["name"]: str(g.get("NodeType") or "Compute") for g in settings["slurm_groups"]}
    partitions_of = {g["name"]: list(g.get("PartitionNames") or [g["name"]]) for g in settings["slurm_groups"]}
    groups = {g["Name"]: g["Instances"] for g in config["InstanceGroups"]}
    controller = next(i for name, instances in groups.items() if types.get(name) == "Controller" for i in instances)
    cpus, memory = machine()
    lines = [
        "# written by the HyperPod agent's local stand-in (fmcluster/providers/local/hyperpod_agent.py)",
        f"ClusterName={config['ClusterConfig']['ClusterName'].lower()}",
        f"SlurmctldHost={slurm_node_name(controller['CustomerIpAddress'])}({controller['CustomerIpAddress']})",
        "SlurmctldParameters=enable_configless", "AuthType=auth/munge", "CredType=cred/munge", "SlurmUser=slurm",
        "StateSaveLocation=/var/spool/slurmctld", "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log", "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "SlurmctldPidFile=/run/slurmctld.pid", "SlurmdPidFile=/run/slurmd.pid",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        # The local hosts delegate no cgroup subtree to slurmd: processes are tracked by parent pid.
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "ReturnToService=2", "MpiDefault=none", "MailProg=/bin/true",
    ]
    partitions: dict[str, list[str]] = {}
    for name, instances in groups.items():
        if types.get(name) != "Compute":
            continue
        for instance in instances:
            node = slurm_node_name(instance["CustomerIpAddress"])
            lines.append(f"NodeName={node} NodeAddr={instance['CustomerIpAddress']} "
                         f"CPUs={cpus} RealMemory={memory} State=UNKNOWN")
            for partition in partitions_of[name]:
                partitions.setdefault(partition, []).append(node)
    for index, (partition, nodes) in enumerate(partitions.items()):
        lines.append(f"PartitionName={partition} Nodes={','.join(nodes)} Default={'YES' if index == 0 else 'NO'} "
                     "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def install_ami_slurm(settings: dict[str, Any], kind: str) -> None:
    """The Slurm and munge HyperPod's AMI ships, under its layout: packages installed with their daemons kept stopped
    (HyperPod, or an OnCreate script, starts them), the cluster's munge key, /opt/slurm/{bin,sbin,etc} and the AMI's units."""
    policy = Path("/usr/sbin/policy-rc.d")
    write(policy, "#!/bin/sh\nexit 101\n", 0o755)  # no daemon starts while the packages install
    try:
        environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for attempt in range(1, 6):
            try:
                run(["apt-get", "update", "-q"], env=environment)
                run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], env=environment)
                break
            except subprocess.CalledProcessError:
                if attempt == 5:
                    raise
                log(f"apt failed (attempt {attempt}); retrying")
    finally:
        policy.unlink(missing_ok=True)
    for unit in DAEMONS:  # the packages' own units: the AMI's below take their place
        subprocess.run(["systemctl", "disable", "--now", unit], check=False, capture_output=True)
    key = Path("/etc/munge/munge.key")
    key.write_bytes(__import__("base64").b64decode(settings["munge_key"]))
    run(["chown", "munge:munge", str(key)])
    key.chmod(0o400)
    run(["systemctl", "enable", "munge"])
    run(["systemctl", "restart", "munge"])
    for folder, names, source in (("bin", CLIENTS, "/usr/bin"), ("sbin", DAEMONS, "/usr/sbin")):
        (SLURM_PREFIX / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            link = SLURM_PREFIX / folder / name
            if Path(source, name).exists() and not link.is_symlink():
                link.symlink_to(Path(source, name))
    (SLURM_PREFIX / "etc").mkdir(parents=True, exist_ok=True)
    for folder, owner in (("/var/spool/slurmctld", "slurm"), ("/var/spool/slurmd", "root"), ("/var/log/slurm", "slurm")):
        Path(folder).mkdir(parents=True, exist_ok=True)
        run(["chown", f"{owner}:{owner}", folder])
    for unit, (description, start, name) in UNITS.items():
        write(Path(f"/etc/systemd/system/{unit}.service"), "\n".join([
            "[Unit]", f"Description={description}", "After=network-online.target munge.service",
            # A configless slurmd started before slurmctld answers exits: it is started again until it does.
            "Wants=network-online.target", "StartLimitIntervalSec=0", "", "[Service]", "Type=simple",
            *([f"Environment=SLURM_CONF={SLURM_PREFIX}/etc/slurm.conf"] if unit == "slurmctld" else []),
            f"Environment={name.upper()}_OPTIONS=",
            f"ExecStart={start}", "ExecReload=/bin/kill -HUP $MAINPID", "LimitNOFILE=131072", "LimitMEMLOCK=infinity",
            "LimitSTACK=infinity", "Restart=on-failure", "RestartSec=5", "RuntimeDirectory=slurm",
            "RuntimeDirectoryPreserve=yes",
            "", "[Install]", "WantedBy=multi-user.target", ""]))
    run(["systemctl", "daemon-reload"])
    if kind == "Controller":
        # Debian's client commands read /etc/slurm/slurm.conf; HyperPod's, built for /opt/slurm, read its etc.
        write(SLURM_PREFIX / "etc" / "slurm.conf", slurm_conf(settings))
        link = Path("/etc/slurm/slurm.conf")
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(SLURM_PREFIX / "etc" / "slurm.conf")


def hook(cycle: dict[str, Any]) -> tuple[str, str]:
    """(the hook, the script) a group's LifeCycleConfig names."""
    named = [(name, str(cycle[name])) for name in HOOKS if cycle.get(name)]
    if len(named) != 1:
        raise ValueError(f"LifeCycleConfig names {[n for n, _ in named] or 'no script'}: one of {', '.join(HOOKS)}")
    return named[0]


def start_ami_slurm(settings: dict[str, Any], kind: str) -> None:
    """HyperPod's own start of its Slurm, before an OnInitComplete script: slurmctld on the controller group; elsewhere
    a configless slurmd (--conf-server, the controller's customer address: it fetches slurm.conf from slurmctld, as
    HyperPod's does, hyperpod-mental-model.md), login nodes too (a login node is no Slurm node here: its slurmd gets the
    configuration and then stops, which is not an error)."""
    if kind == "Controller":
        run(["systemctl", "enable", "--now", "slurmctld"])
        return
    types = {g["name"]: str(g.get("NodeType") or "Compute") for g in settings["slurm_groups"]}
    controller = next(i["CustomerIpAddress"] for g in settings["resource_config"]["InstanceGroups"]
                      if types.get(g["Name"]) == "Controller" for i in g["Instances"])
    write(Path("/etc/systemd/system/slurmd.service.d/hyperpod-conf-server.conf"),
          f'[Service]\nEnvironment="SLURMD_OPTIONS=--conf-server {controller}"\n')
    run(["systemctl", "daemon-reload"])
    run(["systemctl", "enable", "slurmd"])
    subprocess.run(["systemctl", "restart", "slurmd"], check=kind != "Login")


def staging_dir(source_uri: str) -> Path:
    """Where HyperPod puts the bundle of LifeCycleConfig.SourceS3Uri s3://<bucket>/<prefix>/: /tmp/<bucket>/<prefix>."""
    bucket, _, prefix = source_uri.removeprefix("s3://").partition("/")
    return STAGING_ROOT / bucket / prefix.strip("/")


def run_lifecycle(settings: dict[str, Any]) -> int:
    """Download SourceS3Uri where HyperPod stages it and run the group's script (OnInitComplete or OnCreate) from
    there, as root, its output in /var/log/provision."""
    cycle = settings["life_cycle_config"]
    name, script = hook(cycle)
    source = str(cycle["SourceS3Uri"]).rstrip("/") + "/"
    folder = staging_dir(source)
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 11):
        done = subprocess.run([S3_CLIENT, "--region", settings["region"], "sync", source, str(folder)], check=False)
        if done.returncode == 0 and (folder / script).is_file():
            break
        if attempt == 10:
            log(f"no {script} at {source}")
            return 1
        __import__("time").sleep(attempt * 3)
    PROVISION_LOG.parent.mkdir(parents=True, exist_ok=True)
    log(f"running {script} from {source} in {folder} (resource config {RESOURCE_CONFIG})")
    environment = {**os.environ, "SAGEMAKER_RESOURCE_CONFIG_PATH": str(RESOURCE_CONFIG)}
    with PROVISION_LOG.open("a", encoding="utf-8") as provision:
        provision.write(f"fmcluster hyperpod stand-in: {name} {script} from {source}\n")
        provision.flush()
        process = subprocess.Popen(["bash", script], cwd=folder, env=environment,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            provision.write(line)
            provision.flush()
        code = process.wait()
        provision.write(f"fmcluster hyperpod stand-in: {script} exited {code}\n")
    return code


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 64
    settings = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    write(RESOURCE_CONFIG, json.dumps(settings["resource_config"], indent=1) + "\n")
    kind = node_type(settings, settings["instance_group"])
    log(f"instance group {settings['instance_group']} ({kind}): the AMI's Slurm under {SLURM_PREFIX}")
    install_ami_slurm(settings, kind)
    if hook(settings["life_cycle_config"])[0] == "OnInitComplete":
        log(f"starting the AMI's Slurm ({kind}) before OnInitComplete, as HyperPod does")
        start_ami_slurm(settings, kind)
    return run_lifecycle(settings)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
