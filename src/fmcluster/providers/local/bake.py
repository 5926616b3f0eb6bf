"""`invoke image` on the local substrate: bake a tenant's node image from the pristine one (issue 40).

One builder host boots from the pristine image on the tenant's substrate (its bridge, its package source: the boot
path of fmcluster.providers.local.hosts a node takes), with the bundle a deploy publishes put in place of the fetch.
In it run
- the node bootstrap's install stages (`node-bootstrap.sh --install`: git from the package source, the toolchain
  from the wheelhouse, exactly as a first boot does them), then
- `playbooks/site.yml --tags install` with the tenant's manifest, the builder in every node group (controller,
  login, compute of the kind): every role's install tasks and nothing of the tenant's (fmcluster.baked).
Then what must not be baked is cleaned (cloud-init's state and machine id, ssh host keys, apt's lists, logs, the
node's state under /var/lib/fmcluster and /etc/fmcluster, the munge key Debian's package makes, what the substrate
wrote for the builder), the builder stops, and its writable layer is kept under the image cache as the baked
layer, named by fmcluster.baked.digest, with its record. Hosts of that tenant then boot
`lowerdir=<baked>:<pristine>` while the record's digest is the current install set's (`lowerdir` below); a stale
one is said and the pristine image booted.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


from fmcluster import baked
from fmcluster.manifest import assemble_inventory, inventory_yaml
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.providers.local.layers import (
    install_digest, layer_dir, layers_in_use, lowerdir, rotate_layers,
)
from fmcluster.providers.local import image
from fmcluster.providers.local.hosts import (
    Host, HostSpec, SubstrateError, _ensure_substrate_dirs, _stop_init, bridge_name, ensure_host, ensure_network,
    host_run, load_hosts, remove_all, remove_host, require_root, router_address, substrate_root, wait_running,
)
from fmcluster.providers.local.packages import APT_CONF_PATH, ensure_package_source, stop_package_source

Out = Callable[[str], object]
BUNDLE = "/opt/fmcluster/bootstrap"
WORK = "/var/lib/fmcluster-bake"
VENV = "/opt/fmcluster/venv"
BUILDER_NAME = "fmcluster-builder"
#: Seconds the builder's install steps may take (first boot's converge is minutes on 2 loaded cores).
STEP_TIMEOUT_S = 1800
#: Paths of the builder's writable layer removed before it is kept (relative to /): what is the node's, the
#: substrate's or the build's own, never the image's. Removing them from the layer shows the pristine image's.
NOT_BAKED = (
    "etc/machine-id", "var/lib/dbus/machine-id", "etc/hostname", "etc/ssh/ssh_host_*", "root/.ssh",
    "var/lib/cloud", "var/log/cloud-init*.log", "etc/cloud/cloud-init.disabled", APT_CONF_PATH.lstrip("/"),
    "var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/log/*.log", "var/log/apt",
    "var/log/journal", "var/log/fmcluster", "var/lib/fmcluster", "etc/fmcluster", "etc/munge/munge.key",
    BUNDLE.lstrip("/"), WORK.lstrip("/"), "tmp/*", "var/tmp/*", "root/.ansible", "root/.cache",
    "etc/systemd/system.conf.d/90-fmcluster-aws-endpoint.conf", "etc/environment", "usr/sbin/policy-rc.d",
)
POLICY_RC_D = "/usr/sbin/policy-rc.d"


@dataclass(frozen=True)
class Bake:
    record: baked.Record
    lines: list[str]


def _builder_address(vpc_cidr: str) -> tuple[str, int]:
    """The private subnet's last usable address: far from the nodes' (the cluster stack takes the first)."""
    from fmcluster.stacks.render import subnet_cidrs

    private = ipaddress.IPv4Network(subnet_cidrs(vpc_cidr)["private"])
    return str(private.broadcast_address - 1), private.prefixlen


def _inventory(tenant: Tenant, kind: str, ref: str) -> str:
    """The builder in every node group of `kind`, with the tenant's manifest (what decides which software a node
    runs; nothing tagged install reads its identities: fmcluster.baked.TENANT_VARIABLES)."""
    from fmcluster.images import booted_image
    from fmcluster.providers.registry import provider_for
    from fmcluster.publish import build_manifest
    from fmcluster.schedulers.registry import scheduler_for

    provider, scheduler = provider_for(tenant), scheduler_for(tenant)
    manifest = build_manifest(tenant, ref, {}, provider.queue_resources, scheduler.manifest_vars(),
                              provider.manifest_vars(), scheduler.discovery({}),
                              booted_image(scheduler.image, provider.node_image),
                              container_registry=provider.container_registry({}))
    address, _ = _builder_address(tenant.network.vpc_cidr)
    queues = [q for q in tenant.queues if baked.image_kind(q.instance.accelerator) == kind] or list(tenant.queues)[:1]
    nodes = [Node(BUILDER_NAME, address, "controller", None, "i-builder", tenant.controller.name),
             Node(BUILDER_NAME, address, "compute", queues[0].name, "i-builder", queues[0].instance.name)]
    if tenant.login is not None:
        nodes.append(Node(BUILDER_NAME, address, "login", None, "i-builder", tenant.login.name))
    document = assemble_inventory(manifest, nodes)
    return inventory_yaml(document, "# written by `invoke image` (fmcluster.providers.local.bake): the builder\n")


def _run_in(host: Host, argv: list[str], what: str, env: dict[str, str] | None = None) -> str:
    done = host_run(host, argv, env=env, timeout=STEP_TIMEOUT_S)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SubstrateError(f"image bake: {what} failed on the builder (exit {done.returncode}):\n{tail}")
    return done.stdout


def _put(host: Host, path: str, content: bytes, mode: int = 0o644) -> None:
    target = host.root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)
    target.chmod(mode)


def _clean_layer(upper: Path) -> None:
    """Remove NOT_BAKED from the kept layer (the pristine image's own files show through again)."""
    for pattern in NOT_BAKED:
        for path in upper.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _size(folder: Path) -> int:
    done = subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, check=False)
    return int(done.stdout.split()[0]) if done.returncode == 0 and done.stdout else 0


