"""The local node provider: every node of a provider-`local` tenant as a network namespace on this machine.

Each node (controller, login nodes, every compute node of every queue) gets its own network namespace with
one interface `eth0` holding an address from `tenant.network.local_subnet`; the other end of that veth pair
is enslaved to a per-tenant bridge that carries the subnet's first address, so this machine (where Ansible
and the Slurm clients run) reaches every node directly. Ansible reaches a node over ssh to an sshd started
inside the node's namespace (`nsenter --net=/run/netns/<ns> sshd ...`) with a per-tenant generated key; the
processes Ansible starts over that ssh (munged, slurmctld, slurmd) therefore live in that node's namespace.
The nodes share this machine's filesystem, hostname and process table: only the network is separate.
Why this design, and what it does not isolate: docs/local-nodes.md.

Everything is per tenant, so two tenants' local clusters coexist: names derive from the org
(`names_for(org)`), runtime files live under `runtime_root(org)` (= /var/lib/fmcluster/<org>), the ssh keys
under `.secrets/<org>/ssh/`. `nodes_up` is idempotent (a second call changes nothing) and reconciles to the
spec (nodes no longer in the spec are removed); `nodes_down` removes every namespace, veth, bridge,
process and runtime file it created.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from fmcluster.model import Tenant
from fmcluster.paths import repo_root, secrets_dir

Role = Literal["controller", "login", "compute"]
Out = Callable[[str], object]

#: Default parent of every tenant's runtime directory; $FMCLUSTER_LOCAL_ROOT overrides it (tests).
DEFAULT_LOCAL_ROOT = Path("/var/lib/fmcluster")
SSHD = "/usr/sbin/sshd"
IFNAMSIZ = 15  # Linux interface names are at most 15 characters


class LocalNodesError(RuntimeError):
    """A local node could not be created or removed; the message says what to do."""


@dataclass(frozen=True)
class NodeSpec:
    """A node the tenant asks for: its inventory/Slurm name, role and queue (None unless compute)."""

    name: str
    role: Role
    queue: str | None = None


@dataclass(frozen=True)
class LocalNode:
    """A node that exists on this machine: a namespace with one address on the tenant's bridge."""

    name: str
    role: Role
    queue: str | None
    address: str
    netns: str
    host_veth: str

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"


@dataclass(frozen=True)
class Names:
    """Every kernel object name of one tenant. Interface names fit IFNAMSIZ (15) for any valid org."""

    org: str
    tag: str

    @property
    def bridge(self) -> str:
        return f"fmcbr-{self.tag}"

    def netns(self, node: str) -> str:
        return f"fmc-{self.org}-{node}"

    def host_veth(self, index: int) -> str:
        return f"fm{self.tag}-{index}"

    def peer_veth(self, index: int) -> str:
        return f"fp{self.tag}-{index}"


def names_for(org: str) -> Names:
    """Short, collision-resistant tag: the org itself up to 7 characters, else 3 characters + 4 hex of its hash."""
    tag = org if len(org) <= 7 else org[:3] + hashlib.sha1(org.encode()).hexdigest()[:4]
    return Names(org=org, tag=tag)


def runtime_root(org: str) -> Path:
    """Per-tenant runtime directory: Slurm/munge config, state, spool, logs, sockets and the nodes' sshd files.

    Outside the checkout on purpose: munged and slurmctld (running as the munge/slurm users) must traverse
    every ancestor, munged refuses group/world-writable ancestors, unix socket paths must stay short, and a
    `git clean` must not pull files from under running daemons. `nodes_down` removes it entirely.
    """
    return Path(os.environ.get("FMCLUSTER_LOCAL_ROOT", str(DEFAULT_LOCAL_ROOT))) / org


def ssh_key_path(org: str) -> Path:
    """The per-tenant private key Ansible uses to reach the nodes (public key next to it, `.pub`)."""
    return secrets_dir(org) / "ssh" / "id_ed25519"


def control_path_dir(org: str) -> Path:
    """Where Ansible's ssh ControlPersist sockets for this tenant live, so `nodes_down` can close them."""
    return runtime_root(org) / "ssh-control"


