"""Hostile `directory:` sections (issue 28, the directory variant): plain LDAP, a password where a secret's name
belongs, a bind account without its secret, fmcluster's own secrets, a CA file that is a private key or outside
the tenant's folder, a DN or filter that would change sssd.conf's structure, `users:` beside a directory. Each is
refused with the file, the line, the key and a fix; never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fmcluster.model import load_tenant
from hostile_helpers import assert_refused, spec_text, validate, write_tenant

Change = Callable[[dict[str, Any]], Any]
D = "tenant.directory"
# A real self-signed certificate (openssl req -x509, P-256): validation reads its DER structure.
CA = (Path(__file__).resolve().parents[1] / "fixtures/directory/test-ca.pem").read_text()


def directory(**fields: Any) -> Change:
    """The demo spec with a valid directory (ldaps, base DN) and no users, then `fields` (None removes a key)."""
    def change(t: dict[str, Any]) -> None:
        t.pop("users", None)
        given = {"uri": "ldaps://ldap.example.org", "base_dn": "dc=example,dc=org", **fields}
        t["directory"] = {k: v for k, v in given.items() if v is not None}
    return change


def with_users(change: Change) -> Change:
    def both(t: dict[str, Any]) -> None:
        change(t)
        t["teams"] = [{"name": "llm", "gid": 30010}]
        t["users"] = [{"name": "alice", "uid": 20001, "teams": ["llm"]}]
    return both


REFUSED: list[tuple[str, Change, str, tuple[str, ...]]] = [
    ("plain-ldap", directory(uri="ldap://ldap.example.org"), f"{D}.uri", ("plain LDAP", "start_tls: true")),
    ("starttls-on-ldaps", directory(start_tls=True), f"{D}.start_tls", ("TLS from the start",)),
    ("http-uri", directory(uri="https://ldap.example.org"), f"{D}.uri", ()),
    ("uri-with-path", directory(uri="ldaps://ldap.example.org/dc=x"), f"{D}.uri", ()),
    ("uri-port-out-of-range", directory(uri="ldaps://ldap.example.org:70000"), f"{D}.uri", ("not a TCP port",)),
    ("two-uris", directory(uri="ldaps://a.example.org ldaps://b.example.org"), f"{D}.uri", ()),
    ("no-base-dn", directory(base_dn=None), D, ("base_dn",)),
    ("dn-with-newline-key", directory(base_dn="dc=example,dc=org\nldap_uri = ldap://evil"), f"{D}.base_dn", ()),
    ("dn-with-comment", directory(base_dn="dc=example,dc=org #x"), f"{D}.base_dn", ()),
    ("dn-not-a-dn", directory(base_dn="example.org"), f"{D}.base_dn", ()),
    ("bind-dn-without-secret", directory(bind_dn="cn=reader,dc=example,dc=org"), f"{D}.bind_dn",
     ("without bind_password_secret",)),
    ("secret-without-bind-dn", directory(bind_password_secret="ldap-bind-password"), f"{D}.bind_password_secret",
     ("without bind_dn",)),
    ("a-password-not-a-secret-name", directory(bind_dn="cn=r,dc=example,dc=org", bind_password_secret="hunter 2!"),
     f"{D}.bind_password_secret", ()),
    ("secret-path-escape", directory(bind_dn="cn=r,dc=example,dc=org", bind_password_secret="../munge-key"),
     f"{D}.bind_password_secret", ()),
    ("fmcluster-own-secret", directory(bind_dn="cn=r,dc=example,dc=org", bind_password_secret="munge-key"),
     f"{D}.bind_password_secret", ("fmcluster keeps for itself",)),
    ("unbalanced-filter", directory(user_filter="(memberOf=cn=hpc))("), f"{D}.user_filter",
     ("is not one LDAP filter: it has text after the first filter, at character 18",)),
    ("filter-without-parentheses", directory(group_filter="objectClass=posixGroup"), f"{D}.group_filter", ()),
    ("ca-cert-missing", directory(ca_cert="ldap-ca.pem"), f"{D}.ca_cert", ("not a regular file",)),
    ("ca-cert-outside-the-folder", directory(ca_cert="../../../../etc/passwd"), f"{D}.ca_cert", ()),
    ("ca-cert-absolute", directory(ca_cert="/etc/ssl/certs/ca-certificates.crt"), f"{D}.ca_cert", ()),
    ("unknown-key", directory(password="hunter2"), D, ("password",)),
    ("users-beside-a-directory", with_users(directory()), "tenant.users", ("come from it", "remove `users:`")),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_hostile_directory_is_refused_with_file_line_key_and_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, Change, str, tuple[str, ...]]) -> None:
    _, change, key, fragments = case
    write_tenant(tmp_path, spec_text(change))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, key, fragments)


@pytest.mark.parametrize(("content", "why"), [
    ("-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n",
     "contains a private key"),
    (CA + "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA==\n-----END EC PRIVATE KEY-----\n", "contains a private key"),
    ("not a certificate\n", "holds no PEM certificate"),
    ("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n", "holds no PEM certificate"),
    ("-----BEGIN CERTIFICATE-----\nQUJD=A\n-----END CERTIFICATE-----\n", "does not decode"),
])
def test_a_ca_cert_that_is_not_a_pem_certificate_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, why: str) -> None:
    spec = write_tenant(tmp_path, spec_text(directory(ca_cert="ldap-ca.pem")))
    (spec.parent / "ldap-ca.pem").write_text(content)
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{D}.ca_cert", (why,))


def test_a_ca_cert_that_is_a_link_out_of_the_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = write_tenant(tmp_path, spec_text(directory(ca_cert="ldap-ca.pem")))
    outside = tmp_path / "elsewhere.pem"
    outside.write_text(CA)
    (spec.parent / "ldap-ca.pem").symlink_to(outside)
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{D}.ca_cert", ("is a symbolic link: it must be a plain file in the tenant's own folder",))


def test_a_full_directory_section_is_accepted_and_loads_its_ca_certificate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = write_tenant(tmp_path, spec_text(directory(
        uri="ldap://ldap.example.org:389", start_tls=True, user_search_base="ou=people,dc=example,dc=org",
        group_search_base="ou=groups,dc=example,dc=org", bind_dn="cn=fmcluster reader,dc=example,dc=org",
        bind_password_secret="ldap-bind-password", ca_cert="certs/ldap-ca.pem",
        user_filter="(&(objectClass=posixAccount)(memberOf=cn=hpc,ou=groups,dc=example,dc=org))",
        group_filter="(objectClass=posixGroup)")))
    (spec.parent / "certs").mkdir()
    (spec.parent / "certs" / "ldap-ca.pem").write_text(CA)
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output
    loaded = load_tenant("acme", tmp_path).directory
    assert loaded is not None and loaded.ca_cert_pem == CA and loaded.start_tls
