"""The operator reaches every node as its image's default user whatever is mounted over /home: roles/operator_access
keeps the key under /etc/ssh, and sshd reads it from there as well as from ~/.ssh. The role converges on a harness
host that boots systemd as PID 1 (over ssh, as on a node): its handler reloads the host's sshd through systemd,
`sshd -T` shows the setting, and the operator then logs in as the default user with a file system mounted over
/home that hides ~/.ssh."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import HOST_PYTHON, ROOT, venv_tool
from fmcluster.images import load_images
from fmcluster.model import load_tenant
from fmcluster.providers.local.hosts import Host, host_run
from localtenant import manifest_for
from role_helpers import converge_hosts, systemd_hosts

pytestmark = pytest.mark.slow

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorKeyForTheTestOnlyAAAAAAAAAAAAAAAAAAA fmcluster-test"
ORG = "t-opacc"
VPC = "10.95.43.0/24"
#: The local image's default user (its contract); the harness boots without cloud-init, so the test makes it.
USER = load_images()["debian-12-local"].contract.default_user
KEYS_DIR = "/etc/ssh/authorized_keys"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Host]]:
    if os.geteuid() != 0:
        pytest.skip("harness hosts (namespaces, systemd-nspawn) need root")
    with systemd_hosts(ORG, VPC, 1, tmp_path_factory.mktemp("operator-hosts")) as (inventory, hosts):
        yield inventory, hosts[0]


def converge_here(tmp_path: Path, **variables: object) -> subprocess.CompletedProcess[str]:
    """On this machine (a local connection): only for what the role refuses before it writes anything."""
    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [operator_access]\n")
    argv = [venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(play), "-e", json.dumps(variables),
            "-e", f"ansible_python_interpreter={HOST_PYTHON}"]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                               "ANSIBLE_ROLES_PATH": str(ROOT / "roles")})


def login(node: Host, key: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                           "-o", "ConnectTimeout=20", f"{USER}@{node.address}", "id", "-un"],
                          capture_output=True, text=True, timeout=60)


def test_the_key_is_kept_under_etc_ssh_and_sshd_reads_it_for_the_default_user_under_a_hidden_home(
        host: tuple[Path, Host], tmp_path: Path) -> None:
    inventory, node = host
    made = host_run(node, ["useradd", "--create-home", "--shell", "/bin/bash", USER])
    assert made.returncode == 0, made.stderr
    key = tmp_path / "operator"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fmcluster-test-operator", "-f", str(key)],
                   check=True)
    public = Path(f"{key}.pub").read_text().strip()
    play = [{"hosts": "all", "gather_facts": False, "roles": ["operator_access"],
             "vars": {"operator_access_user": USER, "operator_access_keys": [KEY, public]}}]
    code, changed, out = converge_hosts(inventory, play, tmp_path)
    assert code == 0 and "RUNNING HANDLER [operator_access : Reload sshd]" in out, out[-4000:]
    written = node.root / KEYS_DIR.lstrip("/") / USER
    assert KEY in written.read_text() and oct(written.stat().st_mode & 0o777) == "0o644"
    assert written.stat().st_uid == 0 and written.parent.stat().st_uid == 0
    code, changed, out = converge_hosts(inventory, play, tmp_path)
    assert (code, changed[node.hostname]) == (0, 0), out[-4000:]
    code, changed, out = converge_hosts(inventory, play, tmp_path, "--check", "--diff")
    assert (code, changed[node.hostname]) == (0, 0), out[-4000:]

    effective = host_run(node, ["sshd", "-T", "-C", f"user={USER},host=h,addr=127.0.0.1"])
    assert effective.returncode == 0, effective.stderr
    line = next(ln for ln in effective.stdout.splitlines() if ln.startswith("authorizedkeysfile "))
    assert line.split()[1:] == [".ssh/authorized_keys", f"{KEYS_DIR}/%u"], line

    # A shared file system mounted over /home hides ~/.ssh: the key under /etc/ssh still lets the operator in.
    hidden = host_run(node, ["mount", "-t", "tmpfs", "-o", "mode=0755", "fmct-home", "/home"])
    assert hidden.returncode == 0, hidden.stderr
    try:
        assert host_run(node, ["test", "-e", f"/home/{USER}"]).returncode != 0
        done = login(node, key)
        assert done.returncode == 0 and done.stdout.strip() == USER, done.stdout + done.stderr
    finally:
        host_run(node, ["umount", "/home"])


def test_a_key_that_is_not_one_openssh_line_is_refused(tmp_path: Path) -> None:
    done = converge_here(tmp_path, operator_access_user="root",
                         operator_access_keys=[KEY + "\ncommand=\"sh\" " + KEY],
                         operator_access_keys_dir=str(tmp_path / "k"), operator_access_sshd_dropin=str(tmp_path / "d.conf"))
    assert done.returncode != 0 and "must be OpenSSH public keys" in done.stdout
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("org", ["stockmark", "neuronlab", "pclab"])
def test_every_aws_node_kind_gets_the_operator_key_for_its_image_s_default_user(org: str) -> None:
    """stockmark mounts its OpenZFS home over /home; HyperPod (neuronlab) takes no key pair: the key travels in the
    manifest and lands under /etc/ssh for the image's default user on every node kind."""
    tenant = load_tenant(org, ROOT)
    manifest = manifest_for(tenant)
    assert manifest["vars"]["operator_access_keys"], "the deploy passes the operator's public key"
    groups = manifest["groups"]
    kinds = [groups["controller"], *([groups["login"]] if groups["login"] else []), *groups["queues"].values()]
    for group in kinds:
        image = load_images()[group["vars"]["fmcluster_image"]]
        assert group["vars"]["operator_access_user"] == image.contract.default_user == "ubuntu"
