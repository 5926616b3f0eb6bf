"""How the deploy and every operator command reach a node (issue 23): directly only at a public address, else
through a login node the tenant opened to ssh, else through a Session Manager session. One rule for every
provider (fmcluster.providers.route_to); the provider supplies only the session's substrate, the scheduler only
the session's target. The e2e tier runs every node-facing step through the local session channel."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest
import yaml

from conftest import ROOT
from fmcluster.model import load_tenant
from fmcluster.nodes import Node
from fmcluster.providers import route_to
from fmcluster.providers.local import channel
from fmcluster.providers.registry import provider_for
from fmcluster.schedulers.registry import scheduler_for

CONTROLLER = Node("ip-10-0-0-4", "10.0.0.4", "controller", None, "i-0c0000000000000c1", "m5.xlarge")
LOGIN = Node("ip-10-0-1-5", "10.0.1.5", "login", None, "i-0a0000000000000a1", "m5.xlarge", "203.0.113.10")
PRIVATE_LOGIN = Node("ip-10-0-1-5", "10.0.1.5", "login", None, "i-0a0000000000000a1", "m5.xlarge")
COMPUTE = Node("ip-10-0-2-6", "10.0.2.6", "compute", "gpu", "i-0b0000000000000b1", "p5.48xlarge")


def session(node: Node) -> tuple[str, ...]:
    return ("open-session", node.instance_id, "%p")


def test_a_node_with_a_public_address_is_reached_directly() -> None:
    route = route_to(LOGIN, [CONTROLLER, LOGIN, COMPUTE], "/k", "ubuntu", session)
    assert (route.address, route.proxy) == ("203.0.113.10", ())


@pytest.mark.parametrize("node", [CONTROLLER, COMPUTE])
def test_a_private_node_is_reached_through_the_public_login_node(node: Node) -> None:
    route = route_to(node, [CONTROLLER, LOGIN, COMPUTE], "/k", "ubuntu", session)
    assert route.address == node.address and route.via == "login node ip-10-0-1-5 (203.0.113.10)"
    assert route.proxy[0] == "ssh" and route.proxy[-3:] == ("-W", "%h:%p", "ubuntu@203.0.113.10")
    assert route.proxy[route.proxy.index("-i") + 1] == "/k", "the tenant's key on the jump too"


@pytest.mark.parametrize("node", [CONTROLLER, PRIVATE_LOGIN, COMPUTE])
def test_without_a_public_login_node_every_node_is_reached_by_a_session(node: Node) -> None:
    route = route_to(node, [CONTROLLER, PRIVATE_LOGIN, COMPUTE], "/k", "ubuntu", session)
    assert (route.via, route.proxy) == ("a Session Manager session", ("open-session", node.instance_id, "%p"))


def test_the_controller_is_never_reached_at_its_private_address_from_outside() -> None:
    for nodes in ([CONTROLLER, LOGIN], [CONTROLLER, PRIVATE_LOGIN], [CONTROLLER]):
        assert route_to(CONTROLLER, nodes, "/k", "ubuntu", session).proxy, nodes


def test_session_targets_are_the_instance_or_hyperpod_s_own_form() -> None:
    assert scheduler_for(load_tenant("stockmark", ROOT)).session_target(COMPUTE, {}) == COMPUTE.instance_id
    assert scheduler_for(load_tenant("pclab", ROOT)).session_target(COMPUTE, {}) == COMPUTE.instance_id
    hyperpod = scheduler_for(load_tenant("neuronlab", ROOT))
    arn = {"ClusterArn": "arn:aws:sagemaker:us-east-1:123456789012:cluster/a1b2c3d4e5f6"}
    assert hyperpod.session_target(COMPUTE, arn) == "sagemaker-cluster:a1b2c3d4e5f6_gpu-i-0b0000000000000b1"
    assert hyperpod.session_target(CONTROLLER, arn) == "sagemaker-cluster:a1b2c3d4e5f6_controller-i-0c0000000000000c1"
    with pytest.raises(RuntimeError, match="no ClusterArn"):
        hyperpod.session_target(COMPUTE, {})


def _root_with_nodes(tmp_path: Path, org: str, nodes: list[Node], outputs: dict[str, str]) -> Path:
    shutil.copytree(ROOT / "inventories" / org / "group_vars", tmp_path / "inventories" / org / "group_vars")
    generated = tmp_path / "inventories" / org / "generated"
    generated.mkdir()
    (generated / "hosts.yml").write_text(yaml.safe_dump({"all": {"vars": {"fmcluster_nodes": [n.as_dict() for n in nodes]}}}))
    (generated / "stack_outputs.yml").write_text(yaml.safe_dump({"all": {"vars": {"fmcluster_stack_outputs": outputs}}}))
    return tmp_path


def _programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *names: str) -> Path:
    """A PATH holding only `names` (each a script that exits 0): what this machine has, as the test says."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for program in names:
        (bin_dir / program).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / program).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def test_on_aws_the_session_is_session_managers_ssh_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FMCLUSTER_ROOT", str(_root_with_nodes(tmp_path, "stockmark", [CONTROLLER, PRIVATE_LOGIN], {})))
    _programs(tmp_path, monkeypatch, "ssh", "aws", "session-manager-plugin")
    argv = provider_for(load_tenant("stockmark", tmp_path)).client_argv(CONTROLLER)
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert proxy == ("ProxyCommand=aws ssm start-session --region ap-northeast-1 --target i-0c0000000000000c1 "
                     "--document-name AWS-StartSSHSession --parameters portNumber=%p")
    assert argv[-1] == "ubuntu@10.0.0.4"


