#!/bin/bash
# fmcluster HyperPod lifecycle script (uploaded by `invoke deploy` to s3://<data bucket>/hyperpod/lifecycle/ with
# fmcluster-lifecycle.env and node-user-data.sh). HyperPod runs it as root on every instance at creation. It starts
# HyperPod's own Slurm (start_hyperpod_slurm.sh: fmcluster installs no second one), then exactly what every other
# fmcluster node runs at first boot: node-user-data.sh, which fetches and runs the node bootstrap
# (docs/node-convergence.md). The node finds its role through SageMaker's ListClusterNodes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -f /opt/ml/config/resource_config.json ]; then
  install -d -m 0755 /etc/fmcluster
  cp /opt/ml/config/resource_config.json /etc/fmcluster/hyperpod_resource_config.json
fi
set -a
# shellcheck source=/dev/null
. "$here/fmcluster-lifecycle.env"
set +a
bash "$here/start_hyperpod_slurm.sh"
exec bash "$here/node-user-data.sh"
