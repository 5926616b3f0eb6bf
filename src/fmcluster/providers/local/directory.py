"""The local VPC's directory: a real OpenLDAP slapd (Debian's package) on the VPC router address, standing in for
the organization's own directory (`directory:`, docs/users.md).

On AWS the nodes join the tenant's LDAP or Active Directory server through SSSD. Here the tenant's VPC is a
bridge with no route out, so the substrate puts a directory where the tenant's would be: slapd from Debian's
packages, listening with TLS (ldaps, port 636) only on the private subnet's router address, its certificate
signed by a CA made for the substrate (the nodes check it as they would the tenant's). It holds a demo
directory that fmcluster generates (`demo_ldif`): the spec's base DN, `ou=people` with posixAccount entries,
`ou=groups` with a posixGroup per team (the team's gid, its people as memberUid) and each person's private
group. Without `bind_dn` the nodes read it anonymously (only userPassword is hidden); with one, it is the only
account that reads anything (slapd's rootdn, a password the substrate makes and keeps in its folder, which the
local provider puts into the emulator's Secrets Manager as the tenant would). Everything lives under the tenant's substrate directory (configuration, certificates, data,
pid file); the process is tracked by its pid file and stopped on destroy, as the package source is.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fmcluster.providers.local.daemons import answers, read_state, runs, start, stop
from fmcluster.providers.local.hosts import SubstrateError, substrate_root

PORT = 636
START_TIMEOUT_S = 20.0
SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
SCHEMA_DIR = "/etc/ldap/schema"
#: The schemas posixAccount/posixGroup (nis) and the people's inetOrgPerson need, in dependency order.
SCHEMAS = ("core", "cosine", "nis", "inetorgperson")
#: The demo directory's people (the lowest free ids from FIRST_UID are theirs): the first is in the first team,
#: the second in the second team (the first when there is one).
DEMO_PEOPLE = ("alice", "bob")
FIRST_UID = 20001
#: An RDN attribute of the base DN → the object classes of the base entry (the top of the demo tree).
BASE_CLASSES = {"dc": ("top", "dcObject", "organization"), "o": ("top", "organization"),
                "ou": ("top", "organizationalUnit")}


@dataclass(frozen=True)
class Person:
    name: str
    uid: int
    teams: tuple[str, ...]


@dataclass(frozen=True)
class DirectoryServer:
    address: str
    port: int
    pid: int
    started: bool
    base_dn: str
    people: tuple[Person, ...]

    @property
    def uri(self) -> str:
        return f"ldaps://{self.address}:{self.port}"

    @property
    def note(self) -> str:
        how = "started" if self.started else "running"
        who = ", ".join(f"{p.name} ({p.uid}: {', '.join(p.teams) or 'no team'})" for p in self.people)
        return (f"directory: OpenLDAP slapd (Debian's package) {how} on {self.uri}, the VPC router address, standing "
                f"in for the tenant's own directory (`directory:`); demo tree {self.base_dn}: {who}")


def directory_root(org: str) -> Path:
    return substrate_root(org) / "directory"


def demo_people(teams: Sequence[tuple[str, int]]) -> tuple[Person, ...]:
    """The demo directory's people: DEMO_PEOPLE with the lowest ids from FIRST_UID that no team's gid has."""
    taken = {gid for _, gid in teams}
    names = [name for name, _ in teams]
    people, uid = [], FIRST_UID
    for i, name in enumerate(DEMO_PEOPLE):
        while uid in taken:
            uid += 1
        taken.add(uid)
        team = names[i % len(names)] if names else None
        people.append(Person(name, uid, (team,) if team else ()))
    return tuple(people)


def _base_entry(base_dn: str) -> list[str]:
    attribute, _, value = base_dn.split(",")[0].partition("=")
    classes = BASE_CLASSES.get(attribute.strip().lower())
    if classes is None:
        raise SubstrateError(f"the demo directory cannot make a base entry {base_dn!r}: its first part must be dc=, "
                             "o= or ou= (e.g. dc=example,dc=org)")
    lines = [f"dn: {base_dn}", *(f"objectClass: {c}" for c in classes), f"{attribute.strip()}: {value.strip()}"]
    if attribute.strip().lower() == "dc":
        lines.append(f"o: {value.strip()}")
    return lines


def demo_ldif(base_dn: str, teams: Sequence[tuple[str, int]], people: Sequence[Person], home_root: str) -> str:
    """The demo directory as LDIF: the base entry, ou=people (posixAccount + inetOrgPerson), ou=groups (a
    posixGroup per team with its people as memberUid, and each person's private group, gid = uid)."""
    entries = [_base_entry(base_dn),
               [f"dn: ou=people,{base_dn}", "objectClass: top", "objectClass: organizationalUnit", "ou: people"],
               [f"dn: ou=groups,{base_dn}", "objectClass: top", "objectClass: organizationalUnit", "ou: groups"]]
    for person in people:
        entries.append([f"dn: uid={person.name},ou=people,{base_dn}", "objectClass: top", "objectClass: inetOrgPerson",
                        "objectClass: posixAccount", f"uid: {person.name}", f"cn: {person.name}",
                        f"sn: {person.name}", f"uidNumber: {person.uid}", f"gidNumber: {person.uid}",
                        f"homeDirectory: {home_root.rstrip('/')}/{person.name}", "loginShell: /bin/bash"])
        entries.append([f"dn: cn={person.name},ou=groups,{base_dn}", "objectClass: top", "objectClass: posixGroup",
                        f"cn: {person.name}", f"gidNumber: {person.uid}", f"memberUid: {person.name}"])
    for name, gid in sorted(teams):
        members = [f"memberUid: {p.name}" for p in people if name in p.teams]
        entries.append([f"dn: cn={name},ou=groups,{base_dn}", "objectClass: top", "objectClass: posixGroup",
                        f"cn: {name}", f"gidNumber: {gid}", *members])
    return "# generated by fmcluster.providers.local.directory: the local substrate's demo directory\n\n" + \
        "\n\n".join("\n".join(entry) for entry in entries) + "\n"


def ssha(password: str, salt: bytes) -> str:
    """slapd's {SSHA} form of a password: SHA-1 of password and salt, then the salt, in base64."""
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode("ascii")


def _within(dn: str, base_dn: str) -> bool:
    return dn.lower().replace(" ", "").endswith("," + base_dn.lower().replace(" ", ""))


def slapd_conf(folder: Path, base_dn: str, bind_dn: str = "", bind_hash: str = "") -> str:
    """slapd.conf of the demo directory: one mdb database under `folder`, TLS with the substrate's certificate,
    no writes over the network (slapadd loads the data). Without a bind account anyone reads everything but
    passwords; with one, only it reads (as the database's rootdn) and anonymous binds see nothing."""
    includes = "\n".join(f"include {SCHEMA_DIR}/{name}.schema" for name in SCHEMAS)
    access = ("access to * by * none\n" f'rootdn "{bind_dn}"\nrootpw {bind_hash}\n' if bind_dn else
              "access to attrs=userPassword by * none\naccess to * by * read\n")
    return f"""# generated by fmcluster.providers.local.directory (the local substrate's directory); edits are lost
{includes}
pidfile {folder}/slapd.pid
argsfile {folder}/slapd.args
modulepath /usr/lib/ldap
moduleload back_mdb
TLSCACertificateFile {folder}/ca.pem
TLSCertificateFile {folder}/server.pem
TLSCertificateKeyFile {folder}/server.key
database mdb
suffix "{base_dn}"
directory {folder}/data
maxsize 104857600
{access}"""


def _openssl(argv: list[str]) -> None:
    done = subprocess.run(["openssl", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise SubstrateError(f"openssl {argv[0]} failed making the directory's certificate: {done.stderr.strip()}")


def ensure_certificates(org: str, address: str) -> str:
    """The substrate's CA (made once) and slapd's certificate for `address` (IP subject alternative name), under
    the directory folder; returns the CA certificate (PEM), which the nodes check the server against."""
    folder = directory_root(org)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    ca_key, ca, key, cert = (folder / n for n in ("ca.key", "ca.pem", "server.key", "server.pem"))
    if not (ca_key.exists() and ca.exists()):
        _openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days",
                  "3650", "-subj", f"/CN=fmcluster local directory CA ({org})", "-keyout", str(ca_key),
                  "-out", str(ca)])
    names = folder / "server.address"
    if not (key.exists() and cert.exists()) or not names.exists() or names.read_text() != address:
        request = folder / "server.csr"
        _openssl(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj",
                  f"/CN={address}", "-keyout", str(key), "-out", str(request)])
        extensions = folder / "server.ext"
        extensions.write_text(f"subjectAltName=IP:{address}\nextendedKeyUsage=serverAuth\n")
        _openssl(["x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                  "-days", "3650", "-extfile", str(extensions), "-out", str(cert)])
        names.write_text(address)
    return ca.read_text(encoding="ascii")


def _state_path(org: str) -> Path:
    return directory_root(org) / "state.json"


def _load(folder: Path, conf: Path, ldif: str) -> None:
    """A fresh database holding exactly `ldif` (slapadd, slapd stopped)."""
    data = folder / "data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(mode=0o700)
    (folder / "demo.ldif").write_text(ldif)
    done = subprocess.run([SLAPADD, "-f", str(conf), "-l", str(folder / "demo.ldif")], capture_output=True, text=True)
    if done.returncode != 0:
        raise SubstrateError(f"slapadd could not load the demo directory ({folder / 'demo.ldif'}): "
                             f"{done.stderr.strip()[-500:]}")


def bind_password(org: str) -> str:
    """The stand-in directory's password for the tenant's bind_dn: made once, kept in the directory folder."""
    path = directory_root(org) / "bind.password"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24))
    return path.read_text()