def plan(tenant: Tenant) -> list[NodeSpec]:
    """The nodes the spec asks for, in a stable order: controller-1, login-1..N, then <queue>-1..count per queue.

    Every name is `<role or queue>-<i>`: compute nodes (the Slurm NodeNames) are `<queue>-<i>` (e.g.
    cpu-1..cpu-3), unique per tenant, valid hostnames, and say which partition a node belongs to. No node is
    named like an inventory group (`controller`, `login`), which Ansible would warn about.
    """
    specs = [NodeSpec("controller-1", "controller")]
    specs += [NodeSpec(f"login-{i}", "login") for i in range(1, tenant.login_count + 1)]
    for q in tenant.queues:
        specs += [NodeSpec(f"{q.name}-{i}", "compute", q.name) for i in range(1, q.count + 1)]
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise LocalNodesError(f"node name {s.name!r} is used twice (a queue named like a role?); "
                                  "rename the queue in the tenant spec")
        seen.add(s.name)
    return specs


# --- small helpers around iproute2 ---------------------------------------------------------------------

def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LocalNodesError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    return _run(argv, check=False).returncode == 0


def _netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def _addresses(dev: str, netns: str | None = None) -> list[str]:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "-4", "addr", "show", "dev", dev]
    proc = _run(argv, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    return [f"{a['local']}/{a['prefixlen']}" for link in json.loads(proc.stdout) for a in link.get("addr_info", [])]


def _host_addresses() -> list[tuple[str, ipaddress.IPv4Interface]]:
    proc = _run(["ip", "-j", "-4", "addr", "show"], check=False)
    found = []
    for link in json.loads(proc.stdout or "[]"):
        for a in link.get("addr_info", []):
            found.append((link["ifname"], ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}")))
    return found


def _pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _netns_pids(netns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in proc.stdout.split() if p.strip().isdigit()]


def _terminate(pids: Iterable[int], timeout: float = 10.0) -> None:
    pending = set(pids)
    for pid in pending:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if Path(f"/proc/{p}").exists() and not _is_zombie(p)}
        time.sleep(0.1)
    for pid in pending:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


# --- state ----------------------------------------------------------------------------------------------

def _state_path(org: str) -> Path:
    return runtime_root(org) / "nodes.json"


def load_nodes(org: str) -> list[LocalNode]:
    """The nodes nodes_up created for `org` (empty when none are up)."""
    path = _state_path(org)
    if not path.is_file():
        return []
    return [LocalNode(**raw) for raw in json.loads(path.read_text())["nodes"]]


def _owner(org: str) -> str | None:
    """The checkout whose nodes_up created the tenant's nodes on this machine (None when none are up)."""
    path = _state_path(org)
    checkout = json.loads(path.read_text()).get("checkout") if path.is_file() else None
    return str(checkout) if checkout else None


def _save_nodes(org: str, nodes: list[LocalNode]) -> None:
    path = _state_path(org)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"checkout": str(repo_root()), "nodes": [asdict(n) for n in nodes]}, indent=2) + "\n")
    tmp.replace(path)


def _allocate(tenant: Tenant, specs: list[NodeSpec], existing: list[LocalNode]) -> list[LocalNode]:
    """Addresses stay with their node across runs; new nodes take the lowest free host address (bridge = first)."""
    net = ipaddress.IPv4Network(tenant.network.local_subnet)
    hosts = list(net.hosts())
    if len(hosts) < len(specs) + 1:
        raise LocalNodesError(f"network.local_subnet {net} has room for {len(hosts) - 1} nodes, the spec asks for "
                              f"{len(specs)}; use a larger subnet")
    names = names_for(tenant.org)
    kept = {n.name: n for n in existing if ipaddress.IPv4Address(n.address) in net}
    used = {n.address for n in kept.values()}
    free = (h for h in hosts[1:] if str(h) not in used)
    nodes = []
    for s in specs:
        if s.name in kept and kept[s.name].role == s.role and kept[s.name].queue == s.queue:
            nodes.append(kept[s.name])
            continue
        addr = next(free)
        offset = int(addr) - int(net.network_address)
        nodes.append(LocalNode(s.name, s.role, s.queue, str(addr), names.netns(s.name), names.host_veth(offset)))
    return nodes


def bridge_address(tenant: Tenant) -> ipaddress.IPv4Interface:
    """The bridge's own address (the subnet's first host): where this machine is seen from the nodes."""
    net = ipaddress.IPv4Network(tenant.network.local_subnet)
    return ipaddress.IPv4Interface(f"{net.network_address + 1}/{net.prefixlen}")


# --- ssh ------------------------------------------------------------------------------------------------

SSHD_CONFIG = """\
# generated by fmcluster (fmcluster.localnodes); edits will be reverted
# sshd of the local nodes of tenant {org}; one sshd per node namespace, ListenAddress/PidFile given on the command line.
Port 22
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
X11Forwarding no
PrintMotd no
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
"""


