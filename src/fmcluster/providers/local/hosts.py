"""Local hosts: the machines of a provider-`local` tenant, each a container that boots systemd as an instance does.

A host stands in for one EC2 instance. It has
- its own network: a network namespace whose `eth0` (one end of a veth pair, the other on the tenant's
  bridge) carries the instance's private address; the whole VPC range is on-link, so hosts reach each other
  and the bridge (which holds each subnet's router address, `.1`, as the VPC router does) without routing;
- its own init: `systemd-nspawn --boot` (Debian's systemd-container) starts the image's systemd as PID 1 in the
  host's own PID, IPC, UTS and mount namespaces, joined to that network namespace; `ps -e` on a host lists
  only its own processes, and systemd starts its units, timers, mounts and cloud-init as on an instance;
- its own filesystem: the root is an overlay of its image (provider local: the pristine Debian 12 root file
  system of fmcluster.providers.local.image) with a private writable layer; only the shared-storage stand-ins
  are bound in.
So every role uses the same paths and the same service manager as on AWS. The kernel and the clock are this
machine's, but each boot has its own boot clock (a time namespace: uptime counts from the host's boot, as
Slurm's reboot detection needs). A reboot inside a host (`systemctl reboot`) boots it again, as an instance reboots; the console
(what an instance's serial console shows) goes to `<substrate>/console/<instance id>.log`.

Everything a tenant has here lives under `substrate_root(org)` and goes with `remove_all`.
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
from collections.abc import Callable, Iterable, Sequence
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

    @property
    def root(self) -> Path:
        """The host's root file system as this machine sees it (the overlay systemd-nspawn boots)."""
        return substrate_root(self.org) / "roots" / self.key

    @property
    def console(self) -> Path:
        return substrate_root(self.org) / "console" / f"{self.key}.log"

    def init_pid(self) -> int | None:
        """The pid (in this machine's PID namespace) of the host's PID 1, its systemd; None when it is down."""
        supervisor = read_pid(_pidfile(self.org, self.key))
        if supervisor is None:
            return None
        for nspawn in _children(supervisor):
            for init in _children(nspawn):
                return init
        return None

    def nsenter(self) -> list[str]:
        """argv prefix that runs a command inside this host: all of its PID 1's namespaces, its root."""
        pid = self.init_pid()
        if pid is None:
            raise SubstrateError(f"host {self.hostname} ({self.key}) is not running")
        return ["nsenter", "-t", str(pid), "--all"]


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
    for tool in ("ip", "nsenter", "systemd-nspawn", "unshare", "mount", "mountpoint"):
        if not shutil.which(tool):
            raise SubstrateError(f"{tool} is missing; run scripts/bootstrap.sh (iproute2, util-linux, "
                                 "systemd-container)")


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
    if _address_assigned_by(bridge) != _ADDRESS_SET:
        # A bridge whose address was never set takes the lowest of its ports' addresses, so it changes when a
        # host comes or goes: every node's ARP entry for the VPC router (the emulator, the metadata service) then
        # points nowhere until it expires, and their calls time out meanwhile. A set address never moves.
        _run(["ip", "link", "set", "dev", bridge, "address", bridge_mac(org)])
        changed = True
    have = _addresses(bridge)
    for router in routers:
        if router not in have:
            _run(["ip", "addr", "add", router, "dev", bridge])
            changed = True
    _run(["ip", "link", "set", bridge, "up"])
    return changed


#: /sys/class/net/*/addr_assign_type of an address set by hand (NET_ADDR_SET in the kernel's netdevice.h)
_ADDRESS_SET = 3


