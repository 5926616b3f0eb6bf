#!/bin/bash
# Starts the Slurm SageMaker HyperPod ships and configures; fmcluster installs no Slurm and no munge on HyperPod
# (one Slurm per cluster: HyperPod's). HyperPod's AMI has Slurm under /opt/slurm with its systemd units, and
# HyperPod's cluster agent writes /opt/slurm/etc/slurm.conf (nodes and partitions from the cluster's SlurmConfig)
# and the munge key; what is left to the lifecycle script is starting the daemons: slurmctld on the controller
# group, a configless slurmd (--conf-server: it fetches slurm.conf from slurmctld) on the other groups. Login nodes
# run slurmd too: that is how they get slurm.conf (they are not Slurm nodes, so it does not stay up).
# Where: AWS's HyperPod lifecycle samples (awsome-distributed-training, LifecycleScripts/base-config) and
# docs/stacks.md, "Which Slurm each scheduler runs".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# HyperPod names its resource config in SAGEMAKER_RESOURCE_CONFIG_PATH; AWS's on_create.sh reads that first, the
# default path only when it is unset, and fails when it names no file (awsome-distributed-training,
# 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/on_create.sh).
config=${SAGEMAKER_RESOURCE_CONFIG_PATH:-/opt/ml/config/resource_config.json}
slurm_conf=${FMCLUSTER_HYPERPOD_SLURM_CONF:-/opt/slurm/etc/slurm.conf}
wait_s=${FMCLUSTER_HYPERPOD_SLURM_WAIT_S:-300}
units=${FMCLUSTER_SYSTEMD_UNIT_DIR:-/etc/systemd/system}

if [ ! -f "$config" ]; then
  if [ -n "${SAGEMAKER_RESOURCE_CONFIG_PATH:-}" ]; then
    echo "fmcluster: HyperPod names $config as its resource config (SAGEMAKER_RESOURCE_CONFIG_PATH) and it is" \
      "absent: this node's Slurm role is unknown, nothing is started" >&2
    exit 1
  fi
  echo "fmcluster: $config is absent (not a HyperPod instance): HyperPod's Slurm is not started here"
  exit 0
fi
# shellcheck disable=SC2046  # one argument per address
found=$(python3 "$here/hyperpod_slurm_role.py" "$config" $(hostname -I))  # exits non-zero: this script does too
read -r role controllers <<<"$found"
controller=${controllers%%,*}
echo "fmcluster: HyperPod Slurm role $role, controller $controller"

# The daemon a node must not run is masked. HyperPod's AMI keeps its Slurm units in /etc/systemd/system (AWS's
# start_slurm.sh renames them there), where `systemctl mask` cannot put its link ("File ... already exists"): the
# unit is moved aside first, as AWS's sample does.
set_aside() {
  if [ -f "$units/$1.service" ] && [ ! -L "$units/$1.service" ]; then
    mv -f "$units/$1.service" "$units/$1.service.fmcluster-not-on-this-node"
  fi
  systemctl mask "$1"
}

if [ "$role" = controller ]; then
  # HyperPod's agent writes slurm.conf naming the controller; slurmctld started before that would run without it.
  # It names a node by its address or by the name it derives from it, ip-N-N-N-N (awsome-distributed-ai,
  # 5.sagemaker-hyperpod/tools/devops-agent/docs/hyperpod-mental-model.md); either says the controller is there.
  # As whole words: 10.1.0.10 is not named by 10.1.0.100.
  names_controller() { grep -qwF -e "$controller" -e "ip-${controller//./-}" "$slurm_conf" 2>/dev/null; }
  for _ in $(seq 1 "$((wait_s / 5))"); do
    names_controller && break
    sleep 5
  done
  if ! names_controller; then
    echo "fmcluster: $slurm_conf does not name the controller $controller after ${wait_s}s: HyperPod's agent has" \
      "not configured Slurm; see /var/log/provision and the cluster's CloudWatch logs" >&2
    exit 1
  fi
  set_aside slurmd
  systemctl enable --now slurmctld
else
  # The unit's ExecStart reads $SLURMD_OPTIONS (AWS's samples set it the same way); a drop-in, not an edited unit.
  install -d -m 0755 "$units/slurmd.service.d"
  printf '[Service]\nEnvironment="SLURMD_OPTIONS=--conf-server %s"\n' "$controller" \
    > "$units/slurmd.service.d/fmcluster-conf-server.conf"
  set_aside slurmctld
  systemctl daemon-reload
  systemctl enable slurmd
  systemctl restart slurmd || [ "$role" = login ]  # a login node is no Slurm node: slurmd fetches the config, then stops
fi
