"""Security, third round (issue 42): the spec surface added last round (users, teams, QoS, directory, alert
receivers, capacity, accounting) and the log readers. Each hostile input is refused with its exact reason, the file,
the line, the key and a fix; never a traceback, never a hang, never a wrong accept.

Classes: image accounts and their ids as people; the org as Slurm's root account; QoS limits that block every job;
one key for two people; RSA and ed25519 keys no private key has; LDAP DNs and filters (parsed: no `?`, exactly one
balanced filter); directory secrets named as fmcluster's own files; CA files through links, not DER, or huge; alert
targets inside the host, the VPC or the cluster (numeric host forms included); one reservation for two instance
types; ssh ingress with no login node; accounting beside ParallelCluster's, as a database administrator; non-ASCII
version digits; new-tenant without a template; log readers' bounds (bombs, sparse files) and their one escape.
"""

from __future__ import annotations

import base64
import bz2
import gzip
import inspect
import lzma
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from invoke import Context, Exit

from fmcluster import commands
from fmcluster.cli import main as cli_main
from fmcluster.escape import neutral
from fmcluster.model import load_tenant
from fmcluster.scaffold import NewTenantInvalid, new_tenant
from fmcluster.sshkeys import ed25519_problem
from fmcluster.validation import CLUSTER_PORTS, image_ids, reserved_accounts, reserved_data
from hostile_helpers import ROOT, assert_refused, spec_text, validate, write_tenant
from test_hostile_cli import ORG_TASKS, TASKS, _snapshot

Change = Callable[[dict[str, Any]], Any]
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII4mUbGX38GZN2g9pN0PQcLrApTW08GexA8Qz6zdAfqf alice@laptop"
# A real self-signed certificate (openssl req -x509, P-256).
CA = ("-----BEGIN CERTIFICATE-----\n"
      "MIIBjjCCATWgAwIBAgIUKkaZXwQitSbPEfN8RipPCGVzmy0wCgYIKoZIzj0EAwIw\n"
      "HDEaMBgGA1UEAwwRZm1jbHVzdGVyIHRlc3QgQ0EwIBcNMjYxMjA1MDgyODAxWhgP\n"
      "MjEyNjExMTEwODI4MDFaMBwxGjAYBgNVBAMMEWZtY2x1c3RlciB0ZXN0IENBMFkw\n"
      "EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEbXjrKAcGYT5/PdQCiaUYc+7YYXAsFCqP\n"
      "80eJsZcxJhIpiJseV+Ds+lH4hUlqLHisPTkUwo6fLIjFVGpHVsV6QaNTMFEwHQYD\n"
      "VR0OBBYEFLRKyB6oBFEIvs8CMIT5C6/BJ9r2MB8GA1UdIwQYMBaAFLRKyB6oBFEI\n"
      "vs8CMIT5C6/BJ9r2MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIg\n"
      "Z7fYnoMK8FhXlp1P9k6x6utlNruBWmSH6YEyYyi76xACICmLr3sSUuJ9rYboAWiQ\n"
      "0VcQt12I4XJtZsqFFgSO0owl\n"
      "-----END CERTIFICATE-----\n")
CA_DER = base64.b64decode("".join(CA.splitlines()[1:-1]))


def wire(*parts: bytes) -> str:
    return base64.b64encode(b"".join(len(p).to_bytes(4, "big") + p for p in parts)).decode()


def people(users: list[dict[str, Any]] | None = None, teams: list[dict[str, Any]] | None = None,
           qos: list[dict[str, Any]] | None = None) -> Change:
    """The demo spec with QoS normal, team llm (gid 30010) and user alice (20001), then the given sections."""
    def change(t: dict[str, Any]) -> None:
        t["qos"] = [{"name": "normal"}] if qos is None else qos
        t["teams"] = [{"name": "llm", "gid": 30010}] if teams is None else teams
        t["users"] = [{"name": "alice", "uid": 20001, "teams": ["llm"], "ssh_keys": [ED25519]}] if users is None else users
    return change


def user(**fields: Any) -> dict[str, Any]:
    return {"name": "bob", "uid": 20002, "teams": ["llm"], **fields}


def refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, key: str, *fragments: str) -> str:
    write_tenant(tmp_path, text)
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, key, fragments)
    return output


def accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    write_tenant(tmp_path, text)
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output


U = "tenant.users"


# --- 1. image accounts and the images' default user id ---------------------------------------------------------

IMAGE_ACCOUNTS = sorted(name for name, section in reserved_accounts()[0].items() if section == "gpu_and_aws_images")


def test_the_issue_s_image_accounts_are_reserved_with_a_source() -> None:
    data = reserved_data()
    assert {"nvidia-persistenced", "ec2-instance-connect", "pcluster-admin", "ubuntu"} <= set(IMAGE_ACCOUNTS)
    assert all(isinstance(source, str) and len(source) > 20 for source in data["gpu_and_aws_images"].values())
    assert image_ids() == {1000: data["image_ids"][1000]}


@pytest.mark.parametrize("name", IMAGE_ACCOUNTS)
def test_an_image_account_as_a_user_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    source = reserved_data()["gpu_and_aws_images"][name]
    refused(tmp_path, monkeypatch, spec_text(people(users=[user(name=name)])), f"{U}[0].name",
            f"'{name}' is reserved: it is an account the GPU and AWS images already have ({source})",
            "fix: choose another user name")


@pytest.mark.parametrize("name", [n for n in IMAGE_ACCOUNTS if "-" not in n])
def test_an_image_account_as_a_team_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    change = people(teams=[{"name": name, "gid": 30011}, {"name": "llm", "gid": 30010}])
    refused(tmp_path, monkeypatch, spec_text(change), "tenant.teams[0].name",
            f"'{name}' is reserved: it is an account the GPU and AWS images already have")


@pytest.mark.parametrize(("change", "key"), [
    (people(users=[user(uid=1000)]), f"{U}[0].uid"),
    (people(teams=[{"name": "vision", "gid": 1000}, {"name": "llm", "gid": 30010}]), "tenant.teams[0].gid"),
], ids=["uid-1000", "gid-1000"])
def test_the_images_default_user_id_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Change,
                                               key: str) -> None:
    refused(tmp_path, monkeypatch, spec_text(change), key,
            "1000 is the id of the images' default user (ubuntu on Ubuntu images, admin on Debian's, ec2-user on "
            "Amazon Linux) on every node", "fix: use an id from 1001 to 59999")


