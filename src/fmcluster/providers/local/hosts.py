"""Local hosts: the machines of a provider-`local` tenant, each made of Linux namespaces on this machine.

A host stands in for one EC2 instance. It has
- its own network: a network namespace whose `eth0` (one end of a veth pair, the other on the tenant's
  bridge) carries the instance's private address; the whole VPC range is on-link, so hosts reach each other
  and the bridge (which holds each subnet's router address, `.1`, as the VPC router does) without routing;
- its own hostname: a UTS namespace set to the instance's private DNS name (`ip-10-77-128-4`);
- its own filesystem: a mount namespace whose root is an overlay of its image (provider local: the pristine
  Debian 12 root file system of fmcluster.providers.local.image, which holds nothing of this machine's) with a
  private writable layer, and fresh /run and /tmp.
So every role uses the same paths as on AWS (/etc/slurm, /etc/munge, /etc/fmcluster, /opt/fmcluster) and no
host sees another's files. Processes share this machine's kernel and process table; the clock is shared too.

Namespaces outlive the processes in them through bind-mounted handles under `<substrate>/ns/`. Everything a
tenant has here lives under `substrate_root(org)` and goes with `remove_all`.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Parent of every tenant's substrate directory; $FMCLUSTER_SUBSTRATE_ROOT overrides it (tests).
DEFAULT_SUBSTRATE_ROOT = Path("/var/lib/fmcluster-substrate")
#: Size cap of the tmpfs that holds every host's writable layer (configuration, logs, spool, and everything first boot
#: installs: about 0.5 GiB a node). Only what is written takes memory.
LAYERS_SIZE = "16g"
IFNAMSIZ = 15


class SubstrateError(RuntimeError):
    """A local host could not be created, reached or removed; the message says what to do."""


@dataclass(frozen=True)
class Bind:
    """A directory of this machine bound into a host (shared storage, the toolchain image)."""

    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class HostSpec:
    """What a host is made from: an instance's id, name, address and what its image carries."""

    key: str  # the instance id: names the host's namespaces and directories
    hostname: str
    address: str
    prefixlen: int  # of the instance's subnet
    vpc_cidr: str  # on-link from the host
    binds: tuple[Bind, ...] = ()
    hidden: tuple[str, ...] = ()  # directories of the image the host must not see (empty tmpfs over them)
    image: str = "/"  # the root file system the host's root is an overlay of


@dataclass(frozen=True)
class Host:
    """A host that exists on this machine."""

    org: str
    key: str
    hostname: str
    address: str
    netns: str
    host_veth: str
    spec: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    def ns_handle(self, kind: str) -> Path:
        return substrate_root(self.org) / "ns" / f"{self.key}.{kind}"

    def nsenter(self) -> list[str]:
        """argv prefix that runs a command inside this host (its network, filesystem and hostname)."""
        return ["nsenter", f"--net={self.netns_path}", f"--mount={self.ns_handle('mnt')}",
                f"--uts={self.ns_handle('uts')}", "--wdns=/"]


def substrate_root(org: str) -> Path:
    return Path(os.environ.get("FMCLUSTER_SUBSTRATE_ROOT", str(DEFAULT_SUBSTRATE_ROOT))) / org


def _tag(org: str) -> str:
    """Short tag for kernel object names (IFNAMSIZ is 15): a name of up to 7 characters as it is; a longer one
    as its first two characters, '_' and 4 characters of its hash. No tenant name holds '_' (validation's
    ORG_PATTERN), so a hashed tag never equals a short name (`neu38fd` and `neuronlab` used to collide)."""
    if len(org) <= 7:
        return org
    digest = base64.b32encode(hashlib.sha256(org.encode()).digest()).decode("ascii").lower()
    return f"{org[:2]}_{digest[:4]}"


def bridge_name(org: str) -> str:
    return f"fmcbr-{_tag(org)}"


def _run(argv: Sequence[str], check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, input=input_text)
    if check and proc.returncode != 0:
        raise SubstrateError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    return _run(argv, check=False).returncode == 0


