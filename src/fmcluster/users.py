"""The people part of the manifest: tenant `users`, `teams` and `qos` → role variables, assembled once here.

    user_accounts_*         the user_accounts role, on every node: unix groups of the teams, users with their
                            fixed uid (private group gid = uid), team groups, ssh keys; removed users locked
    slurm_associations_*    the slurm_associations role, on the controller through sacctmgr: the org's account,
                            one account per team under it, QoS with their per-user limits, users' associations
    sssd_client_*           the sssd_client role, on every node, with `directory:`: SSSD joined to the tenant's
                            LDAP directory, so people, uids and groups come from it (user_accounts then makes
                            no team group: the directory has them)

Every list is sorted by name, and empty when the tenant has none, so the roles never test for a missing key.
docs/users.md describes what the roles do with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fmcluster.manifest import NODE_SECRETS_DIR
from fmcluster.validation import MAX_ID, MIN_ID, image_ids

if TYPE_CHECKING:
    from fmcluster.model import Directory, Qos, Tenant

#: priority/multifactor weights with teams: fair share and QoS first, then how long a job has waited.
PRIORITY_WEIGHTS = {"Fairshare": 10000, "QOS": 10000, "Age": 1000}
#: Where homes live when the tenant has no OpenZFS home: a folder of the Lustre file system.
LUSTRE_HOME = "home"
#: Every node joins the directory, so every node reads its bind password.
DIRECTORY_SECRET_ROLES = ("controller", "login", "compute")


def home_root(tenant: Tenant) -> str:
    """The folder users' homes are made in: the OpenZFS home's mount point, else <lustre mount point>/home
    (the same file systems fmcluster.publish.shared_storage mounts on every node)."""
    zfs = tenant.storage.openzfs
    if zfs is not None:
        return zfs.mount_point
    return f"{tenant.storage.lustre.mount_point.rstrip('/')}/{LUSTRE_HOME}"


def org_account(tenant: Tenant) -> str:
    """The org's Slurm account, the parent of every team's: its name as slurm_cluster_name spells it."""
    return tenant.org.replace("-", "_")


def max_tres_per_user(qos: Qos) -> str:
    """Slurm's MaxTRESPerUser of a QoS (sacctmgr's `cpu=64,gres/gpu=8,node=4`): only the limits given, in that
    order; "" when it has none."""
    limits = (("cpu", qos.max_cpus_per_user), ("gres/gpu", qos.max_gpus_per_user), ("node", qos.max_nodes_per_user))
    return ",".join(f"{tres}={count}" for tres, count in limits if count is not None)


def manifest_secrets(tenant: Tenant) -> dict[str, tuple[str, ...]]:
    """Secrets the node agent reads for the directory (name → roles): bind_dn's password, when one is named."""
    directory = tenant.directory
    if directory is None or directory.bind_password_secret is None:
        return {}
    return {directory.bind_password_secret: DIRECTORY_SECRET_ROLES}


def directory_id_range() -> tuple[int, int]:
    """The ids a node takes from the directory: the range a tenant's users and teams may have (validation's
    MIN_ID..MAX_ID), less the images' own ids at its bottom (1000, the default user's)."""
    low, taken = MIN_ID, image_ids()
    while low in taken:
        low += 1
    return low, MAX_ID


def sssd_vars(directory: Directory | None, org: str, home_root: str) -> dict[str, Any]:
    """The sssd_client role's variables (roles/sssd_client/defaults/main.yml says what each does); none without a
    directory (the role's default sssd_client_enabled is false)."""
    if directory is None:
        return {}
    return {
        "sssd_client_enabled": True,
        "sssd_client_domain": org,
        "sssd_client_uri": directory.uri,
        "sssd_client_start_tls": directory.start_tls,
        "sssd_client_search_base": directory.base_dn,
        "sssd_client_user_search_base": directory.user_search_base or "",
        "sssd_client_group_search_base": directory.group_search_base or "",
        "sssd_client_bind_dn": directory.bind_dn or "",
        "sssd_client_bind_password_file": (f"{NODE_SECRETS_DIR}/{directory.bind_password_secret}"
                                           if directory.bind_password_secret else ""),
        "sssd_client_ca_cert": directory.ca_cert_pem,
        "sssd_client_access_filter": directory.user_filter or "",
        "sssd_client_group_filter": directory.group_filter or "",
        # Homes on the shared file system whatever homeDirectory the directory gives, as for `users:`.
        "sssd_client_home_root": home_root,
        # Directory entries outside the tenant's id range (0, 27 = sudo, 1000 = ubuntu...) are ignored on every node.
        "sssd_client_min_id": directory_id_range()[0], "sssd_client_max_id": directory_id_range()[1],
    }


def manifest_vars(tenant: Tenant) -> dict[str, Any]:
    users = sorted(tenant.users, key=lambda u: u.name)
    teams = sorted(tenant.teams, key=lambda t: t.name)
    return {
        **sssd_vars(tenant.directory, tenant.org, home_root(tenant)),
        "user_accounts_users": [
            {"name": u.name, "uid": u.uid, "gid": u.gid, "groups": list(u.teams), "ssh_keys": list(u.ssh_keys),
             "removed": u.removed} for u in users],
        # With a directory the teams' groups are the directory's: a local group of the same name would shadow it.
        "user_accounts_groups": [] if tenant.directory else [{"name": t.name, "gid": t.gid} for t in teams],
        "user_accounts_home_root": home_root(tenant),
        "slurm_associations_org_account": org_account(tenant),
        "slurm_associations_qos": [
            {"name": q.name, "priority": q.priority, "max_tres_per_user": max_tres_per_user(q)}
            for q in sorted(tenant.qos, key=lambda q: q.name)],
        "slurm_associations_accounts": [
            {"name": t.name, "fairshare": t.fairshare, "qos": list(t.qos), "default_qos": t.qos[0] if t.qos else ""}
            for t in teams],
        "slurm_associations_users": [
            {"name": u.name, "accounts": list(u.teams), "default_account": u.teams[0]} for u in users if not u.removed],
        "slurm_associations_removed_users": [u.name for u in users if u.removed],
        # With teams, a job needs its user in a team's account and stays within its QoS; pending jobs are ordered
        # by the teams' fair share and their QoS priority (the slurm role's slurm.conf settings). Without, the
        # slurm role's defaults: nothing enforced, Slurm's default priority.
        **({"slurm_accounting_enforce": ["associations", "limits", "qos"],
            "slurm_priority_weights": PRIORITY_WEIGHTS} if teams else {}),
    }