def test_uid_1001_is_a_person_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    accepted(tmp_path, monkeypatch, spec_text(people(users=[user(uid=1001)])))


# --- 2. the org as Slurm's root account ------------------------------------------------------------------------

def test_an_org_named_root_is_refused_in_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = spec_text(lambda t: t.update(org="root"))
    refused(tmp_path, monkeypatch, text, "tenant.org", "'root' is Slurm's root account",
            "the associations planner would remove accounts and users under it", "fix: name the organization otherwise")


def test_an_org_named_root_is_refused_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    lines: list[str] = []
    assert commands.validate("root", out=lines.append) == 2
    assert "'root' is Slurm's root account" in "\n".join(lines) and "Traceback" not in "\n".join(lines)
    with pytest.raises(NewTenantInvalid, match="Slurm's root account"):
        new_tenant("root", {}, output_dir=tmp_path / "inventories")
    assert not (tmp_path / "inventories" / "root").exists()


@pytest.mark.parametrize("task", ORG_TASKS)
def test_every_task_refuses_the_org_root(task: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "inventories" / "root" / "group_vars" / "all").mkdir(parents=True)
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    before = _snapshot(tmp_path)
    body = getattr(TASKS, task).body
    required = {"cmd": "sinfo", "node": "ip-10-0-128-10"}
    kwargs: dict[str, Any] = {k: v for k, v in required.items() if k in inspect.signature(body).parameters}
    with pytest.raises((Exit, SystemExit)) as raised:
        body(Context(), org="root", **({"output_dir": str(tmp_path / "inventories")} if task == "new_tenant" else {}),
             **kwargs)
    code = raised.value.code
    captured = capsys.readouterr()
    message = captured.out + captured.err + str(getattr(raised.value, "message", "") or "")
    assert code == 2 and "'root' is Slurm's root account" in message and "fix:" in message, message
    assert "Traceback" not in message and _snapshot(tmp_path) == before


# --- 3. QoS limits that let no job run -------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -1])
def test_max_cpus_per_user_below_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: int) -> None:
    refused(tmp_path, monkeypatch, spec_text(people(qos=[{"name": "normal", "max_cpus_per_user": value}])),
            "tenant.qos[0].max_cpus_per_user", f"{value} is out of range", "fix: use a whole number from 1 to 1000000",
            "0 would let no job of the QoS run")


def test_max_gpus_per_user_zero_stays_a_cpu_only_qos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    accepted(tmp_path, monkeypatch, spec_text(people(qos=[{"name": "normal", "max_gpus_per_user": 0,
                                                           "max_cpus_per_user": 1}])))


# --- 4. one key for two people ---------------------------------------------------------------------------------

ED_BLOB = ED25519.split()[1]
SHARED_KEYS = [
    ("same-line", ED25519),
    ("other-comment", f"ssh-ed25519 {ED_BLOB} bob@desktop"),
    ("no-comment", f"ssh-ed25519 {ED_BLOB}"),
    ("extra-spaces", f"ssh-ed25519   {ED_BLOB}   x"),
]


@pytest.mark.parametrize(("label", "key"), SHARED_KEYS, ids=[k[0] for k in SHARED_KEYS])
def test_one_key_for_two_users_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str, key: str) -> None:
    refused(tmp_path, monkeypatch, spec_text(people(users=[
        {"name": "alice", "uid": 20001, "teams": ["llm"], "ssh_keys": [ED25519]}, user(ssh_keys=[key])])),
        f"{U}[1].ssh_keys[0]", "the same key as users[0].ssh_keys[0] ('alice'): whoever holds its private key would "
        "log in as both", "fix: give every person a key pair of their own")


