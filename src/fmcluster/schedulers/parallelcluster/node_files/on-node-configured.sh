#!/bin/bash
# fmcluster OnNodeConfigured custom action for AWS ParallelCluster 3 (scheduler parallelcluster).
#
# The deploy uploads this file followed by src/fmcluster/node/boot/node-user-data.sh, as one script, to
# s3://<data bucket>/fmcluster/bootstrap/pcluster-on-node-configured.sh; the cluster config fmcluster renders
# (fmcluster.schedulers.parallelcluster.config) names it under CustomActions/OnNodeConfigured of the head node, the login
# pool and every queue. ParallelCluster runs it as root once the node is configured (its Slurm, munge and
# shared storage are up), with these arguments:
#
#   FMCLUSTER_BUCKET=<data bucket> FMCLUSTER_REGION=<region> FMCLUSTER_ORG=<org> FMCLUSTER_ROLE=controller|login|compute
#   [FMCLUSTER_QUEUE=<queue>]
#
# This part checks each argument against its form (they are data: never evaluated) and exports it; the rest is
# the first boot of every fmcluster node (fetch node-bootstrap.sh from the bucket and run it:
# docs/node-convergence.md). The node learns its role from ParallelCluster's own instance tags, like every
# other node learns it from its cluster; the role and queue arguments are kept for the log.
# On provider local no ParallelCluster runs: the stand-in's user data downloads this same object and runs it
# with the same arguments (docs/parallelcluster.md, "Local stand-in").
set -euo pipefail

die() { echo "fmcluster on-node-configured: $*" >&2; exit 2; }

for arg in "$@"; do
  key=${arg%%=*}
  value=${arg#*=}
  case $key in
    FMCLUSTER_BUCKET) [[ $value =~ ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$ ]] || die "bad bucket name" ;;
    FMCLUSTER_REGION) [[ $value =~ ^[a-z]{2}(-[a-z]+)+-[0-9]$ ]] || die "bad region" ;;
    FMCLUSTER_ORG) [[ $value =~ ^[a-z][a-z0-9-]{1,23}$ ]] || die "bad org" ;;
    FMCLUSTER_ROLE) [[ $value =~ ^(controller|login|compute)$ ]] || die "bad role" ;;
    FMCLUSTER_QUEUE) [[ $value =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "bad queue name" ;;
    *) die "unknown argument '${key}'" ;;
  esac
  printf -v "$key" '%s' "$value"
  export "${key?}"
done
: "${FMCLUSTER_BUCKET:?missing FMCLUSTER_BUCKET=}" "${FMCLUSTER_REGION:?missing FMCLUSTER_REGION=}"
: "${FMCLUSTER_ORG:?missing FMCLUSTER_ORG=}" "${FMCLUSTER_ROLE:?missing FMCLUSTER_ROLE=}"
echo "fmcluster on-node-configured: ${FMCLUSTER_ROLE}${FMCLUSTER_QUEUE:+ of queue $FMCLUSTER_QUEUE} of $FMCLUSTER_ORG"
# --- src/fmcluster/node/boot/node-user-data.sh follows (appended by the deploy) ---