def _addresses(dev: str, netns: str | None = None) -> list[str]:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "-4", "addr", "show", "dev", dev]
    proc = _run(argv, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    return [f"{a['local']}/{a['prefixlen']}" for link in json.loads(proc.stdout) for a in link.get("addr_info", [])]


def _is_mountpoint(path: Path) -> bool:
    return _run(["mountpoint", "-q", str(path)], check=False).returncode == 0


def require_root() -> None:
    if os.geteuid() != 0:
        raise SubstrateError("local hosts need root (namespaces, veth, bridge, mounts); run as root")
    for tool in ("ip", "nsenter", "unshare", "mount", "mountpoint"):
        if not shutil.which(tool):
            raise SubstrateError(f"{tool} is missing; run scripts/bootstrap.sh (iproute2, util-linux)")


# --- the tenant's network: one bridge, the VPC router addresses -------------------------------------------

def ensure_network(org: str, vpc_cidr: str, routers: Iterable[str]) -> bool:
    """The tenant's bridge with each subnet's router address (`10.77.128.1/17`). Returns whether it changed.

    The VPC range must not overlap any address this machine already has on another interface (another
    tenant's VPC, the host network): the nodes' traffic would go astray."""
    require_root()
    bridge = bridge_name(org)
    vpc = ipaddress.IPv4Network(vpc_cidr)
    for ifname, iface in _host_addresses():
        if ifname != bridge and iface.network.overlaps(vpc):
            raise SubstrateError(f"network.vpc_cidr {vpc} overlaps {iface} on {ifname} (another local tenant or "
                                 "this machine's own network); give this tenant another vpc_cidr")
    changed = False
    if not _link_exists(bridge):
        _run(["ip", "link", "add", "name", bridge, "type", "bridge"])
        changed = True
    have = _addresses(bridge)
    for router in routers:
        if router not in have:
            _run(["ip", "addr", "add", router, "dev", bridge])
            changed = True
    _run(["ip", "link", "set", bridge, "up"])
    return changed


def _host_addresses() -> list[tuple[str, ipaddress.IPv4Interface]]:
    proc = _run(["ip", "-j", "-4", "addr", "show"], check=False)
    return [(link["ifname"], ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}"))
            for link in json.loads(proc.stdout or "[]") for a in link.get("addr_info", [])]


def router_address(subnet_cidr: str) -> str:
    """The subnet's first host address, which AWS reserves for the VPC router: the bridge holds it."""
    net = ipaddress.IPv4Network(subnet_cidr)
    return f"{net.network_address + 1}/{net.prefixlen}"


# --- state -----------------------------------------------------------------------------------------------

def _state_path(org: str) -> Path:
    return substrate_root(org) / "hosts.json"


def load_hosts(org: str) -> list[Host]:
    path = _state_path(org)
    if not path.is_file():
        return []
    return [Host(**raw) for raw in json.loads(path.read_text())["hosts"]]


def _save_hosts(org: str, hosts: Sequence[Host]) -> None:
    path = _state_path(org)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"hosts": [asdict(h) for h in hosts]}, indent=2) + "\n")
    tmp.replace(path)


def _ensure_substrate_dirs(org: str) -> None:
    root = substrate_root(org)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    ns = root / "ns"
    ns.mkdir(exist_ok=True)
    if not _is_mountpoint(ns):  # namespace handles need a private mount to be bound onto
        _run(["mount", "--bind", str(ns), str(ns)])
        _run(["mount", "--make-private", str(ns)])
    layers = root / "layers"
    layers.mkdir(exist_ok=True)
    if not _is_mountpoint(layers):  # another filesystem than /, or overlay refuses an upper layer inside its lower
        _run(["mount", "-t", "tmpfs", "-o", f"size={LAYERS_SIZE},mode=0700", f"fmcluster-{org}", str(layers)])


# --- one host --------------------------------------------------------------------------------------------

