"""Local hosts (fmcluster.providers.local.hosts): the machines of a provider-local tenant, each booting systemd.

A host stands in for one EC2 instance: its own address on the tenant's bridge, its own hostname, its own
filesystem (an overlay of the pristine image), its own init and process table. These tests boot real hosts
(systemd-nspawn), veth pairs, a bridge and mounts (root only), under a temporary substrate directory, and check
that nothing is left afterwards.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import substrate_root_at
from fmcluster.providers.local import harness, image
from fmcluster.providers.local.packages import APT_CONF_PATH, stop_package_source
from fmcluster.providers.local.hosts import (
    IFNAMSIZ, Bind, Host, HostSpec, SubstrateError, _veth_names, bridge_mac, bridge_name, ensure_network, host_run,
    load_hosts, reconcile_hosts, remove_all, router_address, substrate_root, wait_running,
)

ORG = "t-hosts"
VPC = "10.93.30.0/24"
PRIVATE = "10.93.30.128/25"
#: a tenant whose VPC range overlaps ORG's, which ensure_network must refuse
OVERLAPPING_ORG = "t-hosts2"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces, veth and mounts need root")


# --- names and addresses (nothing is created) ----------------------------------------------------------------

def test_interface_names_fit_the_kernel_limit_for_the_longest_org() -> None:
    org = "a-very-long-org-name-x24"
    names = [bridge_name(org), *_veth_names(org, "10.255.255.254", "10.0.0.0/8")]
    assert all(len(name) <= IFNAMSIZ for name in names), names


def test_orgs_sharing_a_prefix_get_different_interface_names() -> None:
    assert bridge_name("research-a") != bridge_name("research-b")
    assert bridge_name("demo") == "fmcbr-demo"


@pytest.mark.parametrize(("short", "long"), [("neu38fd", "neuronlab"), ("sto0000", "stockmark"), ("ab", "ab-long-org")])
def test_a_hashed_tag_never_equals_a_short_org_s_name(short: str, long: str) -> None:
    """A tenant name of 7 characters or fewer is its own tag; a longer one's tag holds '_', which no tenant name
    does: the two kinds never collide (issue 25: `neu38fd` and `neuronlab` did)."""
    assert bridge_name(short) == f"fmcbr-{short}"
    assert "_" in bridge_name(long) and bridge_name(long) != bridge_name(short)
    assert len(bridge_name(long)) <= IFNAMSIZ and bridge_name(long).startswith("fmcbr-")


def test_the_subnet_s_router_is_its_first_address() -> None:
    assert router_address(PRIVATE) == "10.93.30.129/25"


def test_harness_hosts_take_the_private_subnet_s_addresses_after_the_four_aws_reserves() -> None:
    assert harness.addresses(VPC, 3) == (["10.93.30.132", "10.93.30.133", "10.93.30.134"], 25)
    with pytest.raises(SubstrateError, match="do not fit the private subnet 10.93.30.128/25"):
        harness.addresses(VPC, 124)
    spec = harness.host_specs(ORG, VPC, 1, "/images/pristine", ["/fsx"])[0]
    assert (spec.key, spec.hostname, spec.address) == ("ip-10-93-30-132", "ip-10-93-30-132", "10.93.30.132")
    # The pristine image and the shared directory: nothing of this machine's is bound in.
    assert (spec.image, [b.target for b in spec.binds], spec.hidden) == ("/images/pristine", ["/fsx"], ())


# --- real hosts --------------------------------------------------------------------------------------------

def leftovers(hosts: list[Host], root: Path) -> list[str]:
    """Every trace the tenant's hosts could leave on this machine."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    found += [f"netns {h.netns}" for h in hosts if h.netns in netns]
    links = [line.split()[0].split("@")[0] for line in
             subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout.splitlines()]
    found += [f"link {name}" for name in [bridge_name(ORG), *(h.host_veth for h in hosts)] if name in links]
    found += [f"mount {line.split()[1]}" for line in Path("/proc/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(root))]
    if (root / ORG).exists():
        found.append(f"directory {root / ORG}")
    return found


@pytest.fixture(scope="module")
def substrate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("namespaces, veth and mounts need root")
    root = tmp_path_factory.mktemp("substrate")
    with substrate_root_at(root):
        try:
            yield root
        finally:
            remove_all(ORG)


@pytest.fixture(scope="module")
def dirs(substrate: Path) -> dict[str, Path]:
    made = {name: substrate / f"machine-{name}" for name in ("shared", "image", "checkout")}
    for path in made.values():
        path.mkdir()
    made["shared"].chmod(0o1777)
    (made["image"] / "tool").write_text("the image's toolchain\n")
    (made["checkout"] / "secret-work-tree-file").write_text("not for instances\n")
    return made


@pytest.fixture(scope="module")
def specs(dirs: dict[str, Path]) -> list[HostSpec]:
    binds = (Bind(str(dirs["shared"]), "/shared"), Bind(str(dirs["image"]), "/opt/image", read_only=True))
    pristine = str(image.ensure_image().rootfs)
    return [HostSpec(f"i-{n}", f"ip-10-93-30-{n}", f"10.93.30.{n}", 25, VPC, binds, (str(dirs["checkout"]),),
                     image=pristine) for n in (132, 133)]


def not_an_instance(host: Host) -> None:
    """What these hosts' disks hold before boot: their hostname, and cloud-init off (no metadata service here)."""
    (host.root / "etc" / "hostname").write_text(f"{host.hostname}\n")
    (host.root / "etc" / "cloud" / "cloud-init.disabled").write_text("test host\n")


@pytest.fixture(scope="module")
def hosts(substrate: Path, specs: list[HostSpec]) -> list[Host]:
    remove_all(OVERLAPPING_ORG)  # an earlier run killed mid-test may have left its bridge, which overlaps ours
    ensure_network(ORG, VPC, [router_address(PRIVATE)])
    made, created, removed = reconcile_hosts(ORG, specs, bridge_name(ORG), not_an_instance)
    assert (made, removed) == (created, [])
    return made


def sh(host: Host, script: str) -> subprocess.CompletedProcess[str]:
    return host_run(host, ["sh", "-c", script], timeout=30)


@root_only
def test_each_host_has_its_own_address_and_hostname(hosts: list[Host]) -> None:
    for host in hosts:
        assert sh(host, "hostname").stdout.strip() == host.hostname
        assert f"{host.address}/25" in sh(host, "ip -4 -br addr show dev eth0").stdout
    assert sh(hosts[0], "ip -4 -br addr show").stdout.count("10.93.30.") == 1


@root_only
def test_each_host_boots_its_own_systemd_and_sees_only_its_own_processes(hosts: list[Host]) -> None:
    """As an instance: systemd is PID 1, `ps -e` lists the host's processes alone, and a process killed by name in
    one host is killed there only (issue 35: `pkill -x slurmd` on one node killed every node's)."""
    sleepers = [subprocess.Popen([*h.nsenter(), "sleep", "301"]) for h in hosts]
    try:
        for host in hosts:
            assert sh(host, "ps -o comm= -p 1").stdout.strip() == "systemd"
            # PID 1 just exec'd has no bus yet ("Failed to connect to bus"): wait as the deploy does, then ask.
            wait_running(host)
            assert sh(host, "systemctl is-system-running").stdout.strip() in ("running", "degraded")
            listed = sh(host, "ps -e -o pid=,comm=").stdout
            assert "systemd-nspawn" not in listed and "pytest" not in listed, listed
        assert sh(hosts[0], "pkill -x sleep").returncode == 0
        assert sleepers[0].wait(timeout=10) != 0 and sleepers[1].poll() is None, "the other host's process lives on"
    finally:
        for sleeper in sleepers:
            sleeper.kill()


@root_only
def test_hosts_reach_each_other_and_the_vpc_router_on_the_bridge(hosts: list[Host]) -> None:
    for target in (hosts[1].address, "10.93.30.129"):
        ping = sh(hosts[0], f"ping -c1 -W2 {target}")
        assert ping.returncode == 0, ping.stdout + ping.stderr


@root_only
def test_a_file_written_in_one_host_is_seen_by_no_other_host_nor_this_machine(hosts: list[Host]) -> None:
    probe = f"/etc/fmcluster-probe-{uuid.uuid4().hex}"
    assert sh(hosts[0], f"echo mine > {probe} && cat {probe}").stdout == "mine\n"
    assert sh(hosts[1], f"test -e {probe}").returncode == 1
    assert not Path(probe).exists()
    assert sh(hosts[0], "cat /etc/hostname; ls /tmp /run | wc -l").returncode == 0  # /tmp and /run are its own


@root_only
def test_a_reboot_from_inside_boots_the_host_again_with_its_disk_kept(hosts: list[Host]) -> None:
    before = hosts[0].init_pid()
    assert sh(hosts[0], "echo kept > /root/across-reboot && systemctl reboot").returncode in (0, 255)
    deadline = time.monotonic() + 60
    while hosts[0].init_pid() in (None, before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hosts[0].init_pid() not in (None, before), "the host did not come back"
    assert sh(hosts[0], "cat /root/across-reboot").stdout == "kept\n"
    # Its uptime counts from this boot, as an instance's does (slurmctld knows a reboot happened by it).
    host_uptime = float(Path("/proc/uptime").read_text().split()[0])
    uptime = float(sh(hosts[0], "cut -d' ' -f1 /proc/uptime").stdout)
    assert uptime < 90 < host_uptime, (uptime, host_uptime)


@root_only
def test_bound_directories_are_shared_read_only_where_asked_and_the_checkout_is_hidden(
        hosts: list[Host], dirs: dict[str, Path]) -> None:
    name = uuid.uuid4().hex
    assert sh(hosts[0], f"echo from-a > /shared/{name}").returncode == 0
    assert sh(hosts[1], f"cat /shared/{name}").stdout == "from-a\n"
    assert (dirs["shared"] / name).read_text() == "from-a\n"
    assert sh(hosts[1], "cat /opt/image/tool").stdout == "the image's toolchain\n"
    assert sh(hosts[1], "touch /opt/image/x").returncode != 0, "read-only bind"
    assert sh(hosts[0], f"ls -A {dirs['checkout']}").stdout == "", "the work tree is not on an instance"


@root_only
def test_a_second_reconcile_creates_and_removes_nothing_and_keeps_each_host_s_files(
        hosts: list[Host], specs: list[HostSpec]) -> None:
    assert sh(hosts[0], "echo kept > /root/kept").returncode == 0
    again, created, removed = reconcile_hosts(ORG, specs, bridge_name(ORG))
    assert (again, created, removed) == (hosts, [], [])
    assert sh(hosts[0], "cat /root/kept").stdout == "kept\n"
    assert load_hosts(ORG) == hosts


@root_only
def test_a_vpc_range_overlapping_another_tenant_s_is_refused(hosts: list[Host]) -> None:
    try:
        with pytest.raises(SubstrateError, match="overlaps 10.93.30.129/25 on fmcbr-t-hosts"):
            ensure_network(OVERLAPPING_ORG, "10.93.30.128/26", ["10.93.30.129/26"])
    finally:
        # Were it ever made, its address would refuse this file's own network on every later run.
        remove_all(OVERLAPPING_ORG)


@root_only
def test_an_address_list_that_cannot_be_read_refuses_the_network_rather_than_passing_the_overlap_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # iproute2 exits 1 with this line when an interface comes or goes during its netlink dump; an empty list
    # read from it once let an overlapping tenant's bridge be made, and that leftover failed every later run.
    fake_ip = tmp_path / "ip"
    fake_ip.write_text("#!/bin/sh\necho 'Dump was interrupted and may be inconsistent.' >&2\nexit 1\n")
    fake_ip.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SubstrateError, match="failed 5 times .*Dump was interrupted.*overlaps them"):
        ensure_network(OVERLAPPING_ORG, "10.93.30.128/26", ["10.93.30.129/26"])


@root_only
def test_the_harness_makes_hosts_root_reaches_over_ssh_and_changes_nothing_the_second_time(
        substrate: Path, tmp_path: Path) -> None:
    org, vpc = "t-harness", "10.93.31.0/24"
    inventory = tmp_path / "hosts.yml"
    try:
        first = harness.up(org, vpc, 1, inventory, ["/shared"])
        assert (first.created, first.sshd_started, first.inventory_written) == (["ip-10-93-31-132"],) * 2 + (True,)
        key = harness.ssh_key(org)
        ssh = subprocess.run(["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                              "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "root@10.93.31.132",
                              "hostname; test -d /shared && ! test -e /opt/fmcluster && ! command -v slurmd && "
                              f"grep -q 'Proxy \"http://10.93.31.129:3142/\"' {APT_CONF_PATH} && echo ok"],
                             capture_output=True, text=True, timeout=30)
        assert ssh.stdout.split() == ["ip-10-93-31-132", "ok"], ssh.stderr
        assert not harness.up(org, vpc, 1, inventory, ["/shared"]).changed
        said: list[str] = []
        assert harness.main(["up", "--org", org, "--vpc", vpc, "--hosts", "1", "--inventory", str(inventory),
                             "--shared", "/shared"], said.append) == 0
        assert said[-1] == f"the 1 hosts of {org} are up; nothing changed"
    finally:
        stop_package_source(org)
        remove_all(org)
    assert not (substrate / org).exists()


@root_only
def test_reconciling_to_fewer_hosts_removes_the_extra_one_entirely(
        hosts: list[Host], specs: list[HostSpec], substrate: Path) -> None:
    # The lowest hardware address among the bridge's ports: a bridge that took its ports' address would change its
    # own at this removal, and the host left would send to the router's old address until its ARP entry expired.
    subprocess.run(["ip", "link", "set", "dev", hosts[1].host_veth, "address", "02:00:00:00:00:00"], check=True)
    assert sh(hosts[0], "ping -c1 -W2 10.93.30.129").returncode == 0
    kept, created, removed = reconcile_hosts(ORG, specs[:1], bridge_name(ORG))
    assert (kept, created, removed) == (hosts[:1], [], hosts[1:])
    assert Path(f"/sys/class/net/{bridge_name(ORG)}/address").read_text().strip() == bridge_mac(ORG)
    router = sh(hosts[0], "ping -c1 -W1 10.93.30.129")
    assert router.returncode == 0, "the router's hardware address moved with the removed host: " + router.stdout
    gone = hosts[1]
    traces = leftovers([gone], substrate)
    assert not [t for t in traces if gone.key in t or gone.netns in t or gone.host_veth in t], traces
    assert not (substrate_root(ORG) / "layers" / gone.key).exists()
    assert sh(hosts[0], f"ping -c1 -W1 {hosts[1].address}").returncode != 0


@root_only
def test_remove_all_leaves_no_namespace_veth_mount_bridge_process_or_directory(
        hosts: list[Host], substrate: Path) -> None:
    sleeper = subprocess.Popen([*hosts[0].nsenter(), "sleep", "300"])
    assert leftovers(hosts, substrate), "the check sees the hosts while they exist"
    gone = remove_all(ORG)
    assert gone[-1] == str(substrate / ORG)
    assert leftovers(hosts, substrate) == []
    assert sleeper.wait(timeout=15) != 0, "processes in a host end with it"
    assert load_hosts(ORG) == []