@contextmanager
def _builder(tenant: Tenant, kind: str, key: str, lower: str, out: Out) -> Iterator[Host]:
    """A host booted from `lower` on the tenant's substrate for the bake (or its check); it goes after, and so does
    what this started for itself (bridge, package source) where the tenant has nothing deployed."""
    from fmcluster.providers.local.emulator import running_emulator
    from fmcluster.stacks.render import subnet_cidrs

    require_root()
    org = tenant.org
    subnets = subnet_cidrs(tenant.network.vpc_cidr)
    deployed = bool(load_hosts(org)) or running_emulator(org) is not None
    ensure_network(org, tenant.network.vpc_cidr, [router_address(c) for c in subnets.values()])
    source = ensure_package_source(org, router_address(subnets["private"]).split("/")[0])
    _ensure_substrate_dirs(org)
    address, prefixlen = _builder_address(tenant.network.vpc_cidr)
    spec = HostSpec(f"{key}-{kind}", BUILDER_NAME, address, prefixlen, tenant.network.vpc_cidr, image=lower)

    def prepare(host: Host) -> None:
        # Not an instance: no metadata service, so cloud-init stays off (the bake removes the switch again).
        _put(host, "/etc/cloud/cloud-init.disabled", b"fmcluster image builder: not an instance\n")
        _put(host, APT_CONF_PATH, source.apt_conf().encode())
        _put(host, "/etc/hostname", f"{BUILDER_NAME}\n".encode())
        # No service a package installs starts on the builder (invoke-rc.d's policy, Debian Policy 9.3.3): nothing
        # runs unconfigured there, and a node starts its services once the roles have configured them.
        _put(host, POLICY_RC_D, b"#!/bin/sh\n# fmcluster image builder: no service starts while the image is made\nexit 101\n",
             0o755)

    out(f"  {key} {kind} of '{org}': host {BUILDER_NAME} ({address}) from {lower}")
    host = None
    try:
        host, _ = ensure_host(org, spec, bridge_name(org), prepare)
        wait_running(host)
        yield host
    finally:
        if host is not None:
            remove_host(host)
        if not deployed and not load_hosts(org):
            stop_package_source(org)
            remove_all(org)


def _install(host: Host, tenant: Tenant, kind: str, ref: str, lines: list[str]) -> None:
    """The bootstrap's install stages and site.yml --tags install, as a first boot runs them."""
    from fmcluster.publish import bootstrap_files
    from fmcluster.schedulers.registry import scheduler_for

    for name, body in bootstrap_files(ref, scheduler_for(tenant).playbook, out=lambda line: None).items():
        _put(host, f"{BUNDLE}/{name}", body, 0o755 if name.endswith(".sh") else 0o644)
    step = time.monotonic()
    env = {"FMCLUSTER_BUCKET": "image-builder", "FMCLUSTER_REGION": tenant.region, "FMCLUSTER_ORG": tenant.org}
    _run_in(host, ["bash", f"{BUNDLE}/node-bootstrap.sh", "--install"], "the bootstrap's install stages", env)
    lines.append(f"bootstrap install stages (git, toolchain): {time.monotonic() - step:.0f}s")
    _run_in(host, ["git", "clone", "-q", "--no-checkout", f"{BUNDLE}/repo.bundle", f"{WORK}/repo"], "git clone")
    _run_in(host, ["git", "-C", f"{WORK}/repo", "checkout", "-q", "--detach", ref], "git checkout")
    _put(host, f"{WORK}/hosts.yml", _inventory(tenant, kind, ref).encode(), 0o600)
    step = time.monotonic()
    playbook = (f"cd {WORK}/repo && exec {VENV}/bin/ansible-playbook -i {WORK}/hosts.yml --limit {BUILDER_NAME} "
                f"--tags {baked.INSTALL_TAG} -e ansible_connection=local -e ansible_python_interpreter={VENV}/bin/python "
                "playbooks/site.yml")
    _run_in(host, ["sh", "-c", playbook], "site.yml --tags install")
    lines.append(f"site.yml --tags install: {time.monotonic() - step:.0f}s")