def test_a_shared_key_spelled_with_other_base64_padding_bits_is_refused(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    key = "ssh-rsa " + wire(b"ssh-rsa", b"\x01\x00\x00\x01", b"\x00" + ((1 << 2047) + 0x2D3).to_bytes(256, "big"))
    data = key.split()[1]
    assert data.endswith("==")
    respelled = data[:-3] + chr(ord(data[-3]) + 1) + "=="  # a spare bit set: the same bytes to every decoder
    assert base64.b64decode(respelled) == base64.b64decode(data) and respelled != data
    refused(tmp_path, monkeypatch, spec_text(people(users=[
        {"name": "alice", "uid": 20001, "teams": ["llm"], "ssh_keys": [key]}, user(ssh_keys=[f"ssh-rsa {respelled} b"])])),
        f"{U}[1].ssh_keys[0]", "the same key as users[0].ssh_keys[0] ('alice')")


def test_a_shared_key_in_a_later_position_is_named_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = wire(b"ssh-ed25519", (9).to_bytes(32, "little"))
    assert ed25519_problem((9).to_bytes(32, "little")) is None
    refused(tmp_path, monkeypatch, spec_text(people(users=[
        {"name": "alice", "uid": 20001, "teams": ["llm"], "ssh_keys": [f"ssh-ed25519 {other} a", ED25519]},
        user(ssh_keys=[ED25519])])), f"{U}[1].ssh_keys[0]", "the same key as users[0].ssh_keys[1] ('alice')")


# --- 5. keys no private key has --------------------------------------------------------------------------------

N_2048 = (1 << 2047) + 0x2D3  # odd, 2048 bits
N_2048_BYTES = b"\x00" + N_2048.to_bytes(256, "big")


def rsa(e: bytes, n: bytes = N_2048_BYTES) -> str:
    return "ssh-rsa " + wire(b"ssh-rsa", e, n)


def ed(point: bytes, kind: str = "ssh-ed25519") -> str:
    extra = (b"ssh:",) if kind.startswith("sk-") else ()
    return f"{kind} " + wire(kind.encode(), point, *extra)


BAD_KEYS = [
    ("rsa-e0", rsa(b""), "the RSA key has public exponent 0"),
    ("rsa-e0-byte", rsa(b"\x00"), "a exponent with a needless leading zero byte"),
    ("rsa-e1", rsa(b"\x01"), "the RSA key has public exponent 1"),
    ("rsa-e2", rsa(b"\x02"), "the RSA key has public exponent 2 (at least 3 is needed; ssh-keygen uses 65537)"),
    ("rsa-e4", rsa(b"\x04"), "the RSA key has an even public exponent (4)"),
    ("rsa-e65536", rsa(b"\x01\x00\x00"), "the RSA key has an even public exponent (65536)"),
    ("rsa-even-modulus", rsa(b"\x01\x00\x01", b"\x00" + (N_2048 - 1).to_bytes(256, "big")), "has an even modulus"),
    ("rsa-negative-modulus", rsa(b"\x01\x00\x01", N_2048.to_bytes(256, "big")), "has a negative modulus"),
    ("rsa-negative-exponent", rsa(b"\x81"), "has a negative exponent"),
    ("rsa-padded-exponent", rsa(b"\x00\x01\x00\x01"), "a exponent with a needless leading zero byte"),
    ("rsa-e-over-n", rsa(b"\x00" + (N_2048 + 2).to_bytes(256, "big")), "has a public exponent as large as its modulus"),
    ("ed-all-zero", ed(bytes(32)), "the ed25519 key is a point of small order (all zero)"),
    ("ed-identity", ed((1).to_bytes(32, "little")), "the ed25519 key is a point of small order (a known weak key)"),
    ("ed-order-2", ed(((1 << 255) - 20).to_bytes(32, "little")), "point of small order"),
    ("ed-order-4", ed(bytes(31) + b"\x80"), "point of small order"),
    ("ed-order-8a", ed(bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a")),
     "point of small order"),
    ("ed-order-8b", ed(bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa")),
     "point of small order"),
    ("ed-order-8c", ed(bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05")),
     "point of small order"),
    ("ed-order-8d", ed(bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85")),
     "point of small order"),
    ("ed-y-equals-p", ed(((1 << 255) - 19).to_bytes(32, "little")), "not a canonical point encoding"),
    ("ed-all-ones", ed(b"\xff" * 32), "not a canonical point encoding"),
    ("ed-off-curve", ed((2).to_bytes(32, "little")), "the ed25519 key is not a point of the curve"),
    ("ed-x0-sign", ed((1).to_bytes(32, "little")[:31] + b"\x80"), "x = 0 with the sign bit set"),
    ("sk-ed-all-zero", ed(bytes(32), "sk-ssh-ed25519@openssh.com"), "point of small order (all zero)"),
]


@pytest.mark.parametrize(("label", "key", "why"), BAD_KEYS, ids=[k[0] for k in BAD_KEYS])
def test_a_key_no_private_key_has_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str, key: str,
                                             why: str) -> None:
    refused(tmp_path, monkeypatch, spec_text(people(users=[user(ssh_keys=[key])])), f"{U}[0].ssh_keys[0]", why,
            "fix: make a new key")


def test_a_sane_rsa_key_of_the_same_shape_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    accepted(tmp_path, monkeypatch, spec_text(people(users=[user(ssh_keys=[rsa(b"\x01\x00\x01")])])))


# --- 6. LDAP DNs and filters, parsed --------------------------------------------------------------------------

D = "tenant.directory"


# The demo spec with a valid directory and `fields` (the directory suite's own builder).
from test_hostile_directory import directory  # noqa: E402


DN_KEYS = ["base_dn", "user_search_base", "group_search_base", "bind_dn"]
BAD_DNS = [
    ("scope", "ou=people,dc=example,dc=org?sub", "has '?' at character 28"),
    ("scope-and-filter", "ou=people,dc=example,dc=org?subtree?(uid=*)", "has '?' at character 28"),
    ("second-base", "dc=example,dc=org??(x=1)?ou=admins,dc=example,dc=org", "has '?' at character 18"),
    ("trailing-space", "ou=people ,dc=example,dc=org", "RDN 1 ('ou=people ') has a value with a leading or trailing space"),
    ("leading-space", "ou= people,dc=example,dc=org", "RDN 1 ('ou= people') has a value with a leading or trailing space"),
]


@pytest.mark.parametrize(("label", "value", "why"), BAD_DNS, ids=[d[0] for d in BAD_DNS])
@pytest.mark.parametrize("key", DN_KEYS)
def test_a_dn_that_is_not_one_dn_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, label: str,
                                            value: str, why: str) -> None:
    extra = {"bind_password_secret": "ldap-bind-password"} if key == "bind_dn" else {}
    refused(tmp_path, monkeypatch, spec_text(directory(**{key: value}, **extra)), f"{D}.{key}",
            f"is not a distinguished name: it {why}", "fix: write a DN of attribute=value pairs")


FILTER_KEYS = ["user_filter", "group_filter"]
BAD_FILTERS = [
    ("empty", "", "is empty"),
    ("empty-parens", "()", "expected an attribute type at character 2"),
    ("two-filters", "(a=b)(c=d)", "has text after the first filter, at character 6"),
    ("and-of-nothing", "(&)", "'&' needs at least one filter after it"),
    ("or-of-nothing", "(|)", "'|' needs at least one filter after it"),
    ("not-of-nothing", "(!)", "expected '(' to start a filter at character 3"),
    ("unclosed", "(a=b", "expected ')' to close the filter at character 5"),
    ("double-parens", "((a=b))", "expected an attribute type at character 2"),
    ("extra-close", "(a=b))", "has text after the first filter, at character 6"),
    ("question-mark", "(a=b?x)", "has '?' at character 5"),
    ("second-search-base", "(objectClass=posixGroup)?ou=admins,dc=example,dc=org?subtree?(a=b)", "has '?' at character 25"),
    ("wildcard-in-ordering", "(uidNumber>=*)", "has '*' in a value that takes no wildcard"),
    ("paren-in-value", "(cn=a(b)", "has '(' inside a value"),
    ("bad-escape", "(cn=a\\zz)", "has a '\\' that is not followed by two hex digits at character 6"),
    ("no-parens", "objectClass=posixGroup", "expected '(' to start a filter at character 1"),
    ("leading-space", " (a=b)", "expected '(' to start a filter at character 1"),
    ("no-attribute", "(=b)", "expected an attribute type at character 2"),
    ("space-in-attribute", "(a b=c)", "expected '=', '~=', '>=' or '<=' after the attribute type"),
    ("too-deep", "(!" * 40 + "(a=b)" + ")" * 40, "nests deeper than 32 filters"),
    ("and-then-garbage", "(&(a=b)(c=d))x", "has text after the first filter, at character 14"),
]


@pytest.mark.parametrize(("label", "value", "why"), BAD_FILTERS, ids=[f[0] for f in BAD_FILTERS])
@pytest.mark.parametrize("key", FILTER_KEYS)
def test_a_filter_that_is_not_one_filter_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str,
                                                    label: str, value: str, why: str) -> None:
    refused(tmp_path, monkeypatch, spec_text(directory(**{key: value})), f"{D}.{key}",
            f"is not one LDAP filter: it {why}", "fix: write one LDAP filter (RFC 4515)")


@pytest.mark.parametrize("value", ["(objectClass=posixGroup)", "(&(objectClass=posixAccount)(memberOf=cn=hpc,dc=x,dc=y))",
                                   "(|(cn=a*b)(!(uid=bob)))", "(cn:dn:=Jane)", "(cn=a\\3fb)", "(uidNumber>=1000)",
                                   "(cn=Sales \\28EMEA\\29)"])
def test_a_valid_filter_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    accepted(tmp_path, monkeypatch, spec_text(directory(group_filter=value)))


# --- 7. directory secrets named as fmcluster's own files -------------------------------------------------------

SECRET_CLASHES = [
    ("munge-key", "is a secret fmcluster keeps for itself (munge-key)"),
    ("MUNGE-KEY", "is the name of a secret fmcluster keeps for itself (munge-key)"),
    ("grafana-admin-password", "is a secret fmcluster keeps for itself (grafana-admin-password)"),
    ("Grafana-Admin-Password", "is the name of a secret fmcluster keeps for itself"),
    ("slurmdbd-storage-password", "is a secret fmcluster keeps for itself (slurmdbd-storage-password)"),
    ("slurmdbd-storage.pass", "is a secret fmcluster keeps for itself (slurmdbd-storage.pass)"),
    ("munge-key.tmp", "is the temporary file the node agent writes munge-key through"),
    ("slurmdbd-storage.tmp", "is the temporary file the node agent writes slurmdbd-storage.pass through"),
    ("munge-key.old", "would be written through 'munge-key.tmp', the temporary file of fmcluster's own munge-key"),
    ("grafana-admin-password.v2", "would be written through 'grafana-admin-password.tmp'"),
    ("slurmdbd-storage.secret", "would be written through 'slurmdbd-storage.tmp'"),
]


@pytest.mark.parametrize(("name", "why"), SECRET_CLASHES, ids=[c[0] for c in SECRET_CLASHES])
def test_a_bind_secret_named_as_fmcluster_s_own_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 name: str, why: str) -> None:
    change = directory(bind_dn="cn=reader,dc=example,dc=org", bind_password_secret=name)
    refused(tmp_path, monkeypatch, spec_text(change), f"{D}.bind_password_secret", why,
            "fix: name the secret otherwise, e.g. ldap-bind-password")


@pytest.mark.parametrize("name", ["ldap-bind-password", "munge", "ldap.bind", "munge-key2"])
def test_a_bind_secret_of_its_own_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    accepted(tmp_path, monkeypatch, spec_text(directory(bind_dn="cn=reader,dc=example,dc=org",
                                                        bind_password_secret=name)))


# --- 8. CA files: links on the way, not DER, huge --------------------------------------------------------------

def _with_ca(tmp_path: Path, ca_cert: str = "certs/ldap-ca.pem") -> Path:
    return write_tenant(tmp_path, spec_text(directory(ca_cert=ca_cert))).parent


def test_a_ca_cert_through_a_linked_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _with_ca(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ldap-ca.pem").write_text(CA)
    (folder / "certs").symlink_to(elsewhere)
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{D}.ca_cert", ("is reached through certs/, a symbolic link",))


def test_a_ca_cert_through_a_linked_folder_deeper_down_is_refused(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _with_ca(tmp_path, "certs/ldap/ca.pem")
    (folder / "certs").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "ca.pem").write_text(CA)
    (folder / "certs" / "ldap").symlink_to(tmp_path / "etc")
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{D}.ca_cert", ("is reached through ldap/, a symbolic link",))


def test_a_ca_cert_that_is_a_link_inside_the_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _with_ca(tmp_path)
    (folder / "certs").mkdir()
    (folder / "real.pem").write_text(CA)
    (folder / "certs" / "ldap-ca.pem").symlink_to(folder / "real.pem")
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{D}.ca_cert", ("is a symbolic link",))


def _pem(der: bytes) -> str:
    body = base64.b64encode(der).decode()
    return "-----BEGIN CERTIFICATE-----\n" + "\n".join(body[i:i + 64] for i in range(0, len(body), 64)) + \
        "\n-----END CERTIFICATE-----\n"


NOT_DER = [
    ("three-bytes", b"ABC", "an element is longer than the data"),
    ("trailing-bytes", CA_DER + b"\x00", "it has bytes after the certificate"),
    ("cut-short", CA_DER[:-10], "an element is longer than the data"),
    ("indefinite-length", b"\x30\x80" + CA_DER[4:] + b"\x00\x00", "it uses an indefinite length (BER, not DER)"),
    ("empty-sequence", b"\x30\x00", "it ends inside an element"),
    ("integer", b"\x02\x01\x05", "it does not start with a SEQUENCE"),
    ("long-form-short-length", b"\x30\x81\x03\x30\x01\x00", "not minimally encoded"),
    ("four-elements", b"\x30\x0b\x30\x03\x02\x01\x01\x30\x00\x03\x01\x00" + b"",
     "element"),
    ("second-not-sequence", b"\x30\x08\x30\x03\x02\x01\x01\x02\x01\x00", "its element 2 is not a SEQUENCE"),
    ("tbs-without-serial", b"\x30\x0b\x30\x03\x04\x01\x01\x30\x00\x03\x02\x00\x00",
     "its tbsCertificate starts with neither a version nor a serial number"),
]


@pytest.mark.parametrize(("label", "der", "why"), NOT_DER, ids=[c[0] for c in NOT_DER])
def test_a_certificate_block_that_is_not_der_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str,
                                                        der: bytes, why: str) -> None:
    folder = _with_ca(tmp_path, "ldap-ca.pem")
    (folder / "ldap-ca.pem").write_text(CA + _pem(der))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{D}.ca_cert",
                   ("has a CERTIFICATE block (the second) that is not a DER X.509 certificate: ", why))


