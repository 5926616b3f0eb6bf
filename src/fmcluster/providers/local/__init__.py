"""Provider `local`: this machine stands in for an AWS account — as a substrate, never as an API answer.

- The AWS APIs are the tenant's emulator (moto's server mode, fmcluster.providers.local.emulator), listening on the
  tenant VPC's router address so the hosts reach it as instances reach AWS's endpoints.
- The VPC's subnets are one bridge holding each subnet's router address (`.1`).
- Each instance the emulator reports for the tenant (whatever created it: the cluster stack's controller
  instance and auto scaling groups) becomes a host (fmcluster.providers.local.hosts) with the instance's
  private address and hostname; at first boot the host gets the instance's key pair in root's
  authorized_keys, runs sshd, and runs the instance's decoded user data with the AWS endpoint pointed at the
  emulator — what EC2 and cloud-init do on AWS.
- The image is a pristine Debian 12 root file system built from Debian's packages
  (fmcluster.providers.local.image): python3, ssh, curl and nothing of fmcluster's or of this machine's — no
  toolchain, no AWS CLI, no checkout. Everything else arrives through the boot path an AWS node takes: the user
  data's stdlib S3 client, the bundle's wheelhouse, apt from the VPC's package source.
- The VPC's package source is a caching proxy of Debian's archive on the router address
  (fmcluster.providers.local.packages); at first boot each host's apt is pointed at it, as cloud-init's
  `apt: proxy:` does.
- The tenant's directory (`directory:`) is a real OpenLDAP slapd on the router address, holding a demo tree
  (fmcluster.providers.local.directory); the nodes' SSSD is pointed at it instead of the spec's uri, and the
  bind account's password, when the spec names one, is put into the emulator's Secrets Manager as the tenant
  would.
- Shared file systems the emulator does not create (FSx for Lustre, OpenZFS) are directories of this
  machine bound at the same mount points on every host.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from fmcluster.capabilities import PROVIDERS, ProviderCapabilities
from fmcluster.catalog import InstanceType
from fmcluster.containers import ContainerRegistry, bench_runs_in_container
from fmcluster.escape import escaped, neutral
from fmcluster.manifest import secret_id
from fmcluster.model import Tenant
from fmcluster.nodes import LIVE_STATES, Node, hostname_for
from fmcluster.providers import (BootResult, NoEndpoint, Out, Route, controller_contract, known_nodes, operator_argv,
                                 operator_key_path, route_to)
from fmcluster.providers.local.hosts import (
    Bind, Host, HostSpec, SubstrateError, bridge_name, ensure_network, host_run, load_hosts,
    reconcile_hosts, remove_all, remove_host, router_address, substrate_root,
)
from fmcluster.providers.local import channel, directory, image, instance_role, metadata, packages
from fmcluster.providers.local.packages import APT_CONF_PATH, PackageSource, ensure_package_source, stop_package_source
from fmcluster.providers.local.registry import PORT as REGISTRY_PORT
from fmcluster.providers.local.registry import bench_reference, ensure_bench_image, ensure_registry, stop_registry
from fmcluster.stacks import aws
from fmcluster.users import home_root

#: Share of this machine's memory each local node offers Slurm (slurmd drains a node whose configured
#: RealMemory exceeds what it detects, and every host detects this whole machine).
MEMORY_SHARE = 0.9
CONSOLE_LOG = "/var/log/cloud-init-output.log"
#: Where the region's AWS endpoints answer, for every unit the host's systemd starts (cloud-init's user data, the
#: node agent) and every login (/etc/environment): on AWS the SDKs find them by name; here they are the emulator.
ENDPOINT_UNIT_CONF = "/etc/systemd/system.conf.d/90-fmcluster-aws-endpoint.conf"
ENDPOINT_WHY = ("fmcluster local substrate: the region's AWS endpoints are the tenant's emulator "
                "(docs/local-nodes.md)")
#: The emulator ships no DLAMI or Ubuntu parameters, only Amazon Linux's: every image parameter names that one
#: here (the hosts boot the pristine local image, node_image, whatever the image id says).
EMULATOR_IMAGE_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"


class LocalProvider:
    # A pristine host installs its toolchain and packages at first boot: minutes on 2 loaded cores.
    boot_timeout_s = 1500.0
    plan_starts_endpoint = False  # the emulator needs root and outlives the plan: plan renders offline
    node_image: str | None = image.NAME  # the pristine rootfs, whatever the launch template's image id says
    name = "local"
    capabilities: ProviderCapabilities = PROVIDERS["local"]

    def shared_cores(self) -> int | None:
        return os.cpu_count() or 1  # every host runs on this machine's cores

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant
        # What the substrate's hypervisor booted or removed since this task began is reported by its boots too.
        self._since = time.time()
        self._reported: set[str] = set()
        self._image_notes: set[tuple[str, str]] = set()  # each baked image's state said once per task
        from fmcluster.stacks.render import subnet_cidrs

        self.subnets = subnet_cidrs(tenant.network.vpc_cidr)

    # --- the VPC and its endpoint --------------------------------------------------------------------------
    @property
    def router(self) -> str:
        """The private subnet's router address: where the emulator listens, as seen from every host."""
        return router_address(self.subnets["private"]).split("/")[0]

    def endpoint(self, start: bool, out: Out) -> str | None:
        from fmcluster.providers.local.emulator import ensure_emulator, running_emulator

        if not start:
            running = running_emulator(self.tenant.org)
            if running is None:
                raise NoEndpoint(f"no AWS emulator is running for '{self.tenant.org}': nothing is deployed locally "
                                 "(the emulator keeps its state in memory; `invoke deploy` starts one)", True)
            return running.endpoint
        if ensure_network(self.tenant.org, self.tenant.network.vpc_cidr,
                          [router_address(cidr) for cidr in self.subnets.values()]):
            out(f"  local VPC {self.tenant.network.vpc_cidr}: bridge {bridge_name(self.tenant.org)} with the subnets' "
                f"router addresses ({', '.join(router_address(c) for c in self.subnets.values())})")
        emulator = ensure_emulator(self.tenant.org, host=self.router)
        out(f"  {emulator.note}")
        from fmcluster.providers.local.hypervisor import ensure_hypervisor

        hypervisor = ensure_hypervisor(self.tenant.org, emulator.endpoint)
        if hypervisor.started:
            out(f"  {hypervisor.note}")
        return emulator.endpoint

    # --- instances → hosts ---------------------------------------------------------------------------------
    def _binds(self) -> tuple[Bind, ...]:
        """Only the shared file systems the emulator does not create: nothing else of this machine's."""
        binds = []
        storage = [("lustre", self.tenant.storage.lustre.mount_point)]
        if self.tenant.storage.openzfs is not None:
            storage.append(("home", self.tenant.storage.openzfs.mount_point))
        for name, mount_point in storage:
            source = self.shared_dir(name)
            source.mkdir(parents=True, exist_ok=True)
            source.chmod(0o1777)
            binds.append(Bind(str(source), mount_point))
        return tuple(binds)

    def shared_dir(self, name: str) -> Path:
        return substrate_root(self.tenant.org) / "shared" / name

    def _instances(self, ec2: Any) -> list[dict[str, Any]]:
        found = []
        filters = [{"Name": "tag:fmcluster:org", "Values": [self.tenant.org]},
                   {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                found += [{**instance, "ReservationId": reservation.get("ReservationId", "")}
                          for instance in reservation["Instances"]]
        return found

    def boot(self, endpoint: str | None, out: Out) -> BootResult:
        """A host for every live instance, none for the others — what EC2 does. The substrate's hypervisor (a daemon,
        fmcluster.providers.local.hypervisor) does the same on its own; the two never boot at once (one lock per
        tenant), and the hosts it booted or removed since this task began are reported here too. An explicit boot
        also boots the hosts `halt` left down."""
        from fmcluster.providers.local.hypervisor import boot_lock, clear_halted, events_since

        with boot_lock(self.tenant.org):
            clear_halted(self.tenant.org)
            result = self.boot_locked(endpoint, out)
        started, removed = events_since(self.tenant.org, self._since)
        for name in started:
            if name not in result.started and name not in self._reported:
                out(f"  host {name} booted by the substrate's hypervisor (EC2 boots what the AWS APIs launch)")
        for name in removed:
            if name not in result.removed and name not in self._reported:
                out(f"  host {name} removed by the substrate's hypervisor: its instance is gone")
        self._reported |= set(started) | set(removed)
        result.started += [h for h in started if h not in result.started and h not in removed]
        result.removed += [h for h in removed if h not in result.removed]
        result.kept = [h for h in result.kept if h not in result.started]
        return result

    def boot_locked(self, endpoint: str | None, out: Out, keep_down: Collection[str] = ()) -> BootResult:
        """`boot` for a caller holding the tenant's boot lock; `keep_down`: instance ids given no host (halted)."""
        ec2 = aws.client("ec2", self.tenant.region, endpoint, self.capabilities.apis)
        instances = [i for i in self._instances(ec2) if i["InstanceId"] not in keep_down]
        prefixes = {s["SubnetId"]: ipaddress.IPv4Network(s["CidrBlock"]).prefixlen
                    for s in ec2.describe_subnets()["Subnets"]}
        vpc = ipaddress.IPv4Network(self.tenant.network.vpc_cidr)
        result = BootResult()
        specs, by_key = [], {}
        binds = self._binds()
        rootfs = image.ensure_image(out)
        if rootfs.built:
            out(f"  {rootfs.note}")
        lowers = self._lowers(rootfs.rootfs, {str(i.get("InstanceType", "")) for i in instances}, out)
        source = ensure_package_source(self.tenant.org, self.router)
        if source.started:
            out(f"  {source.note}")
        registry = ensure_registry(self.tenant.org, self.router)
        if registry.started:
            out(f"  {registry.note}")
        if bench_runs_in_container(self.tenant):
            out(f"  {ensure_bench_image(registry, rootfs.rootfs).note}")
        self._directory(endpoint, out)
        self._smtp_secrets(endpoint, out)
        for instance in instances:
            address = instance.get("PrivateIpAddress", "")
            if not address or ipaddress.IPv4Address(address) not in vpc:
                result.notes.append(f"{instance['InstanceId']}: address {address or 'none'} is outside the VPC "
                                    f"{vpc}; no host made for it")
                continue
            specs.append(HostSpec(instance["InstanceId"], hostname_for(address, instance.get("PrivateDnsName", "")),
                                  address, prefixes.get(instance.get("SubnetId", ""), vpc.prefixlen), str(vpc),
                                  binds, image=lowers.get(str(instance.get("InstanceType", "")), str(rootfs.rootfs))))
            by_key[instance["InstanceId"]] = instance
        cidrs = {s["SubnetId"]: s["CidrBlock"] for s in ec2.describe_subnets()["Subnets"]}
        hosts, created, removed = reconcile_hosts(
            self.tenant.org, specs, bridge_name(self.tenant.org),
            lambda host: self._prepare(host, by_key[host.key], ec2, endpoint, source, cidrs))
        for host in removed:
            out(f"  host {host.hostname} ({host.address}, {host.key}) removed: its instance is gone")
            result.removed.append(host.hostname)
        for host in created:
            out(f"  host {host.hostname} ({host.address}, {host.key}) booted: systemd, then cloud-init runs its "
                "user data from its metadata service")
            result.started.append(host.hostname)
        for host in hosts:
            if host not in created and metadata.ensure_service(host):
                out(f"  host {host.hostname}: its metadata service was down; started again")
        result.kept = [h.hostname for h in hosts if h not in created]
        return result

    def _lowers(self, pristine: Path, instance_types: Collection[str], out: Out) -> dict[str, str]:
        """instance type → the lower layers its hosts boot: the tenant's baked image of its kind over the pristine
        image while the image is current (`invoke image`, fmcluster.providers.local.bake), else the pristine image;
        a stale image is said, never booted."""
        from fmcluster import baked
        from fmcluster.catalog import load_catalog
        from fmcluster.providers.local import layers

        catalog, ref = load_catalog(), layers.head_commit()
        lowers: dict[str, str] = {}
        for instance_type in sorted(t for t in instance_types if t in catalog):
            kind = baked.image_kind(catalog[instance_type].accelerator)
            lowers[instance_type], found = layers.lowerdir(self.tenant.org, kind, ref, pristine)
            if found.record is not None and (kind, found.note) not in self._image_notes:
                self._image_notes.add((kind, found.note))
                out(f"  image for {kind} nodes: {found.note}")
        return lowers

    def _directory(self, endpoint: str | None, out: Out) -> None:
        """Start the stand-in directory (before any host boots and reads its bind secret)."""
        spec = self.tenant.directory
        if spec is None:
            return
        server = directory.ensure_directory(self.tenant.org, self.router, spec.base_dn,
                                            [(t.name, t.gid) for t in self.tenant.teams], home_root(self.tenant),
                                            bind_dn=spec.bind_dn or "")
        if server.started:
            out(f"  {server.note}")
        self._bind_secret(endpoint, out)

    def stand_in_secrets(self, endpoint: str | None, out: Out) -> None:
        """The secrets the tenant names for the stand-ins of what it logs in to (the directory, the mail relay), in
        the emulator before the deploy checks them (fmcluster.publish.missing_tenant_secrets) as on AWS."""
        self._bind_secret(endpoint, out)
        self._smtp_secrets(endpoint, out)

    def _bind_secret(self, endpoint: str | None, out: Out) -> None:
        """The stand-in directory's bind password in the emulator's Secrets Manager (kept equal to the directory's)."""
        spec = self.tenant.directory
        if spec is not None and spec.bind_password_secret is not None:
            secrets = aws.client("secretsmanager", self.tenant.region, endpoint, self.capabilities.apis)
            name, value = secret_id(self.tenant.org, spec.bind_password_secret), directory.bind_password(self.tenant.org)
            try:
                current = secrets.get_secret_value(SecretId=name)["SecretString"]
            except secrets.exceptions.ResourceNotFoundException:
                secrets.create_secret(Name=name, SecretString=value, Tags=[{"Key": k, "Value": v}
                                                                           for k, v in self.tenant.tags.items()])
                out(f"  created secret {name}: the stand-in directory's password for {spec.bind_dn}")
            else:
                if current != value:
                    secrets.put_secret_value(SecretId=name, SecretString=value)

    def _smtp_secrets(self, endpoint: str | None, out: Out) -> None:
        """monitoring.smtp's credentials in the emulator, where the tenant has not made them: stand-ins the
        controller's node agent reads as on AWS. No relay exists locally, so no mail is sent with them (substrate
        notes); an existing secret is left as it is."""
        smtp = self.tenant.monitoring.smtp
        names = [n for n in (smtp.username_secret, smtp.password_secret) if n] if smtp else []
        if not names:
            return
        secrets = aws.client("secretsmanager", self.tenant.region, endpoint, self.capabilities.apis)
        for name in names:
            sid = secret_id(self.tenant.org, name)
            try:
                secrets.get_secret_value(SecretId=sid)
            except secrets.exceptions.ResourceNotFoundException:
                secrets.create_secret(Name=sid, SecretString=f"local-stand-in-{name}",
                                      Tags=[{"Key": k, "Value": v} for k, v in self.tenant.tags.items()])
                out(f"  created secret {sid}: a stand-in SMTP credential (no relay exists locally; no mail is sent)")

    def _prepare(self, host: Host, instance: dict[str, Any], ec2: Any, endpoint: str | None,
                 source: PackageSource, cidrs: dict[str, str]) -> None:
        """Before a new host boots: its metadata service (what EC2 knows of the instance), and on its disk what the
        substrate differs in (docs/local-nodes.md): where the region's AWS endpoints answer, and apt's package
        source. Everything else — its ssh host keys, the key pair in the default user's authorized_keys, its
        hostname, its user data — cloud-init does at boot from the metadata service, as on EC2."""
        def client(service: str) -> Any:
            return aws.client(service, self.tenant.region, endpoint, self.capabilities.apis)

        stacks = [f"{self.tenant.stack_prefix}-{kind}" for kind in ("cluster", "storage", "network")]
        template = instance_role.launch_template_data(instance, client, stacks)  # profile and MetadataOptions
        session = instance_role.role_session(instance, client, template)
        public_key = ""
        if instance.get("KeyName"):
            pair = ec2.describe_key_pairs(KeyNames=[instance["KeyName"]], IncludePublicKey=True)["KeyPairs"][0]
            public_key = pair["PublicKey"]
        raw = ec2.describe_instance_attribute(InstanceId=host.key, Attribute="userData").get("UserData", {})
        user_data = str(raw.get("Value") or "")  # base64, as EC2 serves it decoded: the stand-in decodes
        account = client("sts").get_caller_identity()["Account"]
        metadata.write_config(host, metadata.instance_config(
            instance, instance.get("ReservationId", ""), account, self.tenant.region, [self.tenant.network.vpc_cidr],
            cidrs.get(instance.get("SubnetId", ""), self.tenant.network.vpc_cidr), public_key, user_data,
            template, session))
        metadata.ensure_service(host)
        done = subprocess.run(["ip", "-n", host.netns, "link", "set", "dev", "eth0", "address", metadata.mac(instance)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SubstrateError(f"cannot give host {host.hostname}'s eth0 its instance's MAC: {done.stderr.strip()}")
        environment = {"AWS_ENDPOINT_URL": str(endpoint)}
        # Fault tests shorten the nodes' retries (node-bootstrap.sh and the agent honour it); unset normally.
        if os.environ.get("FMCLUSTER_FETCH_TRIES"):
            environment["FMCLUSTER_FETCH_TRIES"] = os.environ["FMCLUSTER_FETCH_TRIES"]
        manager = "".join(f"DefaultEnvironment={key}={value}\n" for key, value in environment.items())
        self._write(host, ENDPOINT_UNIT_CONF, f"# {ENDPOINT_WHY}\n[Manager]\n{manager}")
        self._write(host, "/etc/environment", "".join(f"{key}={value}\n" for key, value in environment.items()))
        self._write(host, APT_CONF_PATH, source.apt_conf())

    @staticmethod
    def _write(host: Host, path: str, content: str) -> None:
        """A file on the host's disk before it boots (root's, 0644)."""
        target = host.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(0o644)

    # --- the rest of the substrate --------------------------------------------------------------------------
    def image_parameter(self, path: str) -> str:
        return EMULATOR_IMAGE_PARAMETER

    def queue_resources(self, instance: InstanceType) -> dict[str, Any]:
        mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal:"))
        # No GPU exists here whatever the catalog says: no gres, so Slurm schedules none.
        return {"cpus": os.cpu_count() or 1, "real_memory_mb": int(mem_kib // 1024 * MEMORY_SHARE)}

    def manifest_vars(self) -> dict[str, Any]:
        # Polling is cheap here: the agent checks often, so a node joining shows up within seconds.
        values: dict[str, Any] = {"node_convergence_interval": 5, "prometheus_sd_refresh_interval": "10s"}
        if self.tenant.directory is not None:
            # The nodes join the stand-in directory, checked against the substrate's CA; its demo people get
            # their teams' Slurm associations as the tenant's would be given by hand.
            people = directory.demo_people([(t.name, t.gid) for t in self.tenant.teams])
            values.update({
                "sssd_client_uri": f"ldaps://{self.router}:{directory.PORT}",
                "sssd_client_start_tls": False,
                "sssd_client_ca_cert": directory.ensure_certificates(self.tenant.org, self.router),
                "slurm_associations_users": [{"name": p.name, "accounts": list(p.teams), "default_account": p.teams[0]}
                                             for p in people if p.teams],
            })
        return values

    def container_registry(self, outputs: Mapping[str, str]) -> ContainerRegistry | None:
        # The VPC's registry standing for the tenant's ECR (fmcluster.providers.local.registry): the only one the
        # hosts reach, over plain HTTP; the storage stack's ECR output names the emulator's account, not used.
        host = f"{self.router}:{REGISTRY_PORT}"
        return ContainerRegistry(host, insecure=True, what="the VPC's docker-registry, standing for the tenant's ECR",
                                 bench_image=bench_reference(host))

    def route(self, node: Node) -> Route:

        def session(target: Node) -> tuple[str, ...]:
            # Session Manager's channel stood in: into the instance's own network, found by its instance id (as SSM
            # targets it), to its sshd; the deploy machine's route to the bridge is not used.
            host = next((h for h in load_hosts(self.tenant.org) if h.key == target.instance_id), None)
            if host is None:
                # As Session Manager answers for an instance that is gone (TargetNotConnected): the session fails
                # and ssh with it, so callers see this node unreachable and go on with the others.
                why = (f"TargetNotConnected: no local host for instance {escaped(target.instance_id)} "
                       f"({escaped(target.name)}): nothing to open a session to")
                return ("sh", "-c", f"echo {shlex.quote(why)} >&2; exit 255")
            return ("ip", "netns", "exec", host.netns, sys.executable, "-I", str(Path(channel.__file__)), "%h", "%p")
        return route_to(node, known_nodes(self.tenant.org), operator_key_path(self.tenant.org), self.login_user(),
                        session)

    def login_user(self) -> str:
        """The account cloud-init puts the EC2 key pair in: the local image's default user (its contract)."""
        from fmcluster.images import load_images

        return load_images()[image.NAME].contract.default_user


    def client_argv(self, node: Node) -> list[str]:
        return operator_argv(self.route(node), operator_key_path(self.tenant.org), self.login_user(),
                             controller_contract(self.tenant, self.node_image).slurm_bin_dir)

    def console_output(self, endpoint: str | None, node: Node) -> str:
        host = next((h for h in load_hosts(self.tenant.org) if h.key == node.instance_id), None)
        if host is None:
            return "(no local host for this instance)"
        if host.init_pid() is not None:
            done = host_run(host, ["tail", "-n", "30", CONSOLE_LOG])
            if done.returncode == 0:
                return done.stdout
        # A host that is down (or has not written its cloud-init log yet): its console, as the serial console shows.
        lines = host.console.read_text(errors="replace").splitlines() if host.console.is_file() else []
        return "\n".join(lines[-30:])

    def substrate_notes(self) -> list[str]:
        notes = [f"AWS APIs: moto emulator on {self.router} (the VPC router address of {self.subnets['private']})",
                 f"instances: systemd-nspawn containers on bridge {bridge_name(self.tenant.org)}, each booting its own "
                 "systemd as PID 1 (own PID, network, UTS, IPC and mount namespaces; an overlay of the pristine image "
                 "below; nothing of this machine's is mounted in them but the shared-storage stand-ins)",
                 f"image: {image.NAME}, a pristine Debian 12 root file system built by mmdebstrap from Debian's packages "
                 f"({image.image_dir()}): {', '.join(image.PACKAGES)}; first boot adds the rest, unless the tenant's "
                 "baked image of the node's kind is current (below)",
                 f"package source: apt-cacher-ng (Debian's archive) on {self.router}:{packages.PORT}, "
                 "the VPC router address (on AWS: the archive through the NAT)",
                 "operator access: a node without a public address is reached by a Session Manager session; its "
                 "channel is stood in (ssh's ProxyCommand enters the instance's own network namespace, found by its "
                 "instance id, and connects to its sshd, as the SSM agent forwards AWS-StartSSHSession)",
                 "instances' metadata: each host's own metadata service on 169.254.169.254 in its network "
                 "(fmcluster.providers.local.imds, IMDSv2): the instance as the emulator describes it, its key pair, "
                 "user data, and its profile's role session from the emulator's STS; cloud-init reads it at boot",
                 "EC2's hypervisor: a daemon per tenant (fmcluster.providers.local.hypervisor, started with the "
                 "emulator) boots a host for each instance the AWS APIs launch — an Auto Scaling group's replacement "
                 "included — and removes the hosts of terminated instances, every few seconds, through the same "
                 "boot path as the deploy's (one lock serializes them); a host taken down by `invoke halt` stays "
                 f"down, as a crashed instance does (log {substrate_root(self.tenant.org)}/hypervisor.log)",
                 f"AWS endpoints: the emulator, named in each host's systemd manager environment ({ENDPOINT_UNIT_CONF}) "
                 "and /etc/environment (on AWS the SDKs find the region's endpoints by name)"]
        notes += self._baked_notes()
        from fmcluster.images import load_images

        contract = load_images()[image.NAME].contract
        if not contract.slurm_cgroups():  # said, not silently switched off (docs/local-nodes.md)
            notes.append(f"Slurm without cgroups: the hosts' cgroup hierarchy is {contract.cgroup} (image contract, "
                         f"{contract.sources['cgroup']}), so slurmd tracks a job's processes by parent pid "
                         "(proctrack/linuxproc, task/none) and enforces no memory or CPU confinement; the catalogued AWS "
                         "images with Slurm 22.05 or later on cgroup v2 run proctrack/cgroup and task/cgroup")
        provider, aws = self.capabilities, PROVIDERS["aws"]
        notes.append(f"intervals, to rehearse within minutes: health checks and the controller's passes every "
                     f"{provider.health_interval_s} s (AWS: {aws.health_interval_s} s), so SlurmdTimeout and the repair "
                     f"agent's waits scale with them; a requeued job waits {provider.credential_lifetime_s} s "
                     f"(AuthInfo cred_expire; AWS: Slurm's {aws.credential_lifetime_s} s)")
        if self.tenant.directory is not None:
            notes.append(f"directory: OpenLDAP slapd (Debian's package) on ldaps://{self.router}:{directory.PORT}, "
                         f"standing in for the tenant's {self.tenant.directory.uri} with a demo tree "
                         f"({directory.directory_root(self.tenant.org)})")
        emails = [r.name for r in self.tenant.monitoring.alert_receivers if r.type == "email"]
        if emails:  # nothing local receives mail: said, never faked
            relay = self.tenant.monitoring.smtp
            notes.append(f"email receivers ({', '.join(emails)}): no mail is delivered locally — nothing on this "
                         "substrate relays or receives mail, so Alertmanager's sends to "
                         f"{relay.smarthost if relay else 'localhost:25'} fail and are logged; on AWS "
                         "monitoring.smtp's relay (e.g. Amazon SES) delivers them")
        storage = [("FSx for Lustre", "lustre", self.tenant.storage.lustre.mount_point)]
        if self.tenant.storage.openzfs is not None:
            storage.append(("FSx for OpenZFS", "home", self.tenant.storage.openzfs.mount_point))
        notes += [f"{kind}: directory {self.shared_dir(name)} bound at {mount} on every host (not created by the "
                  "emulator)" for kind, name, mount in storage]
        return notes

    def _baked_notes(self) -> list[str]:
        """The tenant's baked images (`invoke image`) and whether its hosts boot them (issue 40)."""
        from fmcluster.baked import IMAGE_KINDS
        from fmcluster.providers.local import layers

        return [f"baked image for {kind} nodes: {layers.status(self.tenant.org, kind, layers.head_commit()).note}"
                for kind in IMAGE_KINDS if layers.record_path(self.tenant.org, kind).is_file()]

    def halt(self, node: str, out: Out) -> None:
        from fmcluster.providers.local.hosts import forget_host
        from fmcluster.providers.local.hypervisor import boot_lock, mark_halted

        with boot_lock(self.tenant.org):  # the hypervisor must not boot it again in between
            host = next((h for h in load_hosts(self.tenant.org) if node in (h.hostname, h.address, h.key)), None)
            if host is None:
                raise KeyError(f"no local host {escaped(node)}; hosts: "
                               f"{neutral(', '.join(h.hostname for h in load_hosts(self.tenant.org)))}")
            mark_halted(self.tenant.org, host.key)  # a crashed instance stays down: EC2 does not boot it again
            remove_host(host)
            forget_host(self.tenant.org, host.key)
        out(f"  halted host {host.hostname} ({host.address}): its processes and writable layer are gone; "
            f"its instance {host.key} still exists and stays down, as a crashed instance does (`invoke nodes-up` or a "
            "deploy boots it again)")

    def teardown(self, out: Out) -> None:
        from fmcluster.providers.local.hypervisor import stop_hypervisor
        from fmcluster.providers.local.emulator import stop_emulator

        if stop_hypervisor(self.tenant.org):  # first: it would boot what the rest of the teardown removes
            out(f"  stopped the hypervisor stand-in of '{self.tenant.org}'")
        if stop_package_source(self.tenant.org):
            out(f"  stopped the package source of '{self.tenant.org}' (its cache is kept)")
        if directory.stop_directory(self.tenant.org):
            out(f"  stopped the stand-in directory of '{self.tenant.org}' (slapd)")
        if stop_registry(self.tenant.org):
            out(f"  stopped the container registry of '{self.tenant.org}' (its images go with the substrate directory)")
        for line in remove_all(self.tenant.org):
            out(f"  removed {line}")
        if stop_emulator(self.tenant.org):
            out(f"  stopped the AWS emulator of '{self.tenant.org}' (its state goes with it)")
        from fmcluster.baked import kept_lines
        from fmcluster.providers.local.layers import baked_root

        try:
            kept = kept_lines(self.tenant.org)
        except ValueError as err:  # a record that cannot be read: its image is there all the same
            kept = [str(err)]
        if kept:  # the tenant's, like the package cache: said, not removed
            out(f"  kept the baked images of '{self.tenant.org}' in {baked_root(self.tenant.org)} (remove that folder "
                "to drop them):")
            for line in kept:
                out(f"    {line}")
