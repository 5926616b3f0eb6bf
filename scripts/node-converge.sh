#!/usr/bin/env bash
# fmcluster node self-convergence: what EC2 user data (slurm-ec2) and HyperPod lifecycle scripts run at
# first boot, and what the re-converge timer runs afterwards. Locally, `invoke deploy` runs it on each
# namespace node, so the same path is exercised for real.
#
# It installs the pinned toolchain (once), runs ansible-pull from the tenant repository at the pinned
# ref for this node only, and leaves a status file where the controller collects it. A re-run that
# changes anything is reported as drift: after the first converge, nothing should change.
#
# Inputs (environment):
#   FMCLUSTER_REPO_URL   git URL of the tenant repository (git://, https:// or a path)
#   FMCLUSTER_REF        commit or tag to converge to (pinned: never a moving branch in production)
#   FMCLUSTER_NODE       this node's inventory name, e.g. cpu-1
#   FMCLUSTER_INVENTORY  the tenant's inventory files, space-separated (published with the deploy)
#   FMCLUSTER_PLAYBOOK   playbook inside the repository (default playbooks/node.yml)
#   FMCLUSTER_STATE_DIR  node-local state: checkout, logs (default /var/lib/fmcluster)
#   FMCLUSTER_REPORT_DIR where status files go for the controller (default $FMCLUSTER_STATE_DIR/report)
#   FMCLUSTER_VENV       Python venv holding the pinned ansible-core (created if missing)
#   FMCLUSTER_ANSIBLE_CORE pinned ansible-core version for a new venv (default 2.19.14)
set -euo pipefail

: "${FMCLUSTER_REPO_URL:?set FMCLUSTER_REPO_URL}" "${FMCLUSTER_REF:?set FMCLUSTER_REF}"
: "${FMCLUSTER_NODE:?set FMCLUSTER_NODE}" "${FMCLUSTER_INVENTORY:?set FMCLUSTER_INVENTORY}"
playbook=${FMCLUSTER_PLAYBOOK:-playbooks/node.yml}
state=${FMCLUSTER_STATE_DIR:-/var/lib/fmcluster}
report=${FMCLUSTER_REPORT_DIR:-$state/report}
venv=${FMCLUSTER_VENV:-/opt/fmcluster/venv}
checkout="$state/pull/$FMCLUSTER_NODE"
log="$state/log/pull-$FMCLUSTER_NODE.log"
mkdir -p "$(dirname "$log")" "$report" "$checkout"

# ansible-pull checks the repository out on "localhost" with the same inventory it converges with, so the
# node itself must be in it; the tenant inventory stays untouched and --limit picks this node's plays.
self_inventory="$state/pull/$FMCLUSTER_NODE.inventory.yml"
printf 'all:\n  hosts:\n    localhost:\n      ansible_connection: local\n' >"$self_inventory"
inventory_args=(--inventory "$self_inventory")
for source in $FMCLUSTER_INVENTORY; do inventory_args+=(--inventory "$source"); done

if [[ ! -x $venv/bin/ansible-pull ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "ansible-core==${FMCLUSTER_ANSIBLE_CORE:-2.19.14}"
fi

started=$(date -u +%FT%TZ)
rc=1
# Boot-time networks and mirrors come up late: retry the pull with backoff instead of failing the node.
for attempt in 1 2 3 4 5; do
  rc=0
  "$venv/bin/ansible-pull" --url "$FMCLUSTER_REPO_URL" --checkout "$FMCLUSTER_REF" --directory "$checkout" \
    --full --clean "${inventory_args[@]}" --limit "$FMCLUSTER_NODE" \
    --extra-vars ansible_connection=local "$playbook" >"$log.tmp" 2>&1 || rc=$?
  ((rc == 0)) && break
  grep -q "Unable to update repository\|Failed to .* repository\|Could not read from remote" "$log.tmp" || break
  sleep $((attempt * 2))
done
mv "$log.tmp" "$log"

recap=$(grep -E "^$FMCLUSTER_NODE +: ok=" "$log" | tail -n 1 || true)
changed=$(sed -nE 's/.*changed=([0-9]+).*/\1/p' <<<"$recap")
failed=$(sed -nE 's/.*failed=([0-9]+).*/\1/p' <<<"$recap")
# Drift: the same ref converged cleanly before, yet this run changed something (a new ref may change things).
drift=false
previous="$report/$FMCLUSTER_NODE.json"
if [[ -f $previous ]] && grep -q '"rc": 0' "$previous" && grep -q "\"ref\": \"$FMCLUSTER_REF\"" "$previous" \
    && ((${changed:-0} > 0)); then
  drift=true
fi
cat >"$report/$FMCLUSTER_NODE.json.tmp" <<JSON
{"node": "$FMCLUSTER_NODE", "ref": "$FMCLUSTER_REF", "rc": $rc, "changed": ${changed:-null},
 "failed": ${failed:-null}, "drift": $drift, "started": "$started", "finished": "$(date -u +%FT%TZ)",
 "log": "$log"}
JSON
mv "$report/$FMCLUSTER_NODE.json.tmp" "$report/$FMCLUSTER_NODE.json"
tail -n 3 "$log"
exit "$rc"
