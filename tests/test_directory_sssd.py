"""The directory variant, real end to end on the local substrate: a real OpenLDAP slapd (Debian's package) holding
the demo directory fmcluster generates, and two harness hosts (the pristine node image, apt through the VPC's
package source) that the sssd_client role joins to it over TLS. Every node then resolves the same person with the
directory's uidNumber and the team's group, by construction.

Slow (two hosts, apt installs of SSSD, two converges): its own tier. Its own tenant name and VPC range, removed
in `finally` whatever happens.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, substrate_root_at, venv_tool
from fmcluster.model import Directory
from fmcluster.providers.local import harness
from fmcluster.providers.local.directory import PORT, bind_password, ensure_directory, stop_directory
from fmcluster.providers.local.hosts import Host, host_run, remove_all, router_address
from fmcluster.providers.local.packages import stop_package_source
from fmcluster.stacks.render import subnet_cidrs
from fmcluster.users import sssd_vars

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and slapd on the router address need root"),
              pytest.mark.skipif(shutil.which("slapd") is None and not Path("/usr/sbin/slapd").exists(),
                                 reason="slapd is missing; scripts/bootstrap.sh installs it")]

ORG = "t-directory"
VPC = "10.95.40.0/24"
BASE_DN = "dc=example,dc=org"
TEAMS = [("llm", 30010), ("vision", 30011)]
READER = f"cn=fmcluster-reader,{BASE_DN}"
SECRET = "ldap-bind-password"


@pytest.fixture(scope="module")
def substrate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("substrate")
    with substrate_root_at(root):
        try:
            yield root
        finally:
            stop_directory(ORG)
            stop_package_source(ORG)
            remove_all(ORG)


def converge(inventory: Path, playbook: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           # Harness hosts reuse addresses across runs: never a fact cached for another run's host.
           "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml"}
    return subprocess.run([venv_tool("ansible-playbook"), "-i", str(inventory), str(playbook)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def recap_changed(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"changed=(\d+)", output.split("PLAY RECAP")[-1])]


def test_two_nodes_join_the_directory_and_agree_on_alice(substrate: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    hosts: list[Host] = harness.up(ORG, VPC, 2, inventory).hosts
    router = router_address(subnet_cidrs(VPC)["private"]).split("/")[0]
    server = ensure_directory(ORG, router, BASE_DN, TEAMS, "/fsx/home", bind_dn=READER)
    assert server.uri == f"ldaps://{router}:{PORT}" and [p.name for p in server.people] == ["alice", "bob"]
    ca = (substrate / ORG / "directory" / "ca.pem").read_text()

    # The directory answers over TLS, checked against the substrate's CA, with the generated tree: to the bind
    # account only (an anonymous search sees nothing).
    def search(*bind: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ldapsearch", "-x", "-LLL", "-H", server.uri, *bind, "-b", BASE_DN, "(uid=alice)",
                               "uidNumber"], env={**os.environ, "LDAPTLS_CACERT": str(substrate / ORG / "directory" / "ca.pem")},
                              capture_output=True, text=True, timeout=30)

    assert "uidNumber: 20001" in search("-D", READER, "-w", bind_password(ORG)).stdout
    assert "uidNumber" not in search().stdout

    # Entries a directory could hold that must never become a node's accounts (issue 42): uid 0, the images'
    # default user's 1000, and a group with sudo's gid 27 listing alice. SSSD's min_id/max_id ignore the people;
    # the group search asks for the id range too (min_id alone leaves gid 27 in alice's groups at login).
    people = [[f"dn: uid={name},ou=people,{BASE_DN}", "objectClass: top", "objectClass: inetOrgPerson",
               "objectClass: posixAccount", f"uid: {name}", f"cn: {name}", f"sn: {name}", f"uidNumber: {uid}",
               f"gidNumber: {uid}", f"homeDirectory: /home/{name}", "loginShell: /bin/bash"]
              for name, uid in (("mallory", 0), ("eve", 1000))]
    group = [f"dn: cn=wheel27,ou=groups,{BASE_DN}", "objectClass: top", "objectClass: posixGroup", "cn: wheel27",
             "gidNumber: 27", "memberUid: alice"]
    hostile = "\n\n".join("\n".join(entry) for entry in [*people, group]) + "\n"
    added = subprocess.run(["ldapadd", "-x", "-H", server.uri, "-D", READER, "-w", bind_password(ORG)], input=hostile,
                           env={**os.environ, "LDAPTLS_CACERT": str(substrate / ORG / "directory" / "ca.pem")},
                           capture_output=True, text=True, timeout=30)
    assert added.returncode == 0, added.stderr

    # What the node agent does on a node: the bind secret from Secrets Manager into /etc/fmcluster/secrets/.
    for host in hosts:
        wrote = host_run(host, ["sh", "-c", f"install -d -m 0700 /etc/fmcluster/secrets && umask 077 && "
                                            f"cat > /etc/fmcluster/secrets/{SECRET}"], input_text=bind_password(ORG))
        assert wrote.returncode == 0, wrote.stderr

    variables = sssd_vars(Directory(uri=server.uri, base_dn=BASE_DN, user_search_base=f"ou=people,{BASE_DN}",
                                    group_search_base=f"ou=groups,{BASE_DN}", bind_dn=READER,
                                    bind_password_secret=SECRET, ca_cert_pem=ca), ORG, "/fsx/home")
    playbook = tmp_path / "converge.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Join the directory", "hosts": "all", "gather_facts": False,
                                         "vars": variables, "roles": ["sssd_client"]}], sort_keys=False))
    first = converge(inventory, playbook)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    second = converge(inventory, playbook)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
    assert recap_changed(second.stdout) == [0, 0], second.stdout[-3000:]

    seen = []
    for host in hosts:
        conf = host_run(host, ["stat", "-c", "%a %U", "/etc/sssd/sssd.conf"])
        assert conf.stdout.split() == ["600", "root"]
        nsswitch = host_run(host, ["grep", "-E", "^(passwd|group):", "/etc/nsswitch.conf"]).stdout
        assert all(line.split()[-1] == "sss" for line in nsswitch.splitlines()), nsswitch
        passwd = host_run(host, ["getent", "passwd", "alice"])
        assert passwd.returncode == 0, f"{host.hostname}: {passwd.stderr}"
        ident = host_run(host, ["id", "alice"])
        assert "(llm)" in ident.stdout and "(vision)" not in ident.stdout, ident.stdout
        seen.append(passwd.stdout.strip())
        # The directory's home is replaced by the shared home root (override_homedir).
        assert passwd.stdout.split(":")[5] == "/fsx/home/alice"
        conf_ids = host_run(host, ["grep", "-E", "^(min|max)_id", "/etc/sssd/sssd.conf"]).stdout.split("\n")
        assert conf_ids[:2] == ["min_id = 1001", "max_id = 59999"]
        for outside in ("mallory", "eve"):
            assert host_run(host, ["getent", "passwd", outside]).returncode != 0, f"{host.hostname}: {outside}"
        assert host_run(host, ["getent", "group", "wheel27"]).returncode != 0, host.hostname
        assert "27" not in host_run(host, ["id", "-G", "alice"]).stdout.split(), host.hostname
    assert seen[0] == seen[1] and seen[0].split(":")[2:4] == ["20001", "20001"]
    bob = host_run(hosts[1], ["id", "-Gn", "bob"])
    assert bob.stdout.split() == ["bob", "vision"]
