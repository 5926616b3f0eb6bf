"""munge on the mol-munge tenant: one key, one munged for the tenant, credentials work from every node."""

from __future__ import annotations

import testinfra.host

ROOT = "/var/lib/fmcluster/mol-munge"
SOCKET = f"{ROOT}/munge/run/munge.socket.2"


def test_the_tenant_key_is_readable_by_munge_only(host: testinfra.host.Host) -> None:
    key = host.file(f"{ROOT}/munge/etc/munge.key")
    assert (key.user, key.mode, key.size) == ("munge", 0o400, 1024)


def test_one_munged_runs_for_the_tenant_as_the_munge_user(host: testinfra.host.Host) -> None:
    pid = host.file(f"{ROOT}/munge/run/munged.pid").content_string.strip()
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "munge"
    assert len([p for p in host.process.filter(comm="munged") if ROOT in " ".join(p.args.split())]) == 1


def test_a_credential_encoded_on_this_node_decodes_with_its_origin(host: testinfra.host.Host) -> None:
    out = host.check_output(f"munge -S {SOCKET} -s fmcluster | unmunge -S {SOCKET}")
    assert "STATUS:          Success (0)" in out
    assert out.rstrip().endswith("fmcluster")