def test_a_huge_sparse_ca_cert_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _with_ca(tmp_path, "ldap-ca.pem")
    with open(folder / "ldap-ca.pem", "wb") as handle:
        handle.truncate(1 << 40)  # a terabyte of nothing
    started = time.process_time()
    code, output = validate(tmp_path, monkeypatch)
    assert time.process_time() - started < 5
    assert_refused(code, output, f"{D}.ca_cert", (f"is {1 << 40} bytes long (a CA bundle is at most 65536)",))


def test_a_ca_cert_one_byte_over_the_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _with_ca(tmp_path, "ldap-ca.pem")
    (folder / "ldap-ca.pem").write_text(CA + "#" * (65537 - len(CA)))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{D}.ca_cert", ("is 65537 bytes long",))


def test_a_ca_cert_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _with_ca(tmp_path, "ldap-ca.pem")
    os.mkfifo(folder / "ldap-ca.pem")
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{D}.ca_cert", ("is not a regular file in the tenant's folder",))


def test_a_real_certificate_bundle_is_accepted_and_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _with_ca(tmp_path)
    (folder / "certs").mkdir()
    (folder / "certs" / "ldap-ca.pem").write_text(CA + CA)
    accepted(tmp_path, monkeypatch, (folder / "tenant.yml").read_text())
    loaded = load_tenant("acme", tmp_path).directory
    assert loaded is not None and loaded.ca_cert_pem == CA + CA


