#!/bin/bash
# fmcluster HyperPod lifecycle script (uploaded by `invoke deploy` to s3://<data bucket>/hyperpod/lifecycle/ with
# fmcluster-lifecycle.env and node-user-data.sh). HyperPod runs it as root on every instance at creation, as the
# groups' OnInitComplete: after HyperPod has configured and started its own Slurm from the groups' SlurmConfig
# (fmcluster installs no second one; wait_for_hyperpod_slurm.sh says where that is documented). It waits for this
# node's Slurm daemon (wait_for_hyperpod_slurm.sh), then runs exactly what every other fmcluster node runs at first
# boot: node-user-data.sh, which fetches and runs the node bootstrap (docs/node-convergence.md). The node finds its
# role through SageMaker's ListClusterNodes. The name is the one it has had since it ran as OnCreate.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# HyperPod's resource config: where SAGEMAKER_RESOURCE_CONFIG_PATH says, else its default (wait_for_hyperpod_slurm.sh).
resource_config=${SAGEMAKER_RESOURCE_CONFIG_PATH:-/opt/ml/config/resource_config.json}
if [ -f "$resource_config" ]; then
  install -d -m 0755 /etc/fmcluster
  cp "$resource_config" /etc/fmcluster/hyperpod_resource_config.json
fi
set -a
# shellcheck source=/dev/null
. "$here/fmcluster-lifecycle.env"
set +a
bash "$here/wait_for_hyperpod_slurm.sh"
exec bash "$here/node-user-data.sh"