def _veth_names(org: str, address: str, vpc_cidr: str) -> tuple[str, str]:
    offset = int(ipaddress.IPv4Address(address)) - int(ipaddress.IPv4Network(vpc_cidr).network_address)
    tag = _tag(org)
    return f"fm{tag}{offset:x}"[:IFNAMSIZ], f"fp{tag}{offset:x}"[:IFNAMSIZ]


def _root_script(spec: HostSpec, upper: Path, work: Path, merged: Path) -> str:
    """Shell run in the host's new mount namespace: overlay root, fresh /run and /tmp, binds, pivot_root."""
    lines = [
        "set -eu",
        f"mkdir -p {merged}",
        f"mount -t overlay overlay -o lowerdir={spec.image},upperdir={upper},workdir={work} {merged}",
        f"for d in proc sys dev; do mount --rbind /$d {merged}/$d; done",
        f"mount -t tmpfs -o mode=0755 tmpfs {merged}/run",
        f"mount -t tmpfs -o mode=1777 tmpfs {merged}/tmp",
        f"mkdir -p {merged}/run/sshd {merged}/run/lock",
    ]
    for hidden in spec.hidden:
        lines.append(f"[ -d {merged}{hidden} ] && mount -t tmpfs -o mode=0755 tmpfs {merged}{hidden} || true")
    for bind in spec.binds:
        target = f"{merged}{bind.target}"
        lines.append(f"mkdir -p {target} && mount --bind {bind.source} {target}")
        if bind.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    lines += [f"cd {merged}", "mkdir -p .oldroot", "pivot_root . .oldroot", "umount -l /.oldroot",
              "rmdir /.oldroot"]
    return "\n".join(lines) + "\n"