# --- 9. alert receivers inside the host, the VPC or the cluster ------------------------------------------------

IMDS_WORDS = "the instance metadata service (its credentials are the node's)"
INSIDE = [
    ("169.254.169.254", f"(169.254.169.254), which is {IMDS_WORDS}"),
    ("2852039166", f"(2852039166 = 169.254.169.254), which is {IMDS_WORDS}"),
    ("0251.0376.0251.0376", f"(0251.0376.0251.0376 = 169.254.169.254), which is {IMDS_WORDS}"),
    ("0xa9fea9fe", f"(0xa9fea9fe = 169.254.169.254), which is {IMDS_WORDS}"),
    ("0xA9FEA9FE", f"(0xa9fea9fe = 169.254.169.254), which is {IMDS_WORDS}"),
    ("169.254.43518", f"(169.254.43518 = 169.254.169.254), which is {IMDS_WORDS}"),
    ("169.16689662", f"(169.16689662 = 169.254.169.254), which is {IMDS_WORDS}"),
    ("0xa9.0xfe.0xa9.0xfe", f"(0xa9.0xfe.0xa9.0xfe = 169.254.169.254), which is {IMDS_WORDS}"),
    ("0251.254.169.254", f"(0251.254.169.254 = 169.254.169.254), which is {IMDS_WORDS}"),
    ("00000251.0376.0251.0376", f"= 169.254.169.254), which is {IMDS_WORDS}"),
    ("169.254.169.254.", None),  # a trailing dot: no valid host name to the URL check, refused there
    ("169.254.0.1", "which is a link-local address"),
    ("127.0.0.1", "(127.0.0.1), which is this host (loopback)"),
    ("127.1", "(127.1 = 127.0.0.1), which is this host (loopback)"),
    ("2130706433", "(2130706433 = 127.0.0.1), which is this host (loopback)"),
    ("0x7f000001", "(0x7f000001 = 127.0.0.1), which is this host (loopback)"),
    ("0177.0.0.1", "(0177.0.0.1 = 127.0.0.1), which is this host (loopback)"),
    ("0", "(0 = 0.0.0.0), which is this host (loopback)"),
    ("0.0.0.0", "(0.0.0.0), which is this host (loopback)"),
    ("10.0.128.10", "(10.0.128.10), which is a private address"),
    ("192.168.1.1", "which is a private address"),
    ("172.16.0.1", "which is a private address"),
    ("100.64.1.1", "which is a private address"),
    ("203.0.113.9", "(203.0.113.9), which is an IP address, not a name the webhook's TLS certificate can prove"),
    ("1.2.3.4.5", "names its host by a number that is no valid address ('1.2.3.4.5')"),
    ("256.1.1.1", "names its host by a number that is no valid address"),
    ("0x1g.1", None),  # not a number: a name whose last label is '1' -> numeric, invalid
    ("localhost", "names host 'localhost', which has no domain"),
    ("LOCALHOST", "names host 'localhost', which has no domain"),
    ("localhost.", None),
    ("controller-1", "names host 'controller-1', which has no domain: the nodes resolve it through /etc/hosts"),
    ("login-1", "names host 'login-1', which has no domain"),
    ("prometheus", "names host 'prometheus', which has no domain"),
    ("grafana", "names host 'grafana', which has no domain"),
    ("foo.localhost", "names host 'foo.localhost', under .localhost"),
    ("instance-data.ec2.internal", "names host 'instance-data.ec2.internal', under .internal"),
    ("ip-10-0-128-10.ap-northeast-1.compute.internal", "under .internal"),
    ("controller-1.local", "under .local, which resolves inside the host or the VPC"),
    ("router.home.arpa", "under .home.arpa"),
    ("254.169.254.169.in-addr.arpa", "under .arpa"),
    ("169.254.169.254.nip.io", "which spells the address 169.254.169.254 (wildcard DNS services such as nip.io"),
    ("169-254-169-254.sslip.io", "which spells the address 169.254.169.254"),
    ("a9fea9fe.nip.io", "which spells the address 169.254.169.254"),
    ("hook.127.0.0.1.nip.io", "which spells the address 127.0.0.1"),
    ("ip-10-0-128-10.example.org", "which spells the address 10.0.128.10"),
    ("ec2-54-1-2-3.compute-1.amazonaws.com", "an EC2 instance's public name, which resolves to its private address"),
    ("ec2-13-1-2-3.ap-northeast-1.compute.amazonaws.com", "an EC2 instance's public name"),
    ("hooks.example.org:9090", "names port 9090, where the cluster's own Prometheus listens"),
    ("hooks.example.org:9093", "names port 9093, where the cluster's own Alertmanager listens"),
    ("hooks.example.org:3000", "names port 3000, where the cluster's own Grafana listens"),
    ("hooks.example.org:9100", "names port 9100, where the cluster's own the node exporter listens"),
    ("hooks.example.org:6817", "names port 6817, where the cluster's own slurmctld listens"),
    ("hooks.example.org:3306", "names port 3306"),
]


@pytest.mark.parametrize(("host", "why"), INSIDE, ids=[c[0] for c in INSIDE])
@pytest.mark.parametrize("kind", ["slack", "webhook"])
def test_an_alert_target_inside_the_host_the_vpc_or_the_cluster_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, host: str, why: str | None) -> None:
    target = f"https://{host}/-/quit"
    change = lambda t: t.setdefault("monitoring", {}).update(alert_receivers=[{"name": "ops", "type": kind,
                                                                               "target": target}])  # noqa: E731
    write_tenant(tmp_path, spec_text(change))
    code, output = validate(tmp_path, monkeypatch)
    key = "tenant.monitoring.alert_receivers[0].target"
    if why is None:  # refused by the URL checks before the host ones: still refused at the key
        assert_refused(code, output, key)
        return
    assert_refused(code, output, key, (why, "Alertmanager on the controller would send alerts",
                                       "fix: use the public https:// URL of the webhook service, by its DNS name"))


