"""Users, teams and QoS (docs/users.md): the spec keys load into the model with their defaults, and become the role
variables of user_accounts and slurm_associations exactly once, in fmcluster.users, in the shape the roles read."""

from __future__ import annotations

import base64
import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fmcluster.model import Qos, Team, Tenant, TenantInvalid, User, load_tenant
from fmcluster.users import manifest_vars, max_tres_per_user
from fmcluster.validation import reserved_accounts
from localtenant import manifest_for

ROOT = Path(__file__).resolve().parent.parent
DEMO = yaml.safe_load((ROOT / "inventories/demo/group_vars/all/tenant.yml").read_text())
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII4mUbGX38GZN2g9pN0PQcLrApTW08GexA8Qz6zdAfqf alice@laptop"
PEOPLE: dict[str, Any] = {
    "qos": [{"name": "normal", "max_gpus_per_user": 8, "max_cpus_per_user": 64, "max_nodes_per_user": 4},
            {"name": "hero", "priority": 100, "max_gpus_per_user": 64}],
    "teams": [{"name": "vision", "gid": 30011},
              {"name": "llm", "gid": 30010, "fairshare": 60, "qos": ["normal", "hero"]}],
    "users": [{"name": "carol", "uid": 20003, "teams": ["vision"], "removed": True},
              {"name": "alice", "uid": 20001, "teams": ["llm"], "ssh_keys": [ED25519]},
              {"name": "bob", "uid": 20002, "teams": ["vision", "llm"]}],
}


def tenant_with(tmp_path: Path, org: str = "acme", **sections: Any) -> Tenant:
    doc = copy.deepcopy(DEMO)
    doc["tenant"]["org"] = org
    for key in ("qos", "teams", "users"):  # the demo's own people: each test names its own
        doc["tenant"].pop(key, None)
    for key, value in sections.items():
        if value is None:
            doc["tenant"].pop(key, None)
        else:
            doc["tenant"][key] = value
    spec = tmp_path / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_tenant(org, tmp_path)


def test_the_people_sections_load_with_their_defaults(tmp_path: Path) -> None:
    tenant = tenant_with(tmp_path, **PEOPLE)
    assert tenant.qos == (Qos("normal", 0, 8, 64, 4), Qos("hero", 100, 64, None, None))
    # A team naming no QoS gets `normal`, which the tenant declares; fairshare defaults to 1.
    assert tenant.teams == (Team("vision", 30011, 1, ("normal",)), Team("llm", 30010, 60, ("normal", "hero")))
    assert tenant.users[1] == User("alice", 20001, ("llm",), (ED25519,), False)
    assert tenant.users[0].removed and tenant.users[0].ssh_keys == () and tenant.users[0].gid == 20003


def test_a_tenant_without_people_has_none_and_empty_role_variables(tmp_path: Path) -> None:
    tenant = tenant_with(tmp_path)
    assert (tenant.qos, tenant.teams, tenant.users) == ((), (), ())
    assert manifest_vars(tenant) == {
        "user_accounts_users": [], "user_accounts_groups": [], "user_accounts_home_root": "/fsx/home",
        "slurm_associations_org_account": "acme", "slurm_associations_qos": [], "slurm_associations_accounts": [],
        "slurm_associations_users": [], "slurm_associations_removed_users": []}
    # No teams: no enforcement or priority settings, so the slurm role's defaults (none) keep a cluster as it was.


def test_teams_without_a_qos_section_name_no_qos(tmp_path: Path) -> None:
    tenant = tenant_with(tmp_path, teams=[{"name": "llm", "gid": 30010}],
                         users=[{"name": "alice", "uid": 20001, "teams": ["llm"]}])
    assert tenant.teams == (Team("llm", 30010, 1, ()),)
    assert manifest_vars(tenant)["slurm_associations_accounts"] == [
        {"name": "llm", "fairshare": 1, "qos": [], "default_qos": ""}]


def test_the_role_variables_are_the_contract_the_roles_read(tmp_path: Path) -> None:
    """The exact shape user_accounts and slurm_associations consume: sorted by name, ids as numbers."""
    tenant = tenant_with(tmp_path, org="acme-lab", **PEOPLE)
    assert manifest_vars(tenant) == {
        "user_accounts_users": [
            {"name": "alice", "uid": 20001, "gid": 20001, "groups": ["llm"], "ssh_keys": [ED25519], "removed": False},
            {"name": "bob", "uid": 20002, "gid": 20002, "groups": ["vision", "llm"], "ssh_keys": [], "removed": False},
            {"name": "carol", "uid": 20003, "gid": 20003, "groups": ["vision"], "ssh_keys": [], "removed": True},
        ],
        "user_accounts_groups": [{"name": "llm", "gid": 30010}, {"name": "vision", "gid": 30011}],
        "user_accounts_home_root": "/fsx/home",
        "slurm_associations_org_account": "acme_lab",
        "slurm_associations_qos": [
            {"name": "hero", "priority": 100, "max_tres_per_user": "gres/gpu=64"},
            {"name": "normal", "priority": 0, "max_tres_per_user": "cpu=64,gres/gpu=8,node=4"},
        ],
        "slurm_associations_accounts": [
            {"name": "llm", "fairshare": 60, "qos": ["normal", "hero"], "default_qos": "normal"},
            {"name": "vision", "fairshare": 1, "qos": ["normal"], "default_qos": "normal"},
        ],
        "slurm_associations_users": [
            {"name": "alice", "accounts": ["llm"], "default_account": "llm"},
            {"name": "bob", "accounts": ["vision", "llm"], "default_account": "vision"},
        ],
        "slurm_associations_removed_users": ["carol"],
        "slurm_accounting_enforce": ["associations", "limits", "qos"],
        "slurm_priority_weights": {"Fairshare": 10000, "QOS": 10000, "Age": 1000},
    }