def _ensure_ssh_files(tenant: Tenant) -> Path:
    key = ssh_key_path(tenant.org)
    key.parent.mkdir(parents=True, exist_ok=True)
    for d in (key.parent.parent.parent, key.parent.parent, key.parent):  # .secrets, .secrets/<org>, ssh
        d.chmod(0o700)
    if not key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fmcluster-{tenant.org}", "-f", str(key)])
    host_key = key.parent / "ssh_host_ed25519_key"
    if not host_key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fmcluster-{tenant.org}-host", "-f", str(host_key)])
    sshd_dir = runtime_root(tenant.org) / "sshd"
    sshd_dir.mkdir(parents=True, exist_ok=True)
    sshd_dir.chmod(0o700)
    authorized = sshd_dir / "authorized_keys"
    pub = Path(str(key) + ".pub").read_text()
    if not authorized.exists() or authorized.read_text() != pub:
        authorized.write_text(pub)
        authorized.chmod(0o600)
    config = sshd_dir / "sshd_config"
    text = SSHD_CONFIG.format(org=tenant.org, host_key=host_key, authorized_keys=authorized)
    if not config.exists() or config.read_text() != text:
        config.write_text(text)
    # sshd's privilege-separation directory; Debian's openssh-server creates it at boot, which never ran here.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    return config


def _sshd_pidfile(org: str, node: str) -> Path:
    return runtime_root(org) / "sshd" / f"{node}.pid"