def test_a_session_route_says_what_this_machine_lacks_before_anything_is_tried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: without the Session Manager plugin (or the AWS CLI) the route is refused with where to get it,
    and `invoke slurm` says so instead of ssh's opaque ProxyCommand failure."""
    monkeypatch.setenv("FMCLUSTER_ROOT", str(_root_with_nodes(tmp_path, "stockmark", [CONTROLLER, PRIVATE_LOGIN], {})))
    bin_dir = _programs(tmp_path, monkeypatch, "ssh", "aws")
    route = provider_for(load_tenant("stockmark", tmp_path)).route(CONTROLLER)
    assert route.missing() == ["session-manager-plugin"]
    assert route.unusable().startswith("reaching the nodes through a Session Manager session needs "
                                       "session-manager-plugin on this machine (install the Session Manager plugin: "
                                       "https://docs.aws.amazon.com/")
    (bin_dir / "session-manager-plugin").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "session-manager-plugin").chmod(0o755)
    assert route.missing() == [] and route.unusable() == ""


def test_every_node_facing_command_refuses_a_route_this_machine_cannot_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed at one depth: the provider's client_argv raises with what is missing; acceptance says it as a
    Slurm client that is not ready, replace as a not-ready lifecycle error (before it asks for any instance)."""
    from fmcluster.acceptance.gate import run_gate
    from fmcluster.acceptance.slurm import SlurmError
    from fmcluster.exits import ExitCode
    from fmcluster.lifecycle import LifecycleError, remote
    from fmcluster.providers import RouteUnusable

    monkeypatch.setenv("FMCLUSTER_ROOT", str(_root_with_nodes(tmp_path, "stockmark", [CONTROLLER, PRIVATE_LOGIN], {})))
    _programs(tmp_path, monkeypatch, "ssh", "aws")
    tenant = load_tenant("stockmark", tmp_path)
    provider = provider_for(tenant)
    with pytest.raises(RouteUnusable, match="needs session-manager-plugin on this machine"):
        provider.client_argv(CONTROLLER)
    with pytest.raises(SlurmError, match="cannot reach the submit node: reaching the nodes through a Session Manager "
                                         "session needs session-manager-plugin"):
        run_gate(tenant, provider, [CONTROLLER, PRIVATE_LOGIN], print)
    with pytest.raises(LifecycleError, match="needs session-manager-plugin") as refused:
        remote(provider, CONTROLLER, "sinfo")
    assert refused.value.code == ExitCode.NOT_READY


def test_on_aws_with_a_public_login_node_the_controller_goes_through_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FMCLUSTER_ROOT", str(_root_with_nodes(tmp_path, "stockmark", [CONTROLLER, LOGIN], {})))
    argv = provider_for(load_tenant("stockmark", tmp_path)).client_argv(CONTROLLER)
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert proxy.startswith("ProxyCommand=ssh -i ") and proxy.endswith(" -W %h:%p ubuntu@203.0.113.10")
    assert argv[-1] == "ubuntu@10.0.0.4"


# --- the local session channel, for real: a network namespace with a server in it -----------------------------

@pytest.fixture
def namespace() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    name = f"fmc-chan-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name, "127.0.0.1"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_the_local_session_channel_carries_bytes_to_a_port_inside_the_instance_s_own_network(
        namespace: tuple[str, str]) -> None:
    name, address = namespace
    server = subprocess.Popen(
        ["ip", "netns", "exec", name, sys.executable, "-c",
         "import socket; s = socket.create_server(('127.0.0.1', 47122)); print('ready', flush=True); "
         "c, _ = s.accept(); data = b''\n"
         "while chunk := c.recv(4096): data += chunk\n"
         "c.sendall(b'echo:' + data); c.close()"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        done = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-I", channel.__file__, address, "47122"],
                              input=b"hello " * 20000, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout == b"echo:" + b"hello " * 20000
        # Nothing listens at this port of this machine's own network: the channel ran inside the namespace.
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", 47122)) != 0
    finally:
        server.kill()
        server.wait()


def test_the_channel_names_what_it_could_not_reach(namespace: tuple[str, str]) -> None:
    name, address = namespace
    done = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-I", channel.__file__, address, "47123"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and f"cannot reach {address}:47123 inside the instance" in done.stderr


def test_the_node_list_is_read_again_only_when_the_inventory_changes(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.providers import known_nodes

    root = _root_with_nodes(tmp_path, "stockmark", [CONTROLLER, PRIVATE_LOGIN], {})
    monkeypatch.setenv("FMCLUSTER_ROOT", str(root))
    first = known_nodes("stockmark")
    assert first == [CONTROLLER, PRIVATE_LOGIN] and known_nodes("stockmark") is first
    hosts = root / "inventories" / "stockmark" / "generated" / "hosts.yml"
    hosts.write_text(yaml.safe_dump({"all": {"vars": {"fmcluster_nodes": [CONTROLLER.as_dict(), LOGIN.as_dict()]}}}))
    os.utime(hosts, ns=(hosts.stat().st_atime_ns, hosts.stat().st_mtime_ns + 1_000_000))
    assert known_nodes("stockmark") == [CONTROLLER, LOGIN]


def _as_sshd_runs_it(argv: list[str], command: str, user_at: str) -> subprocess.CompletedProcess[str]:
    """What the node runs for `ssh ... user@host <args>`: ssh joins the arguments after the destination with spaces
    and sshd hands that text to the user's shell as `-c` (no login shell: nothing of /etc/profile.d), here with
    the PATH sshd gives a session (Ubuntu's /etc/environment)."""
    text = " ".join([*argv[argv.index(user_at) + 1:], command])
    return subprocess.run(["bash", "-c", text], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})