def bridge_mac(org: str) -> str:
    """The bridge's own hardware address: locally administered, unicast, the same for the tenant every time."""
    digest = hashlib.sha256(f"fmcluster bridge {org}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def _address_assigned_by(dev: str) -> int:
    try:
        return int(Path(f"/sys/class/net/{dev}/addr_assign_type").read_text())
    except (OSError, ValueError):
        return -1


#: how often the whole-machine address list is read again when the kernel interrupts its dump
_ADDRESS_DUMP_TRIES = 5


def _host_addresses() -> list[tuple[str, ipaddress.IPv4Interface]]:
    """Every IPv4 address on this machine. Raises when it cannot be read: an empty list would pass the overlap
    check on no evidence. `ip` exits non-zero with "Dump was interrupted" when an interface comes or goes during
    the read (another tenant's host booting), so an interrupted read is tried again."""
    argv = ["ip", "-j", "-4", "addr", "show"]
    proc = _run(argv, check=False)
    for _ in range(_ADDRESS_DUMP_TRIES - 1):
        if proc.returncode == 0 and proc.stdout.strip():
            break
        time.sleep(0.2)
        proc = _run(argv, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SubstrateError(f"`{' '.join(argv)}` failed {_ADDRESS_DUMP_TRIES} times ({proc.returncode}): "
                             f"{proc.stderr.strip() or 'no output'}; this machine's addresses are needed to "
                             "refuse a VPC range that overlaps them")
    return [(link["ifname"], ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}"))
            for link in json.loads(proc.stdout) for a in link.get("addr_info", [])]


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
    for name in ("run", "console", "roots"):
        (root / name).mkdir(exist_ok=True)
    layers = root / "layers"
    layers.mkdir(exist_ok=True)
    if not _is_mountpoint(layers):  # another filesystem than /, or overlay refuses an upper layer inside its lower
        _run(["mount", "-t", "tmpfs", "-o", f"size={LAYERS_SIZE},mode=0700", f"fmcluster-{org}", str(layers)])


# --- one host's init: systemd-nspawn --boot, restarted when the host reboots --------------------------------

#: systemd-nspawn's exit status when the container's systemd asked for a reboot (systemd-nspawn(1)).
NSPAWN_REBOOT = 133
#: Seconds between a guest's reboot and its next boot (the stand-in hypervisor's reboot).
REBOOT_PAUSE_S = 3
#: How long a host's systemd may take to come up before its boot is called failed.
INIT_TIMEOUT_S = 60.0


def _pidfile(org: str, key: str) -> Path:
    return substrate_root(org) / "run" / f"{key}.pid"


def read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() and not _is_zombie(pid) else None


def _children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(child) for child in found]


def _nspawn_argv(spec: HostSpec, host: Host) -> list[str]:
    argv = ["systemd-nspawn", "--boot", "--quiet",
            # No systemd-machined and no systemd on this machine to register with or to make a scope.
            "--register=no", "--keep-unit",
            f"--directory={host.root}", f"--network-namespace-path={host.netns_path}",
            f"--machine={host.netns}"[:74], f"--hostname={spec.hostname}",
            # Nothing of this machine's: not its resolver, time zone or journal.
            "--resolv-conf=off", "--timezone=off", "--link-journal=no", "--console=read-only",
            # An instance's root manages its own network (iptables: imds_guard); systemd-nspawn grants this only
            # with a network it makes itself. Not CAP_SYS_TIME or CAP_SYS_MODULE: the clock and the kernel are
            # this machine's.
            "--capability=CAP_NET_ADMIN"]
    argv += [f"--tmpfs={hidden}:mode=0755" for hidden in spec.hidden]
    argv += [f"--bind{'-ro' if b.read_only else ''}={b.source}:{b.target}" for b in spec.binds]
    return argv


def boot_host(host: Host, spec: HostSpec) -> None:
    """Start the host's init (systemd as PID 1); a reboot from inside boots it again, a poweroff ends it."""
    argv = _nspawn_argv(spec, host)
    # The loop stands in for the hypervisor: exit 133 is the guest's reboot. Each boot gets a time namespace whose
    # boot clock starts at zero (unshare(1) --time --boottime; it execs systemd-nspawn in it): the guest's uptime
    # (/proc/uptime, sysinfo(2)) counts from its own boot, as an instance's does, not from this machine's; slurmctld
    # reads a node's boot time so to know that `scontrol reboot` happened.
    # A guest's reboot takes REBOOT_PAUSE_S here (an instance's takes minutes): without it a guest reboots within the
    # second slurmctld asked it to, and its whole-second boot time reads as no reboot at all.
    boot = "unshare --time --boottime -$(cut -d. -f1 /proc/uptime) "
    loop = (f"while :; do {boot}{' '.join(_shell_quote(a) for a in argv)}; rc=$?; "
            f"[ $rc -eq {NSPAWN_REBOOT} ] || exit $rc; sleep {REBOOT_PAUSE_S}; done")
    host.console.parent.mkdir(parents=True, exist_ok=True)
    with host.console.open("ab") as console:
        proc = subprocess.Popen(["sh", "-c", loop], stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _pidfile(host.org, host.key).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + INIT_TIMEOUT_S
    while host.init_pid() is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(host.console.read_text(errors="replace").splitlines()[-8:])
            raise SubstrateError(f"host {host.hostname} did not boot (systemd-nspawn exit {proc.poll()}); "
                                 f"console {host.console}:\n{tail}")
        time.sleep(0.1)


def wait_running(host: Host, timeout_s: float = INIT_TIMEOUT_S) -> None:
    """Wait until the host's systemd has finished starting its units (running or degraded, as an instance's
    status checks see it); SubstrateError naming the failed units otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        # "offline": PID 1 does not answer on its bus yet (it has just been exec'd); --wait covers only the rest.
        done = host_run(host, ["systemctl", "is-system-running", "--wait"], timeout=timeout_s)
        state = done.stdout.strip()
        if state not in ("offline", "") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if state not in ("running", "degraded"):
        raise SubstrateError(f"host {host.hostname} did not finish booting (systemd: {state or done.stderr.strip()})")


def _stop_init(host: Host) -> None:
    """Take the host down hard, as pulling an instance's power: its supervisor first (no reboot loop), then every
    process in its PID namespace goes with its PID 1."""
    supervisor = read_pid(_pidfile(host.org, host.key))
    if supervisor is not None:
        nspawn = _children(supervisor)
        terminate([supervisor], timeout=2.0, sig=signal.SIGKILL)
        inits = [init for pid in nspawn for init in _children(pid)]
        terminate(inits, timeout=10.0, sig=signal.SIGKILL)
        terminate(nspawn, timeout=10.0)
    _pidfile(host.org, host.key).unlink(missing_ok=True)


# --- one host --------------------------------------------------------------------------------------------

def _veth_names(org: str, address: str, vpc_cidr: str) -> tuple[str, str]:
    offset = int(ipaddress.IPv4Address(address)) - int(ipaddress.IPv4Network(vpc_cidr).network_address)
    tag = _tag(org)
    return f"fm{tag}{offset:x}"[:IFNAMSIZ], f"fp{tag}{offset:x}"[:IFNAMSIZ]


def ensure_host(org: str, spec: HostSpec, bridge: str,
                prepare: Callable[[Host], None] | None = None) -> tuple[Host, bool]:
    """Create the host (or check the one there); returns it and whether anything was created. `prepare` writes
    into a new host's root before it boots (what the substrate puts on the disk: never an answer)."""
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

    if host.init_pid() is None:
        _stop_init(host)  # a supervisor left without its init
        if _is_mountpoint(host.root):
            _run(["umount", "-l", str(host.root)])
        layer = substrate_root(org) / "layers" / spec.key
        upper, work = layer / "upper", layer / "work"
        shutil.rmtree(layer, ignore_errors=True)  # a host that lost its init starts from the image again
        upper.mkdir(parents=True)
        work.mkdir()
        host.root.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={spec.image},upperdir={upper},workdir={work}",
              str(host.root)])
        host.console.unlink(missing_ok=True)
        if prepare is not None:
            prepare(host)
        boot_host(host, spec)
        changed = True
    return host, changed