def _wait_for_ssh(nodes: list[LocalNode], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    for node in nodes:
        while True:
            try:
                with socket.create_connection((node.address, 22), timeout=1):
                    break
            except OSError as err:
                if time.monotonic() > deadline:
                    raise LocalNodesError(f"sshd of node {node.name} ({node.address}) does not answer: {err}") from None
                time.sleep(0.1)


# --- public API -----------------------------------------------------------------------------------------

def _require_root() -> None:
    if os.geteuid() != 0:
        raise LocalNodesError("local nodes need root (network namespaces, veth, bridge); run as root")
    for tool in ("ip", "nsenter", "ssh-keygen", SSHD):
        if not shutil.which(tool):
            raise LocalNodesError(f"{tool} is missing; run scripts/bootstrap.sh (iproute2, util-linux, openssh-server)")


def _check_subnet_free(tenant: Tenant, bridge: str) -> None:
    net = ipaddress.IPv4Network(tenant.network.local_subnet)
    for ifname, iface in _host_addresses():
        if ifname != bridge and iface.network.overlaps(net):
            raise LocalNodesError(f"network.local_subnet {net} overlaps {iface} on {ifname} (another tenant or the "
                                  "host network); give this tenant another local_subnet")


def _ensure_bridge(tenant: Tenant, out: Out) -> bool:
    names = names_for(tenant.org)
    addr = str(bridge_address(tenant))
    changed = False
    if not _link_exists(names.bridge):
        _run(["ip", "link", "add", "name", names.bridge, "type", "bridge"])
        changed = True
    if addr not in _addresses(names.bridge):
        _run(["ip", "addr", "add", addr, "dev", names.bridge])
        changed = True
    _run(["ip", "link", "set", names.bridge, "up"])
    if changed:
        out(f"  bridge {names.bridge} {addr}")
    return changed


def _ensure_node(tenant: Tenant, node: LocalNode, sshd_config: Path, out: Out) -> bool:
    names = names_for(tenant.org)
    prefix = ipaddress.IPv4Network(tenant.network.local_subnet).prefixlen
    changed = False
    if not _netns_exists(node.netns):
        _run(["ip", "netns", "add", node.netns])
        changed = True
    _run(["ip", "-n", node.netns, "link", "set", "lo", "up"])
    if not _link_exists("eth0", node.netns):
        if _link_exists(node.host_veth):
            _run(["ip", "link", "del", node.host_veth])
        peer = names.peer_veth(int(node.host_veth.rsplit("-", 1)[1]))
        _run(["ip", "link", "add", node.host_veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", node.netns])
        _run(["ip", "-n", node.netns, "link", "set", peer, "name", "eth0"])
        changed = True
    want = f"{node.address}/{prefix}"
    have = _addresses("eth0", node.netns)
    if have != [want]:
        _run(["ip", "-n", node.netns, "addr", "flush", "dev", "eth0"])
        _run(["ip", "-n", node.netns, "addr", "add", want, "dev", "eth0"])
        changed = True
    _run(["ip", "-n", node.netns, "link", "set", "eth0", "up"])
    _run(["ip", "link", "set", node.host_veth, "master", names.bridge, "up"])
    pidfile = _sshd_pidfile(tenant.org, node.name)
    if _pid_alive(pidfile) is None:
        _run(["nsenter", f"--net={node.netns_path}", SSHD, "-f", str(sshd_config),
              "-o", f"ListenAddress={node.address}", "-o", f"PidFile={pidfile}"])
        changed = True
    if changed:
        out(f"  node {node.name:<14} {node.address:<15} netns {node.netns}")
    return changed


def _remove_node(node: LocalNode, out: Out) -> None:
    if _netns_exists(node.netns):
        _terminate(_netns_pids(node.netns))
        _run(["ip", "netns", "del", node.netns], check=False)
    if _link_exists(node.host_veth):
        _run(["ip", "link", "del", node.host_veth], check=False)
    out(f"  removed node {node.name} ({node.netns})")


def nodes_up(tenant: Tenant, out: Out = print) -> list[LocalNode]:
    """Create (or reconcile) the tenant's local nodes; return them. A second call changes nothing."""
    if tenant.provider != "local":
        raise LocalNodesError(f"tenant {tenant.org} has provider {tenant.provider}; local nodes are for provider local")
    _require_root()
    owner = _owner(tenant.org)
    if owner is not None and owner != str(repo_root()):
        raise LocalNodesError(f"the local nodes of {tenant.org} are up from another checkout ({owner}); a tenant's "
                              f"local cluster is one per machine: run `invoke nodes-down --org={tenant.org}` there first")
    if not _link_exists(names_for(tenant.org).bridge):
        _check_subnet_free(tenant, names_for(tenant.org).bridge)
    root = runtime_root(tenant.org)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    existing = load_nodes(tenant.org)
    nodes = _allocate(tenant, plan(tenant), existing)
    wanted = {n.name for n in nodes}
    for gone in (n for n in existing if n.name not in wanted or n not in nodes):
        _remove_node(gone, out)
    sshd_config = _ensure_ssh_files(tenant)
    changed = _ensure_bridge(tenant, out)
    _save_nodes(tenant.org, nodes)
    for node in nodes:
        changed = _ensure_node(tenant, node, sshd_config, out) or changed
    _wait_for_ssh(nodes)
    if not changed:
        out(f"nodes-up: the {len(nodes)} local nodes of {tenant.org} are already up; nothing changed")
    return nodes


def nodes_down(tenant: Tenant, out: Out = print) -> None:
    """Remove every namespace, veth, bridge, process and runtime file nodes_up created for the tenant."""
    _require_root()
    names = names_for(tenant.org)
    known = {n.name: n for n in load_nodes(tenant.org)}
    for spec in plan(tenant):  # also what the spec implies, should the state file be gone
        known.setdefault(spec.name, LocalNode(spec.name, spec.role, spec.queue, "", names.netns(spec.name), ""))
    _close_control_masters(tenant.org)
    for node in known.values():
        if _netns_exists(node.netns) or (node.host_veth and _link_exists(node.host_veth)):
            _remove_node(node, out)
    if _link_exists(names.bridge):
        _run(["ip", "link", "del", names.bridge])
        out(f"  removed bridge {names.bridge}")
    root = runtime_root(tenant.org)
    if root.exists():
        shutil.rmtree(root)
        out(f"  removed {root}")
    try:
        root.parent.rmdir()  # only when no other tenant uses it
    except OSError:
        pass


def _close_control_masters(org: str) -> None:
    cp = control_path_dir(org)
    if not cp.is_dir():
        return
    for sock in cp.iterdir():
        subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "fmcluster-node"],
                       capture_output=True, check=False, timeout=10)


def node_named(tenant: Tenant, name: str) -> LocalNode:
    """The up node `name` of the tenant (raises when it is not up)."""
    for node in load_nodes(tenant.org):
        if node.name == name:
            return node
    raise LocalNodesError(f"node {name} of {tenant.org} is not up; run `invoke nodes-up --org={tenant.org}`")


def run_on_node(tenant: Tenant, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
                timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv inside node `name`'s network namespace (as root, on this machine's filesystem)."""
    node = node_named(tenant, name)
    return subprocess.run(["nsenter", f"--net={node.netns_path}", *argv], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)
