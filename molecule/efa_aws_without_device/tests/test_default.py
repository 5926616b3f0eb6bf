"""After the efa role refused the node: nothing of the EFA stack is on it."""

from __future__ import annotations

import os

import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")


def test_refused_node_has_no_efa_software(host) -> None:
    for path in ("/opt/amazon/efa", "/opt/fmcluster/efa", "/etc/security/limits.d/fmcluster-efa.conf",
                 "/etc/sysctl.d/90-fmcluster-efa.conf"):
        assert not host.file(path).exists, path