def remove_host(host: Host) -> None:
    """Stop every process of the host and remove its network namespace, veth, root and writable layer."""
    _stop_init(host)
    if Path(host.netns_path).exists():
        terminate(netns_pids(host.netns))  # what the substrate runs in the host's network (its IMDS stand-in)
        _run(["ip", "netns", "del", host.netns], check=False)
    if _link_exists(host.host_veth):
        _run(["ip", "link", "del", host.host_veth], check=False)
    if _is_mountpoint(host.root):
        _run(["umount", "-l", str(host.root)], check=False)
    shutil.rmtree(substrate_root(host.org) / "layers" / host.key, ignore_errors=True)
    shutil.rmtree(host.root, ignore_errors=True)
    host.console.unlink(missing_ok=True)


def reconcile_hosts(org: str, specs: Sequence[HostSpec], bridge: str, prepare: Callable[[Host], None] | None = None
                    ) -> tuple[list[Host], list[Host], list[Host]]:
    """Make the tenant's hosts exactly `specs`: (hosts, created, removed). Idempotent. `prepare`: see ensure_host."""
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
        host, changed = ensure_host(org, spec, bridge, prepare)
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
    for mount in (root / "layers",):
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


def terminate(pids: Iterable[int], timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
    pending = set(pids)
    for pid in pending:
        try:
            os.kill(pid, sig)
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