@pytest.mark.parametrize("org", ["pclab", "neuronlab", "stockmark"])
def test_slurm_commands_over_ssh_find_the_image_s_slurm_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                org: str) -> None:
    """ParallelCluster puts /opt/slurm/bin on PATH only in /etc/profile.d/slurm.sh (its cookbook's slurm/config.rb),
    which a command run over ssh never reads: every `sinfo`/`sbatch`/`scontrol show node` of the deploy, acceptance,
    `invoke nodes/slurm/usage` and doctor was "command not found" there (locally Debian's Slurm is in /usr/bin)."""
    from fmcluster.images import load_images

    monkeypatch.setenv("FMCLUSTER_ROOT", str(_root_with_nodes(tmp_path, org, [CONTROLLER, LOGIN], {})))
    monkeypatch.setattr("fmcluster.providers.aws.AwsProvider.route",
                        lambda self, node: route_to(node, [node], "key", "ubuntu", session))
    tenant = load_tenant(org, tmp_path)
    image = scheduler_for(tenant).image(tenant.controller.accelerator)
    wanted = load_images()[image].contract.slurm_bin_dir
    argv = provider_for(tenant).client_argv(LOGIN)
    path = _as_sshd_runs_it(argv, 'printf %s "$PATH"', "ubuntu@203.0.113.10").stdout.split(":")
    if wanted is None:  # the distribution's Slurm, in /usr/bin: the command goes as it is
        assert argv[-1] == "ubuntu@203.0.113.10" and "/opt/slurm/bin" not in path
    else:
        assert wanted in path, (org, path)
    assert _as_sshd_runs_it(argv, "echo 'a b'", "ubuntu@203.0.113.10").stdout == "a b\n"  # the command is untouched
    expected = {"pclab": "/opt/slurm/bin", "neuronlab": "/opt/slurm/bin", "stockmark": None}[org]
    assert wanted == expected