@pytest.mark.parametrize("target", ["https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.example.org:8443/a",
                                    "https://alerts.example.org/", "https://a1.example.org/x?y=1",
                                    "https://deadbeef.example.org/", "https://release-1-2-3-4.example.org/"])
def test_a_public_webhook_by_name_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    change = lambda t: t.setdefault("monitoring", {}).update(alert_receivers=[{"name": "ops", "type": "webhook",
                                                                               "target": target}])  # noqa: E731
    accepted(tmp_path, monkeypatch, spec_text(change))


def test_the_cluster_ports_are_the_roles_own() -> None:
    ports = {}
    for role in ("prometheus", "alertmanager", "grafana", "node_exporter", "efa_exporter", "dcgm_exporter"):
        defaults = yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text())
        ports[role] = defaults[f"{role}_port"]
    assert set(ports.values()) <= set(CLUSTER_PORTS), ports
    slurmdbd = yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())["slurm_accounting_port"]
    storage = yaml.safe_load((ROOT / "roles/slurm_accounting/defaults/main.yml").read_text())
    assert {slurmdbd, storage["slurm_accounting_storage_port"]} <= set(CLUSTER_PORTS)


# --- 10. capacity reservations, ssh ingress, accounting ------------------------------------------------------------

def _stockmark(change: Change) -> str:
    return spec_text(change, base="stockmark")


def _two_queues(second: dict[str, Any]) -> Change:
    def change(t: dict[str, Any]) -> None:
        t["queues"][0]["capacity_reservation_id"] = "cr-0123456789abcdef0"
        t["queues"].append({"name": "cpu", "instance_type": "m5.8xlarge", "count": 2, **second})
    return change


def test_two_queue_types_sharing_one_reservation_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refused(tmp_path, monkeypatch, _stockmark(_two_queues({"capacity_reservation_id": "cr-0123456789abcdef0"})),
            "tenant.queues[1].capacity_reservation_id",
            "'cr-0123456789abcdef0' is also the reservation of queues[0], which is 'p5.48xlarge', not 'm5.8xlarge': a "
            "capacity reservation holds instances of one type", "fix: give each queue a reservation of its own")


def test_one_reservation_declared_as_two_kinds_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    second = {"instance_type": "p5.48xlarge", "capacity_reservation_id": "cr-0123456789abcdef0",
              "capacity_reservation_type": "capacity-block"}
    refused(tmp_path, monkeypatch, _stockmark(_two_queues(second)), "tenant.queues[1].capacity_reservation_type",
            "declared there as another kind", "fix: give both queues the same capacity_reservation_type")


def test_two_queues_of_one_type_may_share_a_reservation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    accepted(tmp_path, monkeypatch, _stockmark(_two_queues({"instance_type": "p5.48xlarge", "count": 1,
                                                             "capacity_reservation_id": "cr-0123456789abcdef0"})))


@pytest.mark.parametrize("base", ["stockmark", "demo"])
def test_ssh_ingress_with_no_login_node_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base: str) -> None:
    def change(t: dict[str, Any]) -> None:
        t.setdefault("network", {})["ssh_ingress_cidr"] = "203.0.113.0/24"
        t["login"] = {**t.get("login", {"instance_type": "m5.2xlarge"}), "count": 0}
    refused(tmp_path, monkeypatch, spec_text(change, base=base), "tenant.login.count",
            "login.count is 0, and network.ssh_ingress_cidr admits ssh to the login nodes: there is no login node",
            "fix: set login.count: 1 or more, or remove network.ssh_ingress_cidr")


def test_ssh_ingress_with_no_login_section_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def change(t: dict[str, Any]) -> None:
        t.setdefault("network", {})["ssh_ingress_cidr"] = "203.0.113.0/24"
        t.pop("login", None)
    refused(tmp_path, monkeypatch, _stockmark(change), "tenant.network.ssh_ingress_cidr",
            "the tenant has no `login:` section: there is no login node to reach", "fix: remove ssh_ingress_cidr")


def _pclab(change: Change) -> str:
    doc = yaml.safe_load((ROOT / "inventories/pclab/group_vars/all/tenant.yml").read_text())
    doc["tenant"]["org"] = "acme"
    change(doc["tenant"])
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_top_level_database_beside_parallelcluster_s_is_refused(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    text = _pclab(lambda t: t.update(accounting={"database_endpoint": "db.example.org:3306"}))
    refused(tmp_path, monkeypatch, text, "tenant.accounting.database_endpoint",
            "ParallelCluster runs slurmdbd against parallelcluster.accounting's database",
            "fix: give your database as parallelcluster.accounting.uri")


@pytest.mark.parametrize("name", ["root", "ROOT", "Root", "mysql", "rdsadmin", "rdsrepladmin", "rdsproxyadmin"])
def test_a_database_administrator_as_slurmdbd_s_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 name: str) -> None:
    refused(tmp_path, monkeypatch, _stockmark(lambda t: t.update(accounting={"database_user": name})),
            "tenant.accounting.database_user", f"'{name}' is the database server's administrator",
            "fix: use an account of slurmdbd's own")


def test_a_database_administrator_as_parallelcluster_s_user_is_refused(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    refused(tmp_path, monkeypatch, _pclab(lambda t: t["parallelcluster"]["accounting"].update(user_name="root")),
            "tenant.parallelcluster.accounting.user_name", "'root' is the database server's administrator")


# --- 11. command line: version digits, new-tenant without a template ---------------------------------------------

@pytest.mark.parametrize("version", ["١.١٤.٠", "1.１4.0", "१.१४.०", "1.14.٠", "v１.2", "1.2.3\u200b"])
def test_nccl_env_refuses_a_plugin_version_with_non_ascii_digits(version: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.nccl_env("p5.48xlarge", version) == 2
    err = capsys.readouterr().err
    assert "not a version" in err and "write it like 1.14.0" in err and "Traceback" not in err
    assert "\u200b" not in err  # the value is echoed escaped


@pytest.mark.parametrize("template", ["missing", "empty-folder", "json-is-a-folder", "not-json", "a-list"])
def test_new_tenant_without_a_usable_template_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], template: str) -> None:
    folder = tmp_path / "cookiecutters" / "tenant"
    if template != "missing":
        folder.mkdir(parents=True)
    if template == "json-is-a-folder":
        (folder / "cookiecutter.json").mkdir()
    elif template == "not-json":
        (folder / "cookiecutter.json").write_text("{not json")
    elif template == "a-list":
        (folder / "cookiecutter.json").write_text("[]")
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    assert commands.new_tenant("acme") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cookiecutters/tenant/cookiecutter.json: " in err
    assert "fix: run it in an fmcluster checkout, or point FMCLUSTER_ROOT at one" in err
    assert "nothing was written" in err and not (tmp_path / "inventories" / "acme").exists()


