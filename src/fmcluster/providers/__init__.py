"""Where a tenant's cluster runs: `aws` (an AWS account) or `local` (this machine standing in for one).

Both run the same deploy (fmcluster.deploy): the same CloudFormation templates through the same boto3
calls, the same secrets, bundle and manifest, the same node bootstrap, reports and acceptance. A provider
only supplies what differs in the *substrate* (the protocol is here; which class serves a tenant is
fmcluster.providers.registry.provider_for):

- `endpoint`: where the AWS APIs answer (AWS itself: None; local: the tenant's emulator, started on demand), and
  `capabilities.apis` how they answer (retries, polls, what an emulator leaves out), which the callers hand on with
  the endpoint: nothing asks whether an endpoint is set;
- `boot`: what makes the cluster's instances run their user data (EC2 itself; local: one namespace host per
  instance the emulator reports, which then runs that instance's decoded user data);
- `queue_resources`: what Slurm may schedule on a node of an instance type;
- `client_argv`: how an operator reaches a node: ssh with the tenant's key, routed by `route_to` (direct to a
  public address, through a public login node, or through a Session Manager session, whose substrate the
  provider supplies: `aws ssm start-session` on AWS, a channel into the host's own network locally);
- `console_output`: what a silent node printed (EC2's console; local: the host's cloud-init log);
- `teardown`: what remains once the stacks are gone.

No other module branches on the provider: what the rest of fmcluster needs to know about it is a capability
(`capabilities`, fmcluster.capabilities.PROVIDERS), which the manifest carries to the roles.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fmcluster.capabilities import ProviderCapabilities
from fmcluster.catalog import InstanceType
from fmcluster.nodes import Node

if TYPE_CHECKING:
    from fmcluster.containers import ContainerRegistry
    from fmcluster.images import Contract
    from fmcluster.model import Tenant

Out = Callable[[str], object]


class NoEndpoint(RuntimeError):
    """The AWS APIs cannot be reached: no credentials (AWS), or nothing deployed (local, no emulator running)."""

    def __init__(self, message: str, nothing_deployed: bool) -> None:
        super().__init__(message)
        self.nothing_deployed = nothing_deployed


@dataclass
class BootResult:
    """What `boot` did: instances given a host and started (local), removed, or nothing (AWS boots its own)."""

    started: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Provider(Protocol):
    name: str
    #: What the substrate has and lacks (fmcluster.capabilities.PROVIDERS[name]).
    capabilities: ProviderCapabilities
    #: How long the deploy waits for every node's first converge (a local host boots in seconds; an EC2 GPU
    #: instance installs drivers and EFA for many minutes).
    boot_timeout_s: float
    #: Whether `invoke plan` may bring the endpoint up (`endpoint(start=True)`). AWS: nothing to start. Local:
    #: no, starting the emulator needs root and leaves a process behind; plan renders offline instead, and
    #: reads a running emulator when the tenant is deployed.
    plan_starts_endpoint: bool
    #: The image every node boots when the substrate boots its own instead of the instance's AMI (a key of
    #: data/images.yml; local: the pristine Debian 12 rootfs), else None.
    node_image: str | None

    def shared_cores(self) -> int | None:
        """The cores the nodes share when they run on the deploy machine (local: its own), None where each node
        has cores of its own: the deploy projects first-boot times to an instance of its own from it."""

    def endpoint(self, start: bool, out: Out) -> str | None:
        """The AWS endpoint for this tenant's API calls (None: AWS's own). `start`: bring it up if needed.
        Raises NoEndpoint when it cannot be reached (and, with `start` false, when nothing is deployed)."""

    def boot(self, endpoint: str | None, out: Out) -> BootResult:
        """Make every live instance of the tenant run (its user data on first boot); remove the gone ones."""

    def stand_in_secrets(self, endpoint: str | None, out: Out) -> None:
        """Where the substrate stands in for what the tenant's secrets log in to (local: the directory, the mail
        relay), make those secrets as the tenant would before deploying; on AWS nothing (the tenant makes them)."""

    def image_parameter(self, path: str) -> str:
        """The public SSM parameter naming an image, as this endpoint has it (AWS: `path` itself)."""

    def queue_resources(self, instance: InstanceType) -> dict[str, Any]:
        """Slurm's view of one node of this type: cpus, real_memory_mb and, with real GPUs, gres."""

    def manifest_vars(self) -> dict[str, Any]:
        """Role variables the substrate needs (e.g. packages already in the local image)."""

    def container_registry(self, outputs: Mapping[str, str]) -> ContainerRegistry | None:
        """The tenant's own container registry its nodes pull from (AWS: the account's ECR in the region, from the
        storage stack's output; local: the VPC's registry), None where not known yet (no stack outputs)."""

    def route(self, node: Node) -> Route:
        """How the deploy machine reaches `node` (route_to, with this substrate's Session Manager channel)."""

    def client_argv(self, node: Node) -> list[str]:
        """argv prefix that runs a command on `node` as an operator would (ssh with the tenant's key, routed);
        raises RouteUnusable when the route needs a program this machine lacks."""

    def console_output(self, endpoint: str | None, node: Node) -> str:
        """The last lines a node printed while booting (for a node that never reported)."""

    def substrate_notes(self) -> list[str]:
        """What stands in for AWS here, for the deploy summary (empty on AWS)."""

    def teardown(self, out: Out) -> None:
        """Remove what the substrate holds once the stacks are deleted (nothing on AWS)."""

    def halt(self, node: str, out: Out) -> None:
        """Take one node down hard, as a crash would; its instance stays (local: `nodes-up` boots it again)."""


