# fmcluster first boot (EC2 user data, HyperPod on_create.sh and ParallelCluster OnNodeConfigured run exactly
# this, after setting FMCLUSTER_BUCKET, FMCLUSTER_REGION, FMCLUSTER_ORG and, where CloudFormation waits for the
# node, FMCLUSTER_STACK and FMCLUSTER_SIGNAL_RESOURCE): write the S3 client every image can run (fmcluster-s3,
# Python's standard library alone: not every image has the AWS CLI), fetch the node bootstrap the deploy
# published to the tenant bucket, retrying while the network comes up, and run it (scripts/node-bootstrap.sh).
set -euo pipefail
export FMCLUSTER_BUCKET FMCLUSTER_REGION FMCLUSTER_ORG
FMCLUSTER_BOOT_STARTED=${FMCLUSTER_BOOT_STARTED:-$(date +%s)}
export FMCLUSTER_BOOT_STARTED
bin_dir=${FMCLUSTER_BIN_DIR:-/usr/local/sbin}  # another directory only where a test runs this off a node
install -d -m 0755 "$bin_dir"
# scripts/fmcluster-s3 written to $bin_dir, packed (gzip, base64): fmcluster.stacks.render.first_boot_script puts
# fmcluster.stacks.render.s3_client_writer's lines here.
@FMCLUSTER_S3_CLIENT_WRITER@
for try in 1 2 3 4 5 6 7 8 9 10; do
  if "$bin_dir/fmcluster-s3" get "s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/node-bootstrap.sh" "$bin_dir/fmcluster-bootstrap"; then
    chmod 0755 "$bin_dir/fmcluster-bootstrap"
    exec "$bin_dir/fmcluster-bootstrap"
  fi
  echo "fmcluster: cannot fetch s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/node-bootstrap.sh (try $try/10)" >&2
  sleep $((try * 3))
done
echo "fmcluster: FAILED: no node bootstrap in s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/; is the deploy running?" >&2
# Where CloudFormation waits for this node (its group's CreationPolicy): fail it now, not at the signal Timeout.
if [[ -n ${FMCLUSTER_STACK:-} && -n ${FMCLUSTER_SIGNAL_RESOURCE:-} ]]; then
  me=$("$bin_dir/fmcluster-s3" instance-id) || me=$(hostname)
  "$bin_dir/fmcluster-s3" signal "$FMCLUSTER_STACK" "$FMCLUSTER_SIGNAL_RESOURCE" "$me" FAILURE || true
fi
exit 1