def test_the_org_account_is_spelled_as_the_slurm_cluster_name(tmp_path: Path) -> None:
    tenant = tenant_with(tmp_path, org="acme-lab", **PEOPLE)
    variables = manifest_for(tenant, {})["vars"]
    assert variables["slurm_associations_org_account"] == variables["slurm_cluster_name"] == "acme_lab"
    assert variables["user_accounts_users"] == manifest_vars(tenant)["user_accounts_users"]


def test_homes_are_on_the_openzfs_home_when_there_is_one(tmp_path: Path) -> None:
    storage = copy.deepcopy(DEMO["tenant"]["storage"])
    storage["openzfs"] = {"storage_capacity_gib": 128, "mount_point": "/shared/home"}
    storage["lustre"]["mount_point"] = "/lustre"
    tenant = tenant_with(tmp_path, storage=storage)
    assert manifest_vars(tenant)["user_accounts_home_root"] == "/shared/home"
    del storage["openzfs"]
    tenant = tenant_with(tmp_path, storage=storage)
    assert manifest_vars(tenant)["user_accounts_home_root"] == "/lustre/home"


@pytest.mark.parametrize("limits, expected", [
    ({}, ""), ({"max_gpus_per_user": 0}, "gres/gpu=0"), ({"max_nodes_per_user": 2, "max_cpus_per_user": 8}, "cpu=8,node=2"),
    ({"max_gpus_per_user": 8, "max_cpus_per_user": 64, "max_nodes_per_user": 4}, "cpu=64,gres/gpu=8,node=4"),
])
def test_max_tres_per_user_lists_only_the_limits_given_in_slurm_s_order(limits: dict[str, int], expected: str) -> None:
    assert max_tres_per_user(Qos("q", **limits)) == expected


def test_the_fixed_daemon_ids_are_the_ones_roles_common_makes() -> None:
    defaults = yaml.safe_load((ROOT / "roles/common/defaults/main.yml").read_text())
    _, fixed = reserved_accounts()
    assert fixed == {u["uid"]: u["name"] for u in defaults["common_system_users"]}


def test_every_account_of_this_machine_s_base_system_is_reserved() -> None:
    """Debian's base-passwd lists every account and group a stock Debian or Ubuntu system starts with."""
    names, _ = reserved_accounts()
    for master in ("passwd.master", "group.master"):
        path = Path("/usr/share/base-passwd") / master
        if not path.is_file():
            pytest.skip("base-passwd's master files are not installed")
        listed = {line.split(":")[0] for line in path.read_text().splitlines() if line and not line.startswith("#")}
        assert listed <= set(names), listed - set(names)


def test_the_demo_spec_as_shipped_still_loads(tmp_path: Path) -> None:
    """The sections are optional: every bundled tenant is valid without them."""
    done = subprocess.run([str(ROOT / ".venv/bin/python"), "-c",
                           "import sys; sys.path.insert(0, 'src'); from fmcluster.model import load_tenant; "
                           "[load_tenant(o) for o in ('demo', 'stockmark', 'neuronlab', 'pclab', 'pcdemo')]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_teams_on_a_tenant_without_slurm_accounting_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TenantInvalid) as err:
        tenant_with(tmp_path, accounting={"enabled": False}, **PEOPLE)
    keys = {p.key for p in err.value.problems}
    assert keys == {"tenant.teams", "tenant.qos"}
    assert "slurmdbd" in err.value.render() and "set accounting.enabled: true" in err.value.render()


def _distinct_ed25519_keys(count: int) -> list[str]:
    """`count` different valid ed25519 public keys (points of the curve, not of small order): one key is one person."""
    from fmcluster.sshkeys import ed25519_problem

    keys: list[str] = []
    y = 2
    while len(keys) < count:
        point = y.to_bytes(32, "little")
        y += 1
        if ed25519_problem(point) is None:
            blob = b"".join(len(p).to_bytes(4, "big") + p for p in (b"ssh-ed25519", point))
            keys.append(f"ssh-ed25519 {base64.b64encode(blob).decode()} user{len(keys)}@laptop")
    return keys


def test_a_thousand_users_the_schema_allows_load_within_the_loader_s_limits(tmp_path: Path) -> None:
    teams = [{"name": f"team{i}", "gid": 30000 + i} for i in range(100)]
    users = [{"name": f"user{i}", "uid": 10000 + i, "teams": [f"team{i % 100}", f"team{(i + 1) % 100}"],
              "ssh_keys": [key], "removed": False} for i, key in enumerate(_distinct_ed25519_keys(1000))]
    tenant = tenant_with(tmp_path, qos=PEOPLE["qos"], teams=teams, users=users)
    assert len(tenant.users) == 1000 and len(manifest_vars(tenant)["slurm_associations_users"]) == 1000