# --- 12. log readers: bounds before and while reading; one escape ---------------------------------------------------

#: The issue's bzip2 of 1.1 GB of newlines (786 bytes), and of 1 GB of `x` without a newline (722 bytes): made
#: once with bz2.BZ2Compressor(9) (each takes minutes), kept as data.
BZ2_NEWLINES = (
    "QlpoOTFBWSZTWStxu3EBX45AAIAQAAggADCATUZCoCWpCoCXMUFZJlNZK3G7cQFfjkAAgBAACCAAMIBNRkKgJakKgJcxQVkmU1kr"
    "cbtxAV+OQACAEAAIIAAwgE1GQqAlqQqAlzFBWSZTWStxu3EBX45AAIAQAAggADCATUZCoCWpCoCXMUFZJlNZK3G7cQFfjkAAgBAA"
    "CCAAMIBNRkKgJakKgJcxQVkmU1krcbtxAV+OQACAEAAIIAAwgE1GQqAlqQqAlzFBWSZTWStxu3EBX45AAIAQAAggADCATUZCoCWp"
    "CoCXMUFZJlNZK3G7cQFfjkAAgBAACCAAMIBNRkKgJakKgJcxQVkmU1krcbtxAV+OQACAEAAIIAAwgE1GQqAlqQqAlzFBWSZTWStx"
    "u3EBX45AAIAQAAggADCATUZCoCWpCoCXMUFZJlNZK3G7cQFfjkAAgBAACCAAMIBNRkKgJakKgJcxQVkmU1krcbtxAV+OQACAEAAI"
    "IAAwgE1GQqAlqQqAlzFBWSZTWStxu3EBX45AAIAQAAggADCATUZCoCWpCoCXMUFZJlNZK3G7cQFfjkAAgBAACCAAMIBNRkKgJakK"
    "gJcxQVkmU1krcbtxAV+OQACAEAAIIAAwgE1GQqAlqQqAlzFBWSZTWStxu3EBX45AAIAQAAggADCATUZCoCWpCoCXMUFZJlNZK3G7"
    "cQFfjkAAgBAACCAAMIBNRkKgJakKgJcxQVkmU1krcbtxAV+OQACAEAAIIAAwgE1GQqAlqQqAlzFBWSZTWStxu3EBX45AAIAQAAgg"
    "ADCATUZCoCWpCoCXMUFZJlNZK3G7cQFfjkAAgBAACCAAMIBNRkKgJakKgJcxQVkmU1krcbtxAV+OQACAEAAIIAAwgE1GQqAlqQqA"
    "lzFBWSZTWStxu3EBX45AAIAQAAggADCATUZCoCWpCoCXMUFZJlNZK3G7cQFfjkAAgBAACCAAMIBNRkKgJakKgJcxQVkmU1lYKPzH"
    "AUsTQAiAEAACAAggADDMBSmmUQpE2KiFIni7kinChIIreA+A")
BZ2_ONE_LINE = (
    "QlpoOTFBWSZTWbTrVKABX44AgIBAAAggADCATUZCoCWpCoCXMUFZJlNZtOtUoAFfjgCAgEAACCAAMIBNRkKgJakKgJcxQVkmU1m0"
    "61SgAV+OAICAQAAIIAAwgE1GQqAlqQqAlzFBWSZTWbTrVKABX44AgIBAAAggADCATUZCoCWpCoCXMUFZJlNZtOtUoAFfjgCAgEAA"
    "CCAAMIBNRkKgJakKgJcxQVkmU1m061SgAV+OAICAQAAIIAAwgE1GQqAlqQqAlzFBWSZTWbTrVKABX44AgIBAAAggADCATUZCoCWp"
    "CoCXMUFZJlNZtOtUoAFfjgCAgEAACCAAMIBNRkKgJakKgJcxQVkmU1m061SgAV+OAICAQAAIIAAwgE1GQqAlqQqAlzFBWSZTWbTr"
    "VKABX44AgIBAAAggADCATUZCoCWpCoCXMUFZJlNZtOtUoAFfjgCAgEAACCAAMIBNRkKgJakKgJcxQVkmU1m061SgAV+OAICAQAAI"
    "IAAwgE1GQqAlqQqAlzFBWSZTWbTrVKABX44AgIBAAAggADCATUZCoCWpCoCXMUFZJlNZtOtUoAFfjgCAgEAACCAAMIBNRkKgJakK"
    "gJcxQVkmU1m061SgAV+OAICAQAAIIAAwgE1GQqAlqQqAlzFBWSZTWbTrVKABX44AgIBAAAggADCATUZCoCWpCoCXMUFZJlNZtOtU"
    "oAFfjgCAgEAACCAAMIBNRkKgJakKgJcxQVkmU1m061SgAV+OAICAQAAIIAAwgE1GQqAlqQqAlzFBWSZTWbTrVKABX44AgIBAAAgg"
    "ADCATUZCoCWpCoCXMUFZJlNZtOtUoAFfjgCAgEAACCAAMIBNRkKgJakKgJcxQVkmU1m061SgAV+OAICAQAAIIAAwgE1GQqAlqQqA"
    "lzFBWSZTWQgdmc0BBy0AiIBAAIAACCAAMMwFKaZKRUDYpSKgeLuSKcKEgbpYugg=")