def ensure_directory(org: str, address: str, base_dn: str, teams: Sequence[tuple[str, int]],
                     home_root: str, bind_dn: str = "") -> DirectoryServer:
    """The tenant's stand-in directory on `address` (the VPC router address), with the demo tree for `teams` and,
    given a bind_dn, that account (its password: bind_password); started unless it runs with the same
    content, reloaded when the content changed."""
    if not (Path(SLAPD).exists() and Path(SLAPADD).exists()):
        raise SubstrateError("slapd is missing; run scripts/bootstrap.sh (it installs Debian's slapd, the local "
                             "substrate's directory)")
    if bind_dn and not _within(bind_dn, base_dn):
        raise SubstrateError(f"the local directory can only make the bind account {bind_dn!r} under the base DN "
                             f"{base_dn!r}: put it there (e.g. cn=fmcluster-reader,{base_dn}) or leave bind_dn out")
    folder = directory_root(org)
    ensure_certificates(org, address)
    people = demo_people(teams)
    ldif = demo_ldif(base_dn, teams, people, home_root)
    conf = folder / "slapd.conf"
    hash_path = folder / "bind.ssha"
    if bind_dn and not hash_path.exists():
        hash_path.write_text(ssha(bind_password(org), secrets.token_bytes(8)))
    conf_text = slapd_conf(folder, base_dn, bind_dn, hash_path.read_text() if bind_dn else "")
    digest = hashlib.sha256((conf_text + ldif + address).encode()).hexdigest()
    known = read_state(_state_path(org))
    pid = int(known.get("pid", 0))
    if known.get("digest") == digest and runs(pid, "slapd", str(conf)) and answers(address, PORT):
        return DirectoryServer(address, PORT, pid, False, base_dn, people)
    stop_directory(org)
    conf.touch(mode=0o600)
    conf.write_text(conf_text)
    _load(folder, conf, ldif)
    argv = [SLAPD, "-f", str(conf), "-h", f"ldaps://{address}:{PORT}/",
            # -d keeps slapd in the foreground, so the pid started is the daemon's (no fork to lose it by).
            "-d", "0"]
    pid = start(argv, folder / "console.log", address, PORT, START_TIMEOUT_S, "the directory (slapd)")
    _state_path(org).write_text(json.dumps({"pid": pid, "address": address, "digest": digest}) + "\n")
    return DirectoryServer(address, PORT, pid, True, base_dn, people)


def stop_directory(org: str, timeout_s: float = 10.0) -> bool:
    """Stop the tenant's stand-in directory if it runs (its files stay until the substrate is removed). True if
    one was stopped."""
    state = _state_path(org)
    known = read_state(state)
    state.unlink(missing_ok=True)
    pid = int(known.get("pid", 0))
    if not runs(pid, "slapd", str(directory_root(org) / "slapd.conf")):
        return False
    stop(pid, timeout_s)
    return True