def _check_kind(kind: str) -> None:
    if kind not in baked.IMAGE_KINDS:
        raise SubstrateError(f"--kind={kind}: one of {', '.join(baked.IMAGE_KINDS)}")


def bake(tenant: Tenant, kind: str, out: Out = print) -> Bake:
    """Bake the tenant's `kind` image (see the module's doc); the builder and what this started go after."""
    from fmcluster.publish import pinned_commit

    _check_kind(kind)
    org = tenant.org
    started = time.monotonic()
    lines: list[str] = []
    ref = pinned_commit()
    digest = install_digest(ref, kind)
    pristine = image.ensure_image(out)
    target = layer_dir(org, kind, digest)
    if str(target) in layers_in_use(load_hosts(org)):  # replacing it would change a running host's root under it
        raise SubstrateError(f"the {kind} image of this install set ({target}) is booted by hosts of '{org}' now: it "
                             "is current already; to bake it again, destroy the tenant's hosts first")
    with _builder(tenant, kind, "bake", str(pristine.rootfs), out) as host:
        _install(host, tenant, kind, ref, lines)
        # cloud-init's own clean (its state, logs and the machine id), as an image pipeline runs it last.
        _run_in(host, ["cloud-init", "clean", "--machine-id", "--logs"], "cloud-init clean")
        _run_in(host, ["apt-get", "clean"], "apt-get clean")
        _stop_init(host)
        upper = substrate_root(org) / "layers" / host.key / "upper"
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        # -a keeps owners, modes, links and the overlay's whiteouts and xattrs (what the build removed stays removed).
        copied = subprocess.run(["cp", "-a", f"{upper}/.", str(partial / "rootfs")], capture_output=True, text=True,
                                check=False)
        if copied.returncode != 0:
            raise SubstrateError(f"cannot keep the builder's layer: {copied.stderr.strip()}")
    _clean_layer(partial / "rootfs")
    record = baked.Record(org, kind, digest, image.digest(), ref, baked.pins(), datetime.now(timezone.utc).isoformat(
        timespec="seconds"), _size(partial / "rootfs"), str(target), round(time.monotonic() - started, 1))
    marker = partial / "rootfs" / baked.IMAGE_MARKER.lstrip("/")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(record.to_json())
    (partial / ".complete").write_text(record.to_json())
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    baked.write_record(record)
    lines.append(f"baked layer {target} ({record.size_bytes / 2**20:.0f} MiB) in {record.seconds:.0f}s")
    # the newest baked_images.keep layers, and each one a host boots, stay (fmcluster.baked.rotate)
    lines += rotate_layers(org, kind, tenant.baked_images.keep, load_hosts(org))
    return Bake(record, lines)


@dataclass(frozen=True)
class Check:
    image: str  # what the host booted (its marker)
    installed: dict[str, str]  # what dpkg installed on it
    seconds: float  # the install steps'
    lines: list[str]


def check(tenant: Tenant, kind: str, out: Out = print) -> Check:
    """Boot a host from the tenant's current baked image and run the same install steps a first boot runs: what
    dpkg installs there is what the image lacks (nothing, when the bake is whole)."""
    from fmcluster.publish import pinned_commit

    _check_kind(kind)
    ref = pinned_commit()
    pristine = image.ensure_image(out)
    lower, found = lowerdir(tenant.org, kind, ref, pristine.rootfs)
    if not found.usable:
        raise SubstrateError(f"no current baked image to check: {found.note}")
    lines: list[str] = []
    with _builder(tenant, kind, "check", lower, out) as host:
        started = time.monotonic()
        _install(host, tenant, kind, ref, lines)
        seconds = time.monotonic() - started
        log = host.root / "var/log/dpkg.log"
        installed = baked.installed_since(log.read_text() if log.is_file() else "", datetime(1970, 1, 1))
        marker = host.root / baked.IMAGE_MARKER.lstrip("/")
        booted = baked.booted_image(marker)
    return Check(booted, installed, round(seconds, 1), lines)