def _stream_bomb(opener: Callable[..., Any], path: Path, payload: bytes, size: int = 16 << 20) -> Path:
    block = payload * ((1 << 20) // len(payload))
    with opener(path, "wb") as handle:
        for _ in range(size // len(block)):
            handle.write(block)
    return path


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bombs")
    made = {"bz2": folder / "newlines.log.bz2", "bz2-one-line": folder / "line.log.bz2"}
    made["bz2"].write_bytes(base64.b64decode(BZ2_NEWLINES))
    made["bz2-one-line"].write_bytes(base64.b64decode(BZ2_ONE_LINE))
    assert len(made["bz2"].read_bytes()) == 786
    assert bz2.BZ2Decompressor().decompress(made["bz2"].read_bytes(), max_length=4096) == b"\n" * 4096
    made["gzip"] = _stream_bomb(lambda p, m: gzip.open(p, m, compresslevel=9), folder / "newlines.log.gz", b"\n")
    made["gzip-short-lines"] = _stream_bomb(lambda p, m: gzip.open(p, m, compresslevel=9), folder / "x.log.gz", b"x\n")
    made["xz"] = _stream_bomb(lambda p, m: lzma.open(p, m, preset=1), folder / "newlines.log.xz", b"\n")
    return made


@pytest.mark.parametrize("kind", ["bz2", "bz2-one-line", "gzip", "gzip-short-lines", "xz"])
@pytest.mark.parametrize("reader", ["acceptance parse", "doctor --log"])
def test_a_decompression_bomb_stops_at_once_and_says_so(bombs: dict[str, Path], kind: str, reader: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    commands.doctor(log=str(ROOT / "tests/fixtures/nccl/p5_2node_all_reduce_ok.log"))  # load the knowledge base first
    capsys.readouterr()
    # CPU time of this process: what the bomb costs, whatever else the machine runs beside the tests.
    started, wall = time.process_time(), time.monotonic()
    if reader == "acceptance parse":
        code = cli_main(["acceptance", "parse", str(bombs[kind])])
    else:
        code = commands.doctor(log=str(bombs[kind]))
    took = time.process_time() - started
    out = capsys.readouterr().out
    assert took < 1.0 and time.monotonic() - wall < 10, f"{reader} took {took:.2f} CPU-seconds on {kind}"
    assert code == 1 and "Traceback" not in out and "verdict: healthy" not in out, out
    if reader == "acceptance parse":
        assert "log_capped" in out and ("decompression bomb" in out or "4 GiB of text" in out), out


def test_the_line_bound_stops_a_plain_file_of_newlines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.acceptance import parser

    path = tmp_path / "newlines.log"
    path.write_bytes(b"\n" * 50_000)
    monkeypatch.setattr(parser, "MAX_LOG_LINES", 10_000)
    monkeypatch.setattr(parser.LogReader.__init__, "__defaults__",
                        (parser.MAX_LINE_CHARS, parser.MAX_LOG_BYTES, 10_000, parser.MAX_EXPANSION, parser.MAX_LOG_BYTES))
    log = parser.parse_file(path)
    assert log.bytes_capped and log.capped_by == "10,000 lines" and log.lines_read == 10_000


@pytest.mark.parametrize("reader", ["acceptance parse", "doctor --log"])
def test_a_huge_sparse_log_is_refused_before_it_is_read(tmp_path: Path, reader: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sparse.log"
    with open(path, "wb") as handle:
        handle.truncate(5 << 30)
    started = time.process_time()
    code = cli_main(["acceptance", "parse", str(path)]) if reader == "acceptance parse" else \
        commands.doctor(log=str(path))
    assert time.process_time() - started < 1.0
    out = capsys.readouterr().out
    assert code == 2 and f"is {5 << 30:,} bytes, more than the 4 GiB a log is read to" in out, out


HIDDEN = [("esc", "\x1b]0;pwned\x07\x1b[2J"), ("c1-csi", "\x9b31m"), ("nel", "\x85"), ("rlo", "\u202e"),
          ("lri", "\u2066"), ("pdi", "\u2069"), ("zwsp", "\u200b"), ("zwj", "\u200d"), ("bom", "\ufeff"),
          ("hangul-filler", "\u3164"), ("cgj", "\u034f"), ("line-separator", "\u2028"), ("cr", "\r")]
LOG = (ROOT / "tests/fixtures/nccl/p5_2node_all_reduce_ok.log").read_text()


def _shows_nothing_raw(out: str, hidden: str) -> None:
    assert hidden not in out, repr(out[:400])
    # Shown as its escape: neutral's, or the \xNN form the doctor's renderer gives C0/C1 first.
    assert neutral(hidden) in out or f"\\x{ord(hidden):02x}" in out, repr(out[:400])


@pytest.mark.parametrize(("label", "hidden"), HIDDEN, ids=[h[0] for h in HIDDEN])
@pytest.mark.parametrize("reader", ["acceptance parse", "doctor --log"])
def test_a_file_name_is_echoed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str], reader: str, label: str,
                                       hidden: str) -> None:
    path = tmp_path / f"run{hidden}x.log"
    path.write_text(LOG)
    code = cli_main(["acceptance", "parse", str(path)]) if reader == "acceptance parse" else \
        commands.doctor(log=str(path))
    assert code in (0, 1, 5)
    _shows_nothing_raw(capsys.readouterr().out, hidden)


@pytest.mark.parametrize(("label", "hidden"), HIDDEN, ids=[h[0] for h in HIDDEN])
@pytest.mark.parametrize("reader", ["acceptance parse", "doctor --log"])
def test_a_missing_file_s_name_is_echoed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str], reader: str,
                                                 label: str, hidden: str) -> None:
    path = tmp_path / f"gone{hidden}.log"
    code = cli_main(["acceptance", "parse", str(path)]) if reader == "acceptance parse" else \
        commands.doctor(log=str(path))
    assert code == 2
    _shows_nothing_raw(capsys.readouterr().out, hidden)


@pytest.mark.parametrize(("label", "hidden"), [h for h in HIDDEN if h[0] not in ("cr", "line-separator", "nel")],
                         ids=[h[0] for h in HIDDEN if h[0] not in ("cr", "line-separator", "nel")])
def test_host_names_in_a_log_are_echoed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str], label: str,
                                                hidden: str) -> None:
    hosts = sorted({line.split()[4] for line in LOG.splitlines() if line.startswith("#  Rank")})
    assert hosts, "the fixture names its hosts"
    path = tmp_path / "hosts.log"
    path.write_text(LOG.replace(hosts[0], f"{hosts[0][:3]}{hidden}{hosts[0][3:]}"))
    assert cli_main(["acceptance", "parse", str(path)]) in (0, 1, 5)
    out = capsys.readouterr().out
    assert hidden not in out, repr(out[:600])
