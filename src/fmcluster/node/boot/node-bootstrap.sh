#!/usr/bin/env bash
# fmcluster node bootstrap: the one thing every node runs at first boot, whatever made it — EC2 user data
# (slurm-ec2 launch templates), HyperPod's on_create.sh, ParallelCluster's OnNodeConfigured — on AWS and on the
# local substrate alike. The user data fetches this script from s3://$FMCLUSTER_BUCKET/fmcluster/bootstrap/ and
# runs it as root with:
#   FMCLUSTER_BUCKET   the tenant's data bucket          FMCLUSTER_REGION  its region
#   FMCLUSTER_ORG      the tenant                        FMCLUSTER_STACK, FMCLUSTER_SIGNAL_RESOURCE (optional):
#                                                        the CloudFormation resource to signal once converged
# and the AWS endpoint/credentials of wherever it runs (instance profile on AWS; on provider local the
# substrate's environment names the tenant's emulator: AWS_ENDPOINT_URL and its credentials).
#
# It fetches the bundle the deploy published (this script, converge.env with the pinned commit, repo.bundle,
# the wheelhouse) with fmcluster-s3 (the first boot's stdlib S3 client: not every image has the AWS CLI),
# installs what the image lacks for the toolchain through the image's own package manager (git; apt waits for
# the dpkg lock another boot-time job holds), builds the node's toolchain from the bundle's wheelhouse
# (/opt/fmcluster/venv: pinned, --no-index; kept when it already holds the pins), unpacks the pinned commit,
# and hands over to the node agent (python -m fmcluster.node), which reads the manifest and the secrets, finds
# the cluster's nodes in the AWS APIs, runs ansible-pull for this node and reports to
# s3://$FMCLUSTER_BUCKET/fmcluster/report/. Every fetch retries with backoff; a failure is reported (what could
# not be reached) before the script exits non-zero. Each stage's time goes into the node's report
# (/var/lib/fmcluster/boot-stages.json: fetch, packages, toolchain, commit; the agent adds converge).
#
#   node-bootstrap.sh           fetch, then converge once (first boot)
#   node-bootstrap.sh --fetch   fetch only (the node agent runs this when the deploy publishes a new commit)
#   node-bootstrap.sh --install the install stages only (packages, toolchain), with the bundle already in place: a
#                               baked image's builder (`invoke image`, fmcluster.providers.local.bake; issue 40)
set -euo pipefail

: "${FMCLUSTER_BUCKET:?the user data must set FMCLUSTER_BUCKET}" "${FMCLUSTER_REGION:?the user data must set FMCLUSTER_REGION}"
: "${FMCLUSTER_ORG:?the user data must set FMCLUSTER_ORG}"
etc=/etc/fmcluster
state=/var/lib/fmcluster
bundle=/opt/fmcluster/bootstrap
venv=${FMCLUSTER_VENV:-/opt/fmcluster/venv}
tries=${FMCLUSTER_FETCH_TRIES:-8}
s3client=${FMCLUSTER_S3_CLIENT:-/usr/local/sbin/fmcluster-s3}
started=${FMCLUSTER_BOOT_STARTED:-$(date +%s)}
mode=${1:-first-boot}  # or --fetch (the agent, for a newly published commit: nothing to signal then), or --install
declare -A stage_seconds=()
s3="s3://$FMCLUSTER_BUCKET/fmcluster"
install -d -m 0755 "$etc" "$state" "$bundle" /var/log/fmcluster
install -d -m 0700 "$etc/secrets"

say() { echo "fmcluster-bootstrap: $*" >&2; }

# stage_done NAME: the time since the last stage ended (the first: since the user data started).
stage_done() {
  local now
  now=$(date +%s.%N)
  stage_seconds[$1]=$(awk -v a="$started" -v b="$now" 'BEGIN { printf "%.1f", b - a }')
  say "stage $1: ${stage_seconds[$1]}s"
  started=$now
}

