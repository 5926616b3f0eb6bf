#!/bin/bash
# fmcluster HyperPod lifecycle script (uploaded by `invoke deploy` to s3://<data bucket>/hyperpod/lifecycle/,
# with fmcluster-lifecycle.env: the FMCLUSTER_* boot variables the EC2 user data exports too, written by
# fmcluster.stacks.render.lifecycle_environment). HyperPod runs it as root on every instance at creation.
# It records which group the node belongs to, fetches the fmcluster bootstrap bundle from
# s3://<bucket>/fmcluster/bootstrap/ (retrying: the network comes up late) and runs it with that
# environment: pinned toolchain, then ansible-pull of the tenant repository (docs/node-convergence.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
set -a
# shellcheck source=/dev/null
. "$here/fmcluster-lifecycle.env"
set +a
install -d -m 0755 /etc/fmcluster /opt/fmcluster/bootstrap
if [ -f /opt/ml/config/resource_config.json ]; then
  cp /opt/ml/config/resource_config.json /etc/fmcluster/hyperpod_resource_config.json
fi
for try in $(seq 1 30); do
  aws s3 cp --recursive --only-show-errors --region "$FMCLUSTER_REGION" \
    "s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/" /opt/fmcluster/bootstrap/ && break
  echo "fmcluster: bootstrap fetch failed (try $try/30)" >&2
  sleep 10
done
install -m 0755 /opt/fmcluster/bootstrap/node-bootstrap.sh /usr/local/sbin/fmcluster-bootstrap
exec /usr/local/sbin/fmcluster-bootstrap