def test_acceptance_drains_through_sudo_with_the_image_s_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sudo runs its command with its own secure_path, which ParallelCluster writes without /opt/slurm/bin
    (aws-parallelcluster-cookbook, recipes/install/sudo_install.rb): `sudo -n scontrol update ... state=drain`, the
    acceptance gate's drain of a failing node, was "command not found" there. The gate's client names root's
    scontrol by the image contract's path; here a sudo that resets PATH as secure_path does proves it reaches it."""
    import dataclasses

    from fmcluster.acceptance import gate
    from fmcluster.acceptance.slurm import SlurmClient, SlurmError

    captured: list[SlurmClient] = []
    monkeypatch.setattr(gate, "run_acceptance", lambda tenant, client, *a, **k: captured.append(client))
    monkeypatch.setattr("fmcluster.providers.aws.AwsProvider.route",
                        lambda self, node: route_to(node, [node], "key", "ubuntu", session))
    for org in ("pclab", "stockmark"):
        monkeypatch.setenv("FMCLUSTER_ROOT", str(_root_with_nodes(tmp_path / org, org, [CONTROLLER, LOGIN], {})))
        tenant = load_tenant(org, tmp_path / org)
        gate.run_gate(tenant, provider_for(tenant), [CONTROLLER, LOGIN], print)
    pclab, stockmark = captured
    assert pclab.slurm_bin_dir == "/opt/slurm/bin" and stockmark.slurm_bin_dir is None

    # The same client, its ssh replaced by a local shell, its Slurm directory by one this test can write.
    bin_dir, slurm_dir = tmp_path / "bin", tmp_path / "opt-slurm" / "bin"
    for folder in (bin_dir, slurm_dir):
        folder.mkdir(parents=True)
    (bin_dir / "sudo").write_text('#!/bin/sh\n[ "$1" = -n ] && shift\nPATH=/usr/sbin:/usr/bin:/sbin:/bin exec "$@"\n')
    (slurm_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    for program in (bin_dir / "sudo", slurm_dir / "scontrol"):
        program.chmod(0o755)
    local = dataclasses.replace(pclab, prefix=("bash", "-c"), slurm_bin_dir=str(slurm_dir),
                                env={"PATH": f"{bin_dir}:{slurm_dir}:/usr/bin:/bin"})  # the operator's PATH has it
    local.drain("gpu-st-p5-48xlarge-1", "fmcluster acceptance: busbw 12 GB/s")
    local.resume("gpu-st-p5-48xlarge-1")
    assert (tmp_path / "scontrol.log").read_text().splitlines() == [
        "update nodename=gpu-st-p5-48xlarge-1 state=drain reason=fmcluster acceptance: busbw 12 GB/s",
        "update nodename=gpu-st-p5-48xlarge-1 state=resume"]
    with pytest.raises(SlurmError, match="scontrol"):  # by name, sudo's PATH does not find it
        dataclasses.replace(local, slurm_bin_dir=None).drain("gpu-st-p5-48xlarge-1", "x")


def test_a_local_instance_whose_host_is_gone_is_unreachable_as_session_manager_says_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node of a local tenant whose host no longer exists (halted and removed, or never booted): its session
    fails as Session Manager's does for an instance that is gone (TargetNotConnected, ssh exits 255), so `invoke
    doctor`, `fleet` and `nodes` count that node unreachable and go on, instead of ending in a traceback."""
    monkeypatch.setenv("FMCLUSTER_ROOT", str(_root_with_nodes(tmp_path, "demo", [CONTROLLER], {})))
    route = provider_for(load_tenant("demo", tmp_path)).route(CONTROLLER)
    done = subprocess.run(list(route.proxy), capture_output=True, text=True, timeout=10)
    assert done.returncode == 255
    assert done.stderr.startswith("TargetNotConnected: no local host for instance 'i-0c0000000000000c1' ('ip-10-0-0-4')")


def test_the_job_log_directory_is_made_by_root_for_the_operator_where_the_operator_cannot(tmp_path: Path) -> None:
    """The acceptance gate's logs go under the Lustre mount (e.g. /fsx/fmcluster/acceptance/<run>), made by the operator
    over ssh; on ParallelCluster (and HyperPod) the mount is the service's and no fmcluster role runs on it, so where
    the operator may not create it the client asks root (sudo -n, as drain does) for it, owned by the operator; the
    jobs, which run as the operator, write there."""
    from fmcluster.acceptance.slurm import SlurmClient, SlurmError

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The operator's mkdir is refused (a root-owned mount); sudo runs the command as root would, and says what it ran.
    (bin_dir / "mkdir").write_text("#!/bin/sh\necho \"mkdir: cannot create directory: Permission denied\" >&2\nexit 1\n")
    (bin_dir / "sudo").write_text(f'#!/bin/sh\n[ "$1" = -n ] && shift\necho "$@" >> {tmp_path}/sudo.log\n'
                                  'PATH=/usr/sbin:/usr/bin:/sbin:/bin exec "$@"\n')
    for program in ("mkdir", "sudo"):
        (bin_dir / program).chmod(0o755)
    client = SlurmClient(prefix=("bash", "-c"), env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    run_dir = tmp_path / "fsx" / "fmcluster" / "acceptance" / "20261206T000000Z"
    client.make_dir(PurePosixPath(str(run_dir)))
    assert run_dir.is_dir() and oct(run_dir.stat().st_mode & 0o777) == "0o755"
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    assert (tmp_path / "sudo.log").read_text().splitlines() == [f"install -d -m 0755 -o {user} {run_dir}"]
    assert run_dir.stat().st_uid == os.getuid()

    (bin_dir / "mkdir").write_text("#!/bin/sh\necho \"mkdir: cannot create directory: Read-only file system\" >&2\nexit 1\n")
    with pytest.raises(SlurmError, match="Read-only file system"):  # not a matter of who: said as it is, no sudo
        client.make_dir(PurePosixPath(str(run_dir / "elsewhere")))
    assert len((tmp_path / "sudo.log").read_text().splitlines()) == 1
    (bin_dir / "mkdir").write_text("#!/bin/sh\necho \"mkdir: cannot create directory: Permission denied\" >&2\nexit 1\n")
    (bin_dir / "sudo").write_text("#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n")
    with pytest.raises(SlurmError, match="a password is required"):  # refused: said, never a silent gap
        client.make_dir(PurePosixPath(str(run_dir / "again")))