# The address this node reaches AWS from (its primary private address): named in its report, which is filed
# under its caller identity and instance id (report_failure).
my_address() {
  local target=${AWS_ENDPOINT_URL:-http://169.254.169.254}
  target=${target#*://}
  target=${target%%[:/]*}
  ip -4 -o route get "$target" 2>/dev/null | sed -nE 's/.* src ([0-9.]+).*/\1/p'
}

# A failure before the agent runs: file a report the deploy can read, naming what could not be reached. It goes
# under this node's aws:userid ("<role id>:<role session name>"), the one prefix the node's role may write, named
# by its instance id (the instance metadata service's): fmcluster/report/<aws:userid>/<instance id>.json, so nodes
# sharing one role session (HyperPod's) never overwrite each other, and the deploy reads it for that instance. At
# first boot, where CloudFormation waits for this node (its group's CreationPolicy), the report is followed by a
# FAILURE signal, its instance id as UniqueId: the stack fails (and rolls back) now, as the agent's own FAILURE
# would, instead of when the signal Timeout runs out.
report_failure() {
  local stage=$1 message=$2 address identity="" instance=""
  address=$(my_address || true)
  say "FAILED at $stage: $message"
  printf '{"address": "%s", "ok": false, "stage": "%s", "error": %s, "finished": "%s"}\n' \
    "${address:-unknown}" "$stage" "$(printf '%s' "$message" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')" \
    "$(date -u +%FT%TZ)" >"$state/report.json"
  if ! identity=$("$s3client" whoami 2>"$state/whoami.err"); then
    identity=""
    say "cannot file the report: STS gave no caller identity: $(tail -n 1 "$state/whoami.err" 2>/dev/null)"
  elif ! instance=$("$s3client" instance-id 2>"$state/whoami.err"); then
    instance=""
    say "cannot file the report: no instance id: $(tail -n 1 "$state/whoami.err" 2>/dev/null)"
  else
    "$s3client" put "$state/report.json" "$s3/report/${identity}/${instance}.json" || true
  fi
  if [[ $mode != --fetch && -n ${FMCLUSTER_STACK:-} && -n ${FMCLUSTER_SIGNAL_RESOURCE:-} ]]; then
    local unique=$instance
    [[ -n $unique ]] || unique=$(hostname)  # no instance id: a FAILURE still fails the group now
    if "$s3client" signal "$FMCLUSTER_STACK" "$FMCLUSTER_SIGNAL_RESOURCE" "$unique" FAILURE 2>"$state/signal.err"; then
      say "signalled FAILURE to $FMCLUSTER_STACK/$FMCLUSTER_SIGNAL_RESOURCE"
    else
      say "cannot signal FAILURE to $FMCLUSTER_STACK/$FMCLUSTER_SIGNAL_RESOURCE: $(tail -n 1 "$state/signal.err" 2>/dev/null)"
    fi
  fi
  exit 1
}

# retry TRIES COMMAND...: exponential backoff (2, 4, 8 … capped at 30 s); boot-time networks come up late.
retry() {
  local tries=$1 attempt delay=2
  shift
  for ((attempt = 1; attempt <= tries; attempt++)); do
    "$@" && return 0
    ((attempt == tries)) && break
    say "'$1 ${2:-}' failed (try $attempt/$tries); retrying in ${delay}s"
    sleep "$delay"
    delay=$((delay * 2 > 30 ? 30 : delay * 2))
  done
  return 1
}

# Into a fresh directory: a copy of an emptied prefix succeeds, and must not pass for the bundle fetched before.
# Nothing of it is used until every file is what the deploy published: the SHA-256 its index lists, the index's own
# the one in the SSM parameter the deploy alone writes (fmcluster-s3 verify; a file the index does not list is
# removed). A mismatch is retried (a deploy publishing now names its new index last), then reported.
# The wheels fetched before are linked in first: the sync keeps those whose MD5 matches and fetches the rest.
fetch_bundle() {
  rm -rf "$bundle.new" && install -d -m 0755 "$bundle.new" \
    && { [[ ! -d $bundle/wheelhouse ]] || cp -al "$bundle/wheelhouse" "$bundle.new/wheelhouse"; } \
    && "$s3client" sync "$s3/bootstrap/" "$bundle.new/" 2>"$state/fetch.err" \
    && [[ -s $bundle.new/converge.env && -s $bundle.new/repo.bundle ]] \
    && "$s3client" verify "/fmcluster/$FMCLUSTER_ORG/bootstrap-index-sha256" "$s3/manifest/index.json" \
      fmcluster/bootstrap/ "$bundle.new/" 2>"$state/fetch.err"
}

if [[ $mode == --install ]]; then
  # The builder put the bundle in place: nothing is fetched, and nothing of a node's (node.env) is written.
  # shellcheck source=/dev/null
  . "$bundle/converge.env"
else
retry "$tries" fetch_bundle \
  || report_failure bundle "cannot fetch $s3/bootstrap/ (converge.env, repo.bundle) as the deploy published it: $(tail -n 2 "$state/fetch.err" 2>/dev/null)"
rm -rf "$bundle" && mv "$bundle.new" "$bundle"
# A new file renamed into place: bash is reading the running copy of this script as it goes.
install -m 0755 "$bundle/node-bootstrap.sh" /usr/local/sbin/fmcluster-bootstrap.new
mv -f /usr/local/sbin/fmcluster-bootstrap.new /usr/local/sbin/fmcluster-bootstrap
if [[ -s $bundle/fmcluster-s3 ]]; then
  install -m 0755 "$bundle/fmcluster-s3" "$s3client.new" && mv -f "$s3client.new" "$s3client"
fi
# shellcheck source=/dev/null
. "$bundle/converge.env"

# The node's own settings, for the agent and for the re-converge service the node_convergence role installs.
# The AWS endpoint and credentials are passed on only when the environment names them (the local substrate).
{
  echo "# written by fmcluster-bootstrap; rewritten at each fetch"
  for var in FMCLUSTER_BUCKET FMCLUSTER_REGION FMCLUSTER_ORG FMCLUSTER_STACK FMCLUSTER_SIGNAL_RESOURCE \
             AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN; do
    [[ -n ${!var:-} ]] && printf '%s=%q\n' "$var" "${!var}"
  done
  printf 'FMCLUSTER_REF=%s\nFMCLUSTER_PLAYBOOK=%s\n' "$FMCLUSTER_REF" "$FMCLUSTER_PLAYBOOK"
} >"$etc/node.env.tmp"
chmod 0600 "$etc/node.env.tmp"
mv "$etc/node.env.tmp" "$etc/node.env"
fi

[[ ${1:-} == --fetch ]] || stage_done fetch

# needrestart lists, never restarts, before the first apt transaction of this node: Ubuntu's server images run it
# after every apt transaction (unattended-upgrade's too), and since Ubuntu 24.04 it restarts, unasked and in
# noninteractive runs as well, every service mapping a library the transaction replaced
# (https://discourse.ubuntu.com/t/needrestart-changes-in-ubuntu-24-04-service-restarts/44671). This first boot
# runs inside cloud-final.service, which it restarts too: cloud-init's final stage gets SIGTERM while this
# script, the agent and ansible-pull run under it (https://github.com/canonical/cloud-init/issues/5109); later, a
# converge's or the security timer's apt run replacing libc would restart every daemon on the node, the node agent
# mid-converge, slurmd and Fabric Manager among them. Services pick up a replaced library when an operator
# restarts or reboots the node (docs/node-convergence.md). Harmless where needrestart is absent: only it reads
# its conf.d.
install -d -m 0755 /etc/needrestart/conf.d
printf '%s\n' "# written by fmcluster-bootstrap (fmcluster/node/boot/node-bootstrap.sh): list what to restart, restart none" \
  "\$nrconf{restart} = 'l';" >/etc/needrestart/conf.d/50-fmcluster.conf

# What the image lacks for the toolchain, from the image's own package source (on AWS the distribution's
# archive through the NAT, or the tenant's mirror; on the local substrate the VPC's package source). apt waits
# for the dpkg lock a boot-time job (unattended-upgrades, apt-daily) may hold, and those jobs are stopped first.
apt_get() { DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=l apt-get -q -o DPkg::Lock::Timeout=600 "$@"; }
missing=()
command -v git >/dev/null || missing+=(git)
python3 -c 'import venv' 2>/dev/null || missing+=(python3-venv)
# The plays' modules run with this python3 and the distribution's apt binding (fmcluster.node.agent, Mitogen).
python3 -c 'import apt_pkg' 2>/dev/null || missing+=(python3-apt)
if ((${#missing[@]})); then
  if [[ -d /run/systemd/system ]]; then
    systemctl stop apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service \
      unattended-upgrades.service 2>/dev/null || true
  fi
  say "installing from the image's package source: ${missing[*]}"
  if ! { retry 3 apt_get update >"$state/packages.log" 2>&1 \
          && apt_get install -y --no-install-recommends "${missing[@]}" >>"$state/packages.log" 2>&1; }; then
    report_failure packages "apt-get could not install ${missing[*]}: $(tail -n 2 "$state/packages.log")"
  fi
fi
[[ ${1:-} == --fetch ]] || stage_done packages

# The toolchain: kept when it holds exactly the pinned packages, else built from the bundle's wheelhouse with
# no index (the image's python3; pip itself comes from the wheelhouse). Each build goes to its own folder and
# /opt/fmcluster/venv is switched to it at once: the running agent keeps the one it started from.
toolchain_ok() {
  # shellcheck disable=SC2086 # the requirements are a space-separated list
  "$venv/bin/python" - $FMCLUSTER_NODE_REQUIREMENTS 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(0 if all(version(r.split("==")[0]) == r.split("==")[1] for r in sys.argv[1:]) else 1)
PY
}
if ! toolchain_ok; then
  pip_wheel=$(compgen -G "$bundle/wheelhouse/pip-*.whl" | head -n 1) \
    || report_failure toolchain "no toolchain in $venv and no pip wheel in the bundle's wheelhouse"
  build="$venv-$(printf '%s %s' "$(python3 -V 2>&1)" "$FMCLUSTER_NODE_REQUIREMENTS" | sha256sum | cut -c1-12)"
  rm -rf "$build"
  python3 -m venv --without-pip "$build" || report_failure toolchain "python3 -m venv failed ($(python3 -V 2>&1))"
  # shellcheck disable=SC2086 # the requirements are a space-separated list
  "$build/bin/python" "$pip_wheel/pip" install -q --no-index --no-cache-dir --disable-pip-version-check \
    --find-links "$bundle/wheelhouse" $FMCLUSTER_NODE_REQUIREMENTS >"$state/toolchain.log" 2>&1 \
    || report_failure toolchain "pip could not install $FMCLUSTER_NODE_REQUIREMENTS from the bundle's wheelhouse for $(python3 -V 2>&1): $(tail -n 2 "$state/toolchain.log")"
  [[ -L $venv || ! -e $venv ]] || rm -rf "$venv"  # a toolchain folder of an older layout
  ln -sfn "$build" "$venv.new" && mv -T -f "$venv.new" "$venv"
fi
[[ ${1:-} == --fetch ]] || stage_done toolchain
if [[ $mode == --install ]]; then
  say "install stages done (packages ${stage_seconds[packages]}s, toolchain ${stage_seconds[toolchain]}s)"
  exit 0
fi

# The pinned commit: a bare repository ansible-pull pulls from, and the agent's own checkout of it.
[[ -d $state/repo.git ]] || git init -q --bare "$state/repo.git"
git -C "$state/repo.git" fetch -q --force "$bundle/repo.bundle" "+HEAD:refs/heads/fmcluster" \
  || report_failure bundle "repo.bundle does not hold a commit"
git -C "$state/repo.git" rev-parse -q --verify "$FMCLUSTER_REF^{commit}" >/dev/null \
  || report_failure bundle "repo.bundle does not hold the pinned commit $FMCLUSTER_REF"
[[ -d $state/agent/.git ]] || git clone -q --no-checkout "$state/repo.git" "$state/agent"
git -C "$state/agent" fetch -q origin
git -C "$state/agent" checkout -q --force --detach "$FMCLUSTER_REF"

[[ ${1:-} == --fetch ]] && exit 0
stage_done commit
{
  printf '{'
  sep=
  for name in fetch packages toolchain commit; do
    printf '%s"%s": %s' "$sep" "$name" "${stage_seconds[$name]}"
    sep=', '
  done
  printf '}\n'
} >"$state/boot-stages.json"
set -a
# shellcheck source=/dev/null
. "$etc/node.env"
set +a
exec env PYTHONPATH="$state/agent/src" "$venv/bin/python" -m fmcluster.node converge --trigger first-boot
