"""The directory variant (docs/users.md): `directory:` loads into the model, becomes the sssd_client role's
variables exactly once (fmcluster.users), its bind password a node secret; the local substrate's demo directory
(fmcluster.providers.local.directory) is generated LDIF and a slapd.conf, checked here without a server
(tests/test_directory_sssd.py runs the real slapd and SSSD)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fmcluster.accounting import secret_roles
from fmcluster.model import Directory, Tenant, load_tenant
from fmcluster.providers.local.directory import Person, demo_ldif, demo_people, slapd_conf
from fmcluster.providers.local.hosts import SubstrateError
from fmcluster.users import manifest_secrets, manifest_vars, sssd_vars

ROOT = Path(__file__).resolve().parent.parent
DEMO = yaml.safe_load((ROOT / "inventories/demo/group_vars/all/tenant.yml").read_text())
# A real self-signed certificate (openssl req -x509, P-256): validation reads its DER structure.
CA = (ROOT / "tests/fixtures/directory/test-ca.pem").read_text()
FULL = {"uri": "ldaps://ldap.example.org", "base_dn": "dc=example,dc=org", "bind_dn": "cn=reader,dc=example,dc=org",
        "bind_password_secret": "ldap-bind-password", "ca_cert": "ldap-ca.pem",
        "user_search_base": "ou=people,dc=example,dc=org", "group_filter": "(objectClass=posixGroup)"}


def tenant_with(tmp_path: Path, directory: dict[str, Any] | None) -> Tenant:
    doc = copy.deepcopy(DEMO)
    doc["tenant"]["org"] = "acme"
    doc["tenant"].pop("users", None)
    doc["tenant"]["teams"] = [{"name": "vision", "gid": 30011}, {"name": "llm", "gid": 30010}]
    doc["tenant"].pop("qos", None)
    if directory is not None:
        doc["tenant"]["directory"] = directory
    spec = tmp_path / "inventories" / "acme" / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    (spec.parent / "ldap-ca.pem").write_text(CA)
    return load_tenant("acme", tmp_path)


def test_a_directory_loads_with_its_defaults(tmp_path: Path) -> None:
    tenant = tenant_with(tmp_path, {"uri": "ldaps://ldap.example.org", "base_dn": "dc=example,dc=org"})
    assert tenant.directory == Directory("ldaps://ldap.example.org", "dc=example,dc=org")
    assert tenant_with(tmp_path, None).directory is None


def test_the_sssd_variables_are_the_contract_the_role_reads(tmp_path: Path) -> None:
    tenant = tenant_with(tmp_path, FULL)
    values = manifest_vars(tenant)
    assert {k: v for k, v in values.items() if k.startswith("sssd_client_")} == {
        "sssd_client_enabled": True, "sssd_client_domain": "acme", "sssd_client_uri": "ldaps://ldap.example.org",
        "sssd_client_start_tls": False, "sssd_client_search_base": "dc=example,dc=org",
        "sssd_client_user_search_base": "ou=people,dc=example,dc=org", "sssd_client_group_search_base": "",
        "sssd_client_bind_dn": "cn=reader,dc=example,dc=org",
        "sssd_client_bind_password_file": "/etc/fmcluster/secrets/ldap-bind-password",
        "sssd_client_ca_cert": CA, "sssd_client_access_filter": "", "sssd_client_group_filter": "(objectClass=posixGroup)",
        "sssd_client_home_root": "/fsx/home", "sssd_client_min_id": 1001, "sssd_client_max_id": 59999}
    # The directory has the teams' groups: no local group shadows them; the Slurm accounts stay.
    assert values["user_accounts_groups"] == [] and values["user_accounts_users"] == []
    assert [a["name"] for a in values["slurm_associations_accounts"]] == ["llm", "vision"]


def test_without_a_directory_no_sssd_variable_is_set_and_the_teams_are_local_groups(tmp_path: Path) -> None:
    values = manifest_vars(tenant_with(tmp_path, None))
    assert not [k for k in values if k.startswith("sssd_client_")]
    assert values["user_accounts_groups"] == [{"name": "llm", "gid": 30010}, {"name": "vision", "gid": 30011}]


def test_the_bind_password_is_a_secret_every_node_reads_and_no_value_is_in_the_manifest(tmp_path: Path) -> None:
    tenant = tenant_with(tmp_path, FULL)
    assert manifest_secrets(tenant) == {"ldap-bind-password": ("controller", "login", "compute")}
    assert secret_roles(tenant)["ldap-bind-password"] == ("controller", "login", "compute")
    # Each node role's IAM policy grants the secret (the stacks read the same list).
    from fmcluster.stacks.templates.common import secrets_of

    assert all("ldap-bind-password" in secrets_of(tenant, [role]) for role in ("controller", "login", "compute"))
    anonymous = tenant_with(tmp_path, {"uri": "ldaps://ldap.example.org", "base_dn": "dc=example,dc=org"})
    assert manifest_secrets(anonymous) == {} and "ldap-bind-password" not in secret_roles(anonymous)


def test_a_directory_without_a_bind_account_reads_anonymously_with_the_system_ca() -> None:
    values = sssd_vars(Directory("ldap://ldap.example.org", "o=acme", start_tls=True), "acme", "/home")
    assert (values["sssd_client_bind_dn"], values["sssd_client_bind_password_file"], values["sssd_client_ca_cert"]) == \
        ("", "", "")
    assert values["sssd_client_start_tls"] is True


# --- the local substrate's demo directory ---------------------------------------------------------------------

def test_the_demo_people_take_the_lowest_ids_no_team_has_and_one_team_each() -> None:
    assert demo_people([("llm", 20001), ("vision", 20003)]) == (
        Person("alice", 20002, ("llm",)), Person("bob", 20004, ("vision",)))
    assert demo_people([("llm", 30010)]) == (Person("alice", 20001, ("llm",)), Person("bob", 20002, ("llm",)))
    assert demo_people([]) == (Person("alice", 20001, ()), Person("bob", 20002, ()))


def entries(ldif: str) -> dict[str, dict[str, list[str]]]:
    found: dict[str, dict[str, list[str]]] = {}
    for block in ldif.split("\n\n"):
        lines = [line for line in block.splitlines() if line and not line.startswith("#")]
        attributes: dict[str, list[str]] = {}
        for line in lines:
            key, _, value = line.partition(": ")
            attributes.setdefault(key, []).append(value)
        if attributes:  # the header comment is a block of its own
            found[attributes["dn"][0]] = attributes
    return found


def test_the_demo_ldif_has_people_their_private_groups_and_the_teams_with_members() -> None:
    people = demo_people([("llm", 30010), ("vision", 30011)])
    tree = entries(demo_ldif("dc=example,dc=org", [("vision", 30011), ("llm", 30010)], people, "/fsx/home/"))
    assert tree["dc=example,dc=org"]["objectClass"] == ["top", "dcObject", "organization"]
    alice = tree["uid=alice,ou=people,dc=example,dc=org"]
    assert (alice["uidNumber"], alice["gidNumber"], alice["homeDirectory"]) == (["20001"], ["20001"], ["/fsx/home/alice"])
    assert "posixAccount" in alice["objectClass"]
    assert tree["cn=alice,ou=groups,dc=example,dc=org"]["gidNumber"] == ["20001"]
    assert tree["cn=llm,ou=groups,dc=example,dc=org"]["memberUid"] == ["alice"]
    assert tree["cn=vision,ou=groups,dc=example,dc=org"]["memberUid"] == ["bob"]
    assert list(tree)[:3] == ["dc=example,dc=org", "ou=people,dc=example,dc=org", "ou=groups,dc=example,dc=org"]


@pytest.mark.parametrize(("base", "classes"), [("o=acme", ["top", "organization"]),
                                               ("ou=hpc,dc=acme,dc=org", ["top", "organizationalUnit"])])
def test_the_base_entry_follows_the_base_dn_s_first_attribute(base: str, classes: list[str]) -> None:
    assert entries(demo_ldif(base, [], (), "/home"))[base]["objectClass"] == classes


def test_a_base_dn_the_demo_cannot_make_is_refused_with_the_fix() -> None:
    with pytest.raises(SubstrateError, match="must be dc=, o= or ou="):
        demo_ldif("cn=acme,dc=org", [], (), "/home")


def test_slapd_serves_one_database_under_the_substrate_folder_hiding_passwords(tmp_path: Path) -> None:
    conf = slapd_conf(tmp_path, "dc=example,dc=org")
    assert f"directory {tmp_path}/data" in conf and 'suffix "dc=example,dc=org"' in conf
    assert f"TLSCertificateFile {tmp_path}/server.pem" in conf
    assert conf.index("access to attrs=userPassword by * none") < conf.index("access to * by * read")
    assert "include /etc/ldap/schema/nis.schema" in conf


def test_the_local_provider_points_the_nodes_at_its_stand_in_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On provider local the substrate's slapd (TLS on the router address, its own CA) stands in for the spec's
    uri, and its demo people get their teams' Slurm associations; the spec's other settings stay."""
    from fmcluster.providers.local import LocalProvider

    monkeypatch.setenv("FMCLUSTER_SUBSTRATE_ROOT", str(tmp_path / "substrate"))
    tenant = tenant_with(tmp_path, {"uri": "ldaps://ldap.example.org", "base_dn": "dc=example,dc=org"})
    values = LocalProvider(tenant).manifest_vars()
    router = LocalProvider(tenant).router
    assert values["sssd_client_uri"] == f"ldaps://{router}:636" and values["sssd_client_start_tls"] is False
    assert values["sssd_client_ca_cert"].startswith("-----BEGIN CERTIFICATE-----")
    assert values["sssd_client_ca_cert"] == (tmp_path / "substrate" / "acme" / "directory" / "ca.pem").read_text()
    assert values["slurm_associations_users"] == [{"name": "alice", "accounts": ["vision"], "default_account": "vision"},
                                                  {"name": "bob", "accounts": ["llm"], "default_account": "llm"}]
    # The same CA the next time (made once), so a second deploy changes no node.
    assert LocalProvider(tenant).manifest_vars()["sssd_client_ca_cert"] == values["sssd_client_ca_cert"]
    plain = LocalProvider(tenant_with(tmp_path, None)).manifest_vars()
    assert not [k for k in plain if k.startswith(("sssd_client_", "slurm_associations_"))]
