#!/bin/bash
# fmcluster OnNodeConfigured custom action for AWS ParallelCluster 3 (scheduler parallelcluster).
#
# The deploy uploads this script to s3://<data bucket>/fmcluster/bootstrap/pcluster-on-node-configured.sh; the
# cluster config fmcluster renders (fmcluster.parallelcluster.config) names it under CustomActions/OnNodeConfigured
# of the head node, the login pool and every queue. ParallelCluster runs it as root once the node is configured
# (its Slurm, munge, shared storage are up), with these arguments:
#
#   FMCLUSTER_BUCKET=<data bucket> FMCLUSTER_REGION=<region> FMCLUSTER_ORG=<org> FMCLUSTER_ROLE=controller|login|compute
#   [FMCLUSTER_QUEUE=<queue>]
#
# It records the node's role (/etc/fmcluster/node.json, as the slurm-ec2 user data does), fetches the fmcluster
# bootstrap bundle from s3://<bucket>/fmcluster/bootstrap/ (retrying: S3 can lag the boot) and runs the same
# node bootstrap as the other schedulers (scripts/node-bootstrap.sh → ansible-pull; docs/node-convergence.md).
# Arguments are data: each is checked against its form before use and never evaluated.
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

etc=${FMCLUSTER_ETC_DIR:-/etc/fmcluster}
bundle_dir=${FMCLUSTER_BOOTSTRAP_DIR:-/opt/fmcluster/bootstrap}
install -d -m 0755 "$etc" "$bundle_dir"
# Every value was checked above (no quotes, no backslashes), so it can stand in JSON as it is.
cat >"$etc/node.json" <<JSON
{"org": "$FMCLUSTER_ORG", "role": "$FMCLUSTER_ROLE", "queue": "${FMCLUSTER_QUEUE:-}", "scheduler": "parallelcluster", "region": "$FMCLUSTER_REGION", "bucket": "$FMCLUSTER_BUCKET"}
JSON

fetched=0
for try in $(seq 1 30); do
  if aws s3 cp --recursive --only-show-errors --region "$FMCLUSTER_REGION" \
    "s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/" "$bundle_dir/"; then
    fetched=1
    break
  fi
  echo "fmcluster: bootstrap fetch failed (try $try/30)" >&2
  sleep 10
done
[[ $fetched == 1 && -s $bundle_dir/node-bootstrap.sh ]] || die "no node-bootstrap.sh in s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/"
exec bash "$bundle_dir/node-bootstrap.sh"
