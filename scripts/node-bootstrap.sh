#!/usr/bin/env bash
# fmcluster node bootstrap (installed as /usr/local/sbin/fmcluster-bootstrap). On AWS, EC2 user data
# (slurm-ec2) and the HyperPod lifecycle script (on_create.sh) fetch the bootstrap bundle that `invoke deploy`
# uploads to s3://<data bucket>/fmcluster/bootstrap/ (this script, node-converge.sh, converge.env,
# repo.bundle) into /opt/fmcluster/bootstrap/ and run this script once, as root.
#
# It installs the pinned toolchain (python3 venv + pinned ansible-core), unpacks the tenant repository from
# the bundle into a local bare repository (nodes need no git server and no internet: only S3), fetches the
# generated inventory the deploy publishes, writes /etc/fmcluster/converge.env (what the re-converge timer
# of the node_convergence role reads) and runs node-converge.sh once. The node's status file and log are
# copied back to s3://<bucket>/fmcluster/report/ for the controller.
#
#   fmcluster-bootstrap           fetch, then converge once
#   fmcluster-bootstrap --fetch   fetch only (the timer's ExecStartPre: a new deploy's ref and inventory)
#
# Inputs: converge.env next to this script (FMCLUSTER_BUCKET, FMCLUSTER_REGION, FMCLUSTER_REF,
# FMCLUSTER_PLAYBOOK, FMCLUSTER_ANSIBLE_CORE); FMCLUSTER_NODE overrides the node name (default: hostname -s,
# which is how the generated inventory names AWS nodes); FMCLUSTER_INVENTORY_WAIT (tries, 30 s apart,
# waiting for the inventory the deploy writes once the nodes exist; default 60). FMCLUSTER_ETC_DIR,
# FMCLUSTER_BOOTSTRAP_DIR and FMCLUSTER_SBIN_DIR move /etc/fmcluster, /opt/fmcluster/bootstrap and
# /usr/local/sbin (tests).
set -euo pipefail

etc=${FMCLUSTER_ETC_DIR:-/etc/fmcluster}
bundle_dir=${FMCLUSTER_BOOTSTRAP_DIR:-/opt/fmcluster/bootstrap}
sbin=${FMCLUSTER_SBIN_DIR:-/usr/local/sbin}
here=$(cd "$(dirname "$0")" && pwd)
[[ -f $here/converge.env ]] || here=$bundle_dir
set -a
# shellcheck source=/dev/null
. "$here/converge.env"
set +a
: "${FMCLUSTER_BUCKET:?converge.env must set FMCLUSTER_BUCKET}" "${FMCLUSTER_REF:?converge.env must set FMCLUSTER_REF}"
region=${FMCLUSTER_REGION:-}
node=${FMCLUSTER_NODE:-$(hostname -s)}
state=${FMCLUSTER_STATE_DIR:-/var/lib/fmcluster}
venv=${FMCLUSTER_VENV:-/opt/fmcluster/venv}
repo="$state/repo.git"
inventory_dir=$etc/inventory
s3="s3://$FMCLUSTER_BUCKET/fmcluster"
install -d -m 0755 "$etc" "$inventory_dir" "$bundle_dir" "$sbin" "$state"

aws_s3() { aws s3 "$@" --only-show-errors ${region:+--region "$region"}; }

# Retry: boot-time networks and the S3 endpoint come up late.
retry() {
  local tries=$1 attempt
  shift
  for ((attempt = 1; attempt <= tries; attempt++)); do
    "$@" && return 0
    echo "fmcluster-bootstrap: '$*' failed (try $attempt/$tries); retrying in 30s" >&2
    sleep 30
  done
  return 1
}

fetch() {
  retry 20 aws_s3 cp --recursive "$s3/bootstrap/" "$bundle_dir/"
  install -m 0755 "$bundle_dir/node-bootstrap.sh" "$sbin/fmcluster-bootstrap"
  set -a
  # shellcheck source=/dev/null
  . "$bundle_dir/converge.env"
  set +a
  [[ -d $repo ]] || git init -q --bare "$repo"
  git -C "$repo" fetch -q "$bundle_dir/repo.bundle" "+HEAD:refs/heads/fmcluster"
  git -C "$repo" symbolic-ref HEAD refs/heads/fmcluster
  # The inventory exists only once the nodes do (the deploy writes it after the cluster stack): wait for it.
  inventory_ready() { aws_s3 cp --recursive "$s3/inventory/" "$inventory_dir/" && [[ -s $inventory_dir/hosts.yml ]]; }
  retry "${FMCLUSTER_INVENTORY_WAIT:-60}" inventory_ready
  # What the node_convergence role needs to know of this bootstrap, as an inventory source of its own.
  cat >"$etc/node-vars.yml" <<YAML
# written by fmcluster-bootstrap (scripts/node-bootstrap.sh); rewritten at each fetch
all:
  vars:
    fmcluster_repo_url: $repo
    fmcluster_repo_ref: $FMCLUSTER_REF
    fmcluster_node_inventory: [$inventory_dir/hosts.yml, $inventory_dir/stack_outputs.yml, $etc/node-vars.yml]
    fmcluster_converge_refresh: $sbin/fmcluster-bootstrap --fetch
YAML
  # The same keys, in the same order, as the node_convergence role's converge.env.j2.
  cat >"$etc/converge.env" <<ENV
# fmcluster node convergence (written by fmcluster-bootstrap, kept by the node_convergence role)
FMCLUSTER_REPO_URL=$repo
FMCLUSTER_REF=$FMCLUSTER_REF
FMCLUSTER_NODE=$node
FMCLUSTER_INVENTORY=$inventory_dir/hosts.yml $inventory_dir/stack_outputs.yml $etc/node-vars.yml
FMCLUSTER_PLAYBOOK=${FMCLUSTER_PLAYBOOK:-playbooks/site.yml}
FMCLUSTER_STATE_DIR=$state
FMCLUSTER_REPORT_DIR=$state/report
FMCLUSTER_VENV=$venv
ENV
}

fetch
[[ ${1:-} == --fetch ]] && exit 0

if [[ ! -x $venv/bin/ansible-pull ]]; then
  python3 -m venv "$venv"
  retry 10 "$venv/bin/pip" install -q "ansible-core==${FMCLUSTER_ANSIBLE_CORE:-2.19.14}"
fi

rc=0
env -i PATH="$venv/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/root bash -c \
  "set -a; . '$etc/converge.env'; exec bash '$bundle_dir/node-converge.sh'" || rc=$?
# Leave the status and the log where the controller collects them, even (above all) on failure.
aws_s3 cp "$state/report/$node.json" "$s3/report/$node.json" || true
aws_s3 cp "$state/log/pull-$node.log" "$s3/report/$node.log" || true
exit "$rc"