def ensure_host(org: str, spec: HostSpec, bridge: str) -> tuple[Host, bool]:
    """Create the host (or check the one there); returns it and whether anything was created."""
    host_veth, peer = _veth_names(org, spec.address, spec.vpc_cidr)
    host = Host(org, spec.key, spec.hostname, spec.address, f"fmc-{org}-{spec.key}"[:64], host_veth,
                {"binds": [asdict(b) for b in spec.binds], "image": spec.image})
    changed = False
    if not Path(host.netns_path).exists():
        _run(["ip", "netns", "add", host.netns])
        changed = True
    _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
    if not _link_exists("eth0", host.netns):
        if _link_exists(host_veth):
            _run(["ip", "link", "del", host_veth])
        _run(["ip", "link", "add", host_veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", host.netns])
        _run(["ip", "-n", host.netns, "link", "set", peer, "name", "eth0"])
        changed = True
    want = f"{spec.address}/{spec.prefixlen}"
    if _addresses("eth0", host.netns) != [want]:
        _run(["ip", "-n", host.netns, "addr", "flush", "dev", "eth0"])
        _run(["ip", "-n", host.netns, "addr", "add", want, "dev", "eth0"])
        changed = True
    _run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
    _run(["ip", "-n", host.netns, "route", "replace", spec.vpc_cidr, "dev", "eth0"])
    _run(["ip", "link", "set", host_veth, "master", bridge, "up"])

    mnt, uts = host.ns_handle("mnt"), host.ns_handle("uts")
    if not (_is_mountpoint(mnt) and _is_mountpoint(uts)):
        for handle in (mnt, uts):
            if _is_mountpoint(handle):
                _run(["umount", str(handle)])
            handle.touch()
        layer = substrate_root(org) / "layers" / spec.key
        upper, work = layer / "upper", layer / "work"
        shutil.rmtree(layer, ignore_errors=True)  # a host that lost its namespaces starts from the image again
        upper.mkdir(parents=True)
        work.mkdir()
        _run(["unshare", f"--mount={mnt}", f"--uts={uts}", "--propagation", "private", "true"])
        merged = substrate_root(org) / "roots" / spec.key
        merged.mkdir(parents=True, exist_ok=True)
        _run(["nsenter", f"--mount={mnt}", "sh", "-s"], input_text=_root_script(spec, upper, work, merged))
        _run(["nsenter", f"--uts={uts}", "hostname", spec.hostname])
        changed = True
    return host, changed


def remove_host(host: Host) -> None:
    """Stop every process of the host and remove its namespaces, veth and writable layer."""
    if Path(host.netns_path).exists():
        terminate(netns_pids(host.netns))
        _run(["ip", "netns", "del", host.netns], check=False)
    if _link_exists(host.host_veth):
        _run(["ip", "link", "del", host.host_veth], check=False)
    for kind in ("mnt", "uts"):
        handle = host.ns_handle(kind)
        if _is_mountpoint(handle):
            _run(["umount", "-l", str(handle)], check=False)
        handle.unlink(missing_ok=True)
    shutil.rmtree(substrate_root(host.org) / "layers" / host.key, ignore_errors=True)
    shutil.rmtree(substrate_root(host.org) / "roots" / host.key, ignore_errors=True)


def reconcile_hosts(org: str, specs: Sequence[HostSpec], bridge: str) -> tuple[list[Host], list[Host], list[Host]]:
    """Make the tenant's hosts exactly `specs`: (hosts, created, removed). Idempotent."""
    require_root()
    _ensure_substrate_dirs(org)
    existing = {h.key: h for h in load_hosts(org)}
    wanted = {s.key for s in specs}
    removed = [h for key, h in existing.items() if key not in wanted]
    for host in removed:
        remove_host(host)
    hosts: list[Host] = []
    created: list[Host] = []
    for spec in specs:
        host, changed = ensure_host(org, spec, bridge)
        hosts.append(host)
        if changed:
            created.append(host)
        _save_hosts(org, hosts)  # after each: a failure part-way leaves every made host known, for removal
    _save_hosts(org, hosts)
    return hosts, created, removed


def forget_host(org: str, key: str) -> None:
    _save_hosts(org, [h for h in load_hosts(org) if h.key != key])


def remove_all(org: str) -> list[str]:
    """Remove every host, the bridge and the substrate directory of the tenant; returns what went."""
    require_root()
    gone = []
    for host in load_hosts(org):
        remove_host(host)
        gone.append(f"host {host.hostname} ({host.address})")
    root = substrate_root(org)
    for handle in sorted((root / "ns").glob("*")) if (root / "ns").is_dir() else []:
        if _is_mountpoint(handle):
            _run(["umount", "-l", str(handle)], check=False)
    for mount in (root / "ns", root / "layers"):
        if _is_mountpoint(mount):
            _run(["umount", "-l", str(mount)], check=False)
    bridge = bridge_name(org)
    if _link_exists(bridge):
        _run(["ip", "link", "del", bridge])
        gone.append(f"bridge {bridge}")
    if root.exists():
        shutil.rmtree(root)
        gone.append(str(root))
    return gone


# --- running things in a host ----------------------------------------------------------------------------

def host_run(host: Host, argv: Sequence[str], env: dict[str, str] | None = None, timeout: float | None = None,
             input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv inside the host as root, with exactly `env` (a fresh login-like environment when None)."""
    base = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    return subprocess.run([*host.nsenter(), "env", "-i", *[f"{k}={v}" for k, v in {**base, **(env or {})}.items()],
                           *argv], capture_output=True, text=True, timeout=timeout, input=input_text)


def host_spawn(host: Host, argv: Sequence[str], env: dict[str, str], log: str) -> int:
    """Start argv detached inside the host (its own session), output appended to `log` (a path in the host)."""
    quoted = " ".join(_shell_quote(a) for a in argv)
    script = f"mkdir -p $(dirname {_shell_quote(log)}) && exec {quoted} >>{_shell_quote(log)} 2>&1 </dev/null"
    proc = subprocess.Popen([*host.nsenter(), "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                             "setsid", "sh", "-c", script],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    return proc.pid


def _shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def netns_pids(netns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in proc.stdout.split() if p.strip().isdigit()]


def terminate(pids: Iterable[int], timeout: float = 10.0) -> None:
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
