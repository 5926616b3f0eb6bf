"""munge on the mol-munge tenant's local hosts: every host has the tenant's key and its own munged, and a
credential made on one host decodes on every other."""

from __future__ import annotations

import os

import testinfra.host
import testinfra.utils.ansible_runner

CONTROLLER = "ip-10-79-2-132"
RUNNER = testinfra.utils.ansible_runner.AnsibleRunner(
    f"{os.environ['MOLECULE_SCENARIO_DIRECTORY']}/inventories/mol-munge/generated/")


def test_the_tenant_key_is_the_node_s_secret_readable_by_munge_only(host: testinfra.host.Host) -> None:
    key = host.file("/etc/munge/munge.key")
    assert (key.user, key.mode, key.size) == ("munge", 0o400, 64)
    assert key.sha256sum == host.file("/etc/fmcluster/secrets/munge-key").sha256sum


def test_munged_runs_in_this_host_as_the_munge_user(host: testinfra.host.Host) -> None:
    pid = host.file("/run/munge/munged.pid").content_string.strip()
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "munge"
    assert host.check_output(f"readlink /proc/{pid}/ns/net") == host.check_output("readlink /proc/self/ns/net"), \
        "the munged of this host, not another's"


def test_a_credential_encoded_on_the_controller_decodes_here_with_its_payload(host: testinfra.host.Host) -> None:
    credential = RUNNER.get_host(CONTROLLER).check_output("munge -s fmcluster")
    out = host.check_output(f"echo {credential} | unmunge")
    assert "STATUS:          Success (0)" in out
    assert out.rstrip().endswith("fmcluster")
