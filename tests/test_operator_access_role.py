"""The operator reaches every node as its image's default user whatever is mounted over /home: roles/operator_access
keeps the key under /etc/ssh, and sshd (the real one, `sshd -T`) reads it from there as well as from ~/.ssh.
The role runs with the project's Ansible against a temporary sshd configuration on this machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, venv_tool
from fmcluster.images import load_images
from fmcluster.model import load_tenant
from localtenant import manifest_for

pytestmark = pytest.mark.slow

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorKeyForTheTestOnlyAAAAAAAAAAAAAAAAAAA fmcluster-test"


def converge(tmp_path: Path, **variables: object) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [operator_access]\n")
    argv = [venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(play), "-e", json.dumps(variables),
            "-e", f"ansible_python_interpreter={venv_tool('python')}"]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                               "ANSIBLE_ROLES_PATH": str(ROOT / "roles")})


def test_the_key_is_kept_under_etc_ssh_and_sshd_reads_it_for_the_default_user(tmp_path: Path) -> None:
    keys_dir, dropin = tmp_path / "authorized_keys", tmp_path / "sshd_config.d" / "10-fmcluster-operator-keys.conf"
    variables = {"operator_access_user": "root", "operator_access_keys": [KEY],
                 "operator_access_keys_dir": str(keys_dir), "operator_access_sshd_dropin": str(dropin)}
    first = converge(tmp_path, **variables)
    assert first.returncode == 0, first.stdout + first.stderr
    written = keys_dir / "root"
    assert KEY in written.read_text() and oct(written.stat().st_mode & 0o777) == "0o644"
    assert written.stat().st_uid == 0 and keys_dir.stat().st_uid == 0
    second = converge(tmp_path, **variables)
    assert "changed=0" in second.stdout, second.stdout
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).exists():
        pytest.skip("no sshd on this machine (scripts/bootstrap.sh installs openssh-server)")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd -T insists on its privilege-separation folder
    config = tmp_path / "sshd_config"
    host_key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    config.write_text(f"Include {dropin}\nHostKey {host_key}\nAuthorizedKeysFile .ssh/authorized_keys\n")
    effective = subprocess.run([sshd, "-T", "-f", str(config), "-C", "user=root,host=h,addr=127.0.0.1"],
                               capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in effective.splitlines() if ln.startswith("authorizedkeysfile "))
    assert line.split()[1:] == [".ssh/authorized_keys", f"{keys_dir}/%u"], line


def test_a_key_that_is_not_one_openssh_line_is_refused(tmp_path: Path) -> None:
    done = converge(tmp_path, operator_access_user="root", operator_access_keys=[KEY + "\ncommand=\"sh\" " + KEY],
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
