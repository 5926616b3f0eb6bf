#!/bin/bash
# Waits until the Slurm SageMaker HyperPod ships, configures and starts is up on this node; fmcluster installs,
# configures and starts no Slurm and no munge on HyperPod (one Slurm per cluster: HyperPod's).
#
# fmcluster's instance groups carry SlurmConfig (NodeType, PartitionNames: the API-driven Slurm configuration) and run
# this lifecycle as OnInitComplete, which AWS documents as running "after HyperPod configures the default software on
# the instance" ("Extended mode"; OnCreate is "Customer Managed mode", where the lifecycle scripts set Slurm up
# themselves): CloudFormation's AWS::SageMaker::Cluster schema, ClusterLifeCycleConfig (cfn-lint 1.58.0's copy), and
# the SageMaker API reference, "runs on the node after the AMI-based initialization is complete"
# (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ClusterLifeCycleConfig.html). AWS's samples for that
# mode say "HyperPod sets up Slurm and Docker automatically, then runs your extension script", with SlurmConfig on
# every group (awslabs/awsome-distributed-ai, 1.architectures/5.sagemaker-hyperpod/Extensions/observability/README.md,
# MIT-0), and that a script needing Slurm runs after it starts "With OnInitComplete, this is guaranteed"
# (Extensions/add-users/README.md); their node detection warns that OnInitComplete "can run before or in parallel with
# Slurm service startup" (Extensions/detect-node/README.md). So this script starts nothing and waits: on the
# controller group until slurm.conf names the controller and slurmctld is active, on a compute group until slurmd is
# active (configless: it fetched slurm.conf from slurmctld). A login node runs slurmd too on HyperPod, but fmcluster's
# first boot there needs only the Slurm client, so nothing is awaited there. A daemon that never comes up fails the
# lifecycle, and with it the node (HyperPod replaces it, or fails the cluster at creation).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# HyperPod names its resource config in SAGEMAKER_RESOURCE_CONFIG_PATH; AWS's on_create.sh reads that first, the
# default path only when it is unset, and fails when it names no file (awsome-distributed-training,
# 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/on_create.sh).
config=${SAGEMAKER_RESOURCE_CONFIG_PATH:-/opt/ml/config/resource_config.json}
slurm_conf=${FMCLUSTER_HYPERPOD_SLURM_CONF:-/opt/slurm/etc/slurm.conf}
wait_s=${FMCLUSTER_HYPERPOD_SLURM_WAIT_S:-600}

if [ ! -f "$config" ]; then
  if [ -n "${SAGEMAKER_RESOURCE_CONFIG_PATH:-}" ]; then
    echo "fmcluster: HyperPod names $config as its resource config (SAGEMAKER_RESOURCE_CONFIG_PATH) and it is" \
      "absent: this node's Slurm role is unknown" >&2
    exit 1
  fi
  echo "fmcluster: $config is absent (not a HyperPod instance): no HyperPod Slurm to wait for"
  exit 0
fi
# shellcheck disable=SC2046  # one argument per address
found=$(python3 "$here/hyperpod_slurm_role.py" "$config" $(hostname -I))  # exits non-zero: this script does too
read -r role controllers <<<"$found"
controller=${controllers%%,*}
echo "fmcluster: HyperPod Slurm role $role, controller $controller"

# HyperPod's slurm.conf names a node by its address or by the name it derives from it, ip-N-N-N-N (awsome-distributed-ai,
# 5.sagemaker-hyperpod/tools/devops-agent/docs/hyperpod-mental-model.md); either says the controller is there. As whole
# words: 10.1.0.10 is not named by 10.1.0.100.
names_controller() { grep -qwF -e "$controller" -e "ip-${controller//./-}" "$slurm_conf" 2>/dev/null; }
case "$role" in
  controller) ready() { names_controller && systemctl is-active --quiet slurmctld; }; what="slurmctld, with a slurm.conf naming $controller";;
  compute) ready() { systemctl is-active --quiet slurmd; }; what="slurmd (configless, from $controller)";;
  *) echo "fmcluster: a $role node: no Slurm daemon of HyperPod's to wait for"; exit 0;;
esac
for _ in $(seq 1 "$((wait_s / 5))"); do
  ready && break
  sleep 5
done
if ! ready; then
  echo "fmcluster: HyperPod's $what is not up after ${wait_s}s; this lifecycle runs as OnInitComplete, after" \
    "HyperPod configures Slurm: see /var/log/provision and the cluster's CloudWatch logs" >&2
  exit 1
fi
echo "fmcluster: HyperPod's $what is up"
