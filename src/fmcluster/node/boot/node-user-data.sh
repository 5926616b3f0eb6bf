# fmcluster first boot (EC2 user data, HyperPod on_create.sh and ParallelCluster OnNodeConfigured run exactly
# this, after setting FMCLUSTER_BUCKET, FMCLUSTER_REGION, FMCLUSTER_ORG and, where CloudFormation waits for the
# node, FMCLUSTER_STACK and FMCLUSTER_SIGNAL_RESOURCE): write the S3 client every image can run (fmcluster-s3,
# Python's standard library alone: not every image has the AWS CLI), fetch the node bootstrap the deploy
# published to the tenant bucket, retrying while the network comes up, and run it (node-bootstrap.sh, beside this file) once
# it is what the deploy published: its SHA-256 is the one the deploy's index lists, and the index's the one in the
# SSM parameter /fmcluster/<org>/bootstrap-index-sha256, which the deploy alone writes (docs/stacks.md).
# shellcheck shell=bash
set -euo pipefail
export FMCLUSTER_BUCKET FMCLUSTER_REGION FMCLUSTER_ORG
FMCLUSTER_BOOT_STARTED=${FMCLUSTER_BOOT_STARTED:-$(date +%s)}
export FMCLUSTER_BOOT_STARTED
bin_dir=${FMCLUSTER_BIN_DIR:-/usr/local/sbin}  # another directory only where a test runs this off a node
install -d -m 0755 "$bin_dir"
# fmcluster-s3 (beside this file) written to $bin_dir, packed (gzip, base64): fmcluster.stacks.render.first_boot_script puts
# fmcluster.stacks.render.s3_client_writer's lines here.
@FMCLUSTER_S3_CLIENT_WRITER@
boot=fmcluster/bootstrap/node-bootstrap.sh
for try in 1 2 3 4 5 6 7 8 9 10; do
  # A mismatch is retried too: a deploy publishing now names its new index last.
  if "$bin_dir/fmcluster-s3" get "s3://$FMCLUSTER_BUCKET/$boot" "$bin_dir/fmcluster-bootstrap.new" \
    && "$bin_dir/fmcluster-s3" verify "/fmcluster/$FMCLUSTER_ORG/bootstrap-index-sha256" \
      "s3://$FMCLUSTER_BUCKET/fmcluster/manifest/index.json" "$boot" "$bin_dir/fmcluster-bootstrap.new"; then
    chmod 0755 "$bin_dir/fmcluster-bootstrap.new" && mv -f "$bin_dir/fmcluster-bootstrap.new" "$bin_dir/fmcluster-bootstrap"
    exec "$bin_dir/fmcluster-bootstrap"
  fi
  echo "fmcluster: no node bootstrap the deploy's index vouches for at s3://$FMCLUSTER_BUCKET/$boot (try $try/10)" >&2
  sleep $((try * 3))
done
rm -f "$bin_dir/fmcluster-bootstrap.new"
echo "fmcluster: FAILED: no node bootstrap in s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/ that the deploy published" \
  "(above: why); nothing was run. Is the deploy running? Else re-run invoke deploy" >&2
# Where CloudFormation waits for this node (its group's CreationPolicy): fail it now, not at the signal Timeout.
if [[ -n ${FMCLUSTER_STACK:-} && -n ${FMCLUSTER_SIGNAL_RESOURCE:-} ]]; then
  me=$("$bin_dir/fmcluster-s3" instance-id) || me=$(hostname)
  "$bin_dir/fmcluster-s3" signal "$FMCLUSTER_STACK" "$FMCLUSTER_SIGNAL_RESOURCE" "$me" FAILURE || true
fi
exit 1
