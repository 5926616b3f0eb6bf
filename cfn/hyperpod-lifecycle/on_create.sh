#!/bin/bash
# fmcluster HyperPod lifecycle script (uploaded by `invoke deploy` to s3://<data bucket>/hyperpod/lifecycle/).
# HyperPod runs it as root on every instance at creation. It records which group the node belongs
# to and hands over to the fmcluster bootstrap (ansible-pull, filled in by the ansible-pull issue).
set -euo pipefail
install -d -m 0755 /etc/fmcluster
if [ -f /opt/ml/config/resource_config.json ]; then
  cp /opt/ml/config/resource_config.json /etc/fmcluster/hyperpod_resource_config.json
fi
if [ -x /usr/local/sbin/fmcluster-bootstrap ]; then
  /usr/local/sbin/fmcluster-bootstrap
fi