def ssh_argv(key: str, address: str, user: str, proxy: Sequence[str] = ()) -> list[str]:
    """ssh as an operator reaches a node: the tenant's key, no host-key prompt for a cluster just made; `proxy`:
    the ProxyCommand that carries the connection (a login node, a Session Manager session), none for direct."""
    via = ["-o", f"ProxyCommand={shlex.join(proxy)}"] if proxy else []
    return ["ssh", "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10", *via, f"{user}@{address}"]


@dataclass(frozen=True)
class Route:
    """How the deploy machine reaches a node's sshd: `via` says it in words; `proxy` is the ProxyCommand (with
    ssh's %h/%p), empty when the node's own address is reachable."""

    via: str
    address: str
    proxy: tuple[str, ...] = ()
    #: Programs the route needs on this machine besides ssh and the ProxyCommand's own (the Session Manager
    #: plugin `aws ssm start-session` hands the session to).
    needs: tuple[str, ...] = ()
    #: Where to get them, said with what is missing.
    install: str = ""

    def missing(self) -> list[str]:
        """The programs this route needs that are not on this machine's PATH (fail closed: said, not tried)."""
        wanted = ["ssh", *self.proxy[:1], *self.needs]
        return [p for p in dict.fromkeys(wanted) if shutil.which(p) is None]

    def unusable(self) -> str:
        """Why this route cannot be used from here ("" when it can)."""
        missing = self.missing()
        return (f"reaching the nodes through {self.via} needs {', '.join(missing)} on this machine"
                + (f" ({self.install})" if self.install else "")) if missing else ""


class RouteUnusable(RuntimeError):
    """A node's route needs a program this machine lacks; the message says which and where to get it."""


def operator_argv(route: Route, key: str, user: str, slurm_bin_dir: str | None = None) -> list[str]:
    """ssh over `route` as an operator runs it; RouteUnusable when the route cannot work from here (fail closed:
    every caller reports what is missing instead of an ssh error about a ProxyCommand it cannot start).

    Every caller appends one command, which sshd hands to the user's shell as `-c` text: no login shell, so nothing
    of /etc/profile.d. Where the image's Slurm clients are only on a login shell's PATH (`slurm_bin_dir`, its
    contract: e.g. /opt/slurm/bin from /etc/profile.d/slurm.sh), the command is preceded by
    the PATH export that profile script would have made, as ssh joins its arguments into that one text."""
    if why := route.unusable():
        raise RouteUnusable(why)
    argv = ssh_argv(key, route.address, user, route.proxy)
    if slurm_bin_dir:
        argv.append(f'export PATH="$PATH":{shlex.quote(slurm_bin_dir)};')
    return argv


def controller_contract(tenant: Tenant, node_image: str | None) -> Contract:
    """The contract of the image the tenant's controller boots on this provider (`node_image`: the provider's own,
    else the scheduler's); tests/test_image_contract.py holds every node kind of a tenant to one default user and one
    Slurm client directory, so what the operator's commands assume of one node holds on all."""
    from fmcluster.images import booted_image, load_images
    from fmcluster.schedulers.registry import scheduler_for

    return load_images()[booted_image(scheduler_for(tenant).image, node_image)(tenant.controller.accelerator)].contract


def operator_key_path(org: str) -> str:
    """Where the tenant's operator key lies on this machine (fmcluster.access.operator_key makes it)."""
    from fmcluster.paths import secrets_dir

    return str(secrets_dir(org) / "ssh" / "id_ed25519")


_KNOWN: dict[str, tuple[int, list[Node]]] = {}


def known_nodes(org: str) -> list[Node]:
    """The nodes the last deploy wrote to generated/hosts.yml, read again only when that file changes: a command
    reaching every node (doctor over 1,000 nodes) routes each without parsing the inventory each time."""
    from fmcluster.inventory import inventory_path, read_nodes

    path = inventory_path(org)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return []
    cached = _KNOWN.get(str(path))
    if cached is None or cached[0] != stamp:
        cached = _KNOWN[str(path)] = (stamp, read_nodes(org))
    return cached[1]


def route_to(node: Node, nodes: Sequence[Node], key: str, user: str,
             session: Callable[[Node], tuple[str, ...]], session_needs: tuple[str, ...] = (),
             session_install: str = "") -> Route:
    """The one rule every node-facing step follows (the tenant's data decides, no name does):
    - a node with a public address (a login node where the tenant opened `network.ssh_ingress_cidr`): direct;
    - else, where a login node has a public address: through it (ssh -W, the tenant's key on both hops);
    - else: a Session Manager session to the instance (`session(node)`: the provider's ProxyCommand), which
      needs no inbound rule at all (the nodes' AmazonSSMManagedInstanceCore policy).
    The controller has no public address and its security group admits only the cluster: it is never direct."""
    if node.public_address:
        return Route("its public address", node.public_address)
    jump = next((n for n in nodes if n.role == "login" and n.public_address), None)
    if jump is not None:
        hop = ssh_argv(key, jump.public_address, user)
        return Route(f"login node {jump.name} ({jump.public_address})", node.address,
                     (*hop[:-1], "-W", "%h:%p", hop[-1]))
    return Route("a Session Manager session", node.address, session(node), session_needs, session_install)


def live_names(nodes: Sequence[Node]) -> list[str]:
    return [n.name for n in nodes]
