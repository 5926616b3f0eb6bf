"""What AWS ParallelCluster refuses, refused by fmcluster before anything runs, each naming the tenant key.

`fmcluster.validation` finds this module through the scheduler's folder (validation.scheduler_rules: a
scheduler's rules.py, `check_tenant(tenant, add)`, `DATABASE_USERS`) and runs it on the raw spec of a
parallelcluster tenant (no tool environment needed), so a bad value is reported with the file, line, key and fix
like every other problem. That no other scheduler's tenant carries the `parallelcluster` section is validation's
own generic rule (capabilities.yml's own_section). The numbers and names mirror
ParallelCluster 3.16's own rules; tests/test_parallelcluster_schema.py compares them with the package's
constants in the tool environment, so a ParallelCluster upgrade that changes one fails a test instead of
drifting silently.

What cannot be checked offline, and where it is checked instead: that a capacity reservation exists,
holds the queue's instance type, sits in the tenant's availability zone, has room for `count` nodes and
is (or is not) a Capacity Block — ParallelCluster's CapacityReservationValidator and
CapacityTypeValidator ask EC2 for that during `pcluster create-cluster --dryrun true`, which the deploy
runs before the real create.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fmcluster.escape import escaped, neutral
from fmcluster.manifest import SECRET_NAMES, secret_prefix

KeyPath = tuple[str | int, ...]
Add = Callable[[KeyPath, str, str], None]

#: pcluster.validators.cluster_validators.NAME_REGEX / NAME_MAX_LENGTH (queues and compute resources).
NAME_REGEX = re.compile(r"^[a-z][a-z0-9\-]*$")
NAME_MAX_LENGTH = 25
#: pcluster.constants.MAX_NUMBER_OF_QUEUES / MAX_NUMBER_OF_COMPUTE_RESOURCES_PER_CLUSTER.
MAX_QUEUES = 50
MAX_COMPUTE_RESOURCES_PER_CLUSTER = 50
#: pcluster.validators.cluster_validators.SharedStorageMountDirValidator's reserved directories.
RESERVED_MOUNT_DIRS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/media", "/mnt", "/opt", "/opt/parallelcluster",
    "/opt/parallelcluster/shared", "/opt/parallelcluster/shared_login_nodes", "/opt/slurm", "/opt/intel",
    "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
)
#: pcluster.constants.DEFAULT_EPHEMERAL_DIR: where ParallelCluster mounts instance-store volumes.
EPHEMERAL_DIR = "/scratch"
#: Every region fmcluster knows (fmcluster.validation.KNOWN_REGIONS) is in the commercial partition.
SECRET_PARTITION = "aws"
#: AWS tag values (ParallelCluster puts `programme` and `org` on every resource as tags; at most 256).
TAG_VALUE = re.compile(r"^[\w .:/=+\-@]{0,256}$")
#: Instance types of the catalog that EC2 sells as Capacity Blocks for ML (EC2 user guide, "Capacity
#: Blocks for ML", supported instance types). EC2's own answer (SupportedUsageClasses) is checked by
#: ParallelCluster's CapacityTypeValidator at `--dryrun`; this list refuses the obvious mistakes offline.
CAPACITY_BLOCK_TYPES = frozenset({
    "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "trn1.32xlarge", "trn2.48xlarge",
})
#: The value of a queue's `capacity_reservation_type` that makes it a ParallelCluster CAPACITY_BLOCK queue.
CAPACITY_BLOCK = "capacity-block"
#: The keys of the section naming a database user: validation refuses the database server's administrators there
#: as it does for accounting.database_user.
DATABASE_USERS: tuple[KeyPath, ...] = (("parallelcluster", "accounting", "user_name"),)
#: Image/Os when the tenant names none (the schema's default of parallelcluster.os).
DEFAULT_OS = "ubuntu2204"


def official_image(os_name: str) -> str:
    """ParallelCluster's official AMI of an OS, as the image catalog names it (this folder's images.yml)."""
    return f"parallelcluster-{os_name}"


def check_tenant(tenant: dict[str, Any], add: Add) -> None:
    """Refuse, naming the tenant key, what a ParallelCluster 3 cluster config could not hold."""
    t: KeyPath = ("tenant",)
    raw_queues = tenant.get("queues")
    queues: list[Any] = raw_queues if isinstance(raw_queues, list) else []
    # One queue renders one compute resource: both limits bound the number of queues.
    limit = min(MAX_QUEUES, MAX_COMPUTE_RESOURCES_PER_CLUSTER)
    if len(queues) > limit:
        add((*t, "queues"), f"{len(queues)} queues; AWS ParallelCluster supports at most {MAX_QUEUES} Slurm queues and "
            f"{MAX_COMPUTE_RESOURCES_PER_CLUSTER} compute resources per cluster",
            f"merge queues of the same instance type, or split the tenant (at most {limit} queues)")
    for i, queue in enumerate(queues):
        if isinstance(queue, dict):
            _check_queue(queue, (*t, "queues", i), add)
    programme = tenant.get("programme")
    if isinstance(programme, str) and not TAG_VALUE.match(programme):
        add((*t, "programme"), "ParallelCluster tags every resource with it, and it is not a valid AWS tag value",
            "use at most 256 letters, digits, spaces and . : / = + - @ _")
    for fs, default in (("lustre", "/fsx"), ("openzfs", "/home")):
        section = tenant.get("storage", {}).get(fs) if isinstance(tenant.get("storage"), dict) else None
        if isinstance(section, dict):
            mount = section.get("mount_point", default)
            if isinstance(mount, str) and "/" + mount.strip("/") in RESERVED_MOUNT_DIRS:
                add((*t, "storage", fs, "mount_point"), f"'{mount}' is reserved by AWS ParallelCluster",
                    f"use a directory of its own, e.g. {default}")
        if isinstance(section, dict):
            mount = section.get("mount_point", default)
            if isinstance(mount, str) and "/" + mount.strip("/") == EPHEMERAL_DIR:
                add((*t, "storage", fs, "mount_point"), f"'{mount}' is where AWS ParallelCluster mounts the "
                    "instance store", f"use a directory of its own, e.g. {default}")
    _check_image(tenant, add)
    endpoint = tenant.get("accounting", {}).get("database_endpoint") if isinstance(tenant.get("accounting"), dict) \
        else None
    if isinstance(endpoint, str):
        add((*t, "accounting", "database_endpoint"), "ParallelCluster runs slurmdbd against "
            "parallelcluster.accounting's database; a top-level database_endpoint beside it would be ignored",
            "give your database as parallelcluster.accounting.uri (with password_secret_arn), and remove "
            "accounting.database_endpoint")
    accounting = tenant.get("parallelcluster", {}).get("accounting") \
        if isinstance(tenant.get("parallelcluster"), dict) else None
    if isinstance(accounting, dict):
        a: KeyPath = (*t, "parallelcluster", "accounting")
        given = [k for k in ("uri", "password_secret_arn") if k in accounting]
        if len(given) == 1:
            missing = "password_secret_arn" if given == ["uri"] else "uri"
            add((*a, given[0]), f"{given[0]} without {missing}: your own database needs both",
                f"give {missing} as well, or remove {given[0]} to have fmcluster create the database")
        user = accounting.get("user_name", "slurm")
        if not given and isinstance(user, str) and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,15}", user):
            add((*a, "user_name"), f"{user!r} cannot be the master user of the database fmcluster creates (RDS MySQL)",
                "use 1-16 letters, digits or underscores, starting with a letter")
        _check_secret_arn(tenant, accounting.get("password_secret_arn"), add)
    else:
        # ParallelCluster's Slurm has slurmdbd only with SlurmSettings/Database: teams and QoS need it.
        for section in ("teams", "qos"):
            if tenant.get(section):
                add((*t, section), f"{section} are Slurm accounting objects, and this ParallelCluster cluster has no "
                    "Slurm accounting (parallelcluster.accounting is absent)",
                    "add `accounting: {}` under parallelcluster (fmcluster creates the database), or your own "
                    "database's uri and password_secret_arn")


def _check_image(tenant: dict[str, Any], add: Add) -> None:
    """Every node of the cluster boots ParallelCluster's official AMI of `parallelcluster.os`; the manifest gives the
    roles that image's contract, so an OS whose image has none in the catalog cannot be planned or deployed (plan
    stopped on it with a traceback). The schema allows the OSes ParallelCluster and the roles could serve; this names
    the ones fmcluster has checked."""
    from fmcluster.images import load_images

    section = tenant.get("parallelcluster")
    os_name = section.get("os", DEFAULT_OS) if isinstance(section, dict) else DEFAULT_OS
    if not isinstance(os_name, str):
        return  # the schema refuses it
    images = load_images().images
    if official_image(os_name) not in images:
        known = sorted(name.removeprefix("parallelcluster-") for name in images if name.startswith("parallelcluster-"))
        add(("tenant", "parallelcluster", "os"),
            f"the image catalog has no contract for ParallelCluster's {escaped(os_name)} AMI, so what fmcluster's roles "
            "assume of its nodes is unchecked and the deploy's manifest cannot be built",
            f"use {' or '.join(known)}, or add image {official_image(neutral(os_name))} to "
            "src/fmcluster/schedulers/parallelcluster/images.yml "
            "(each fact with its public source; tests/test_image_contract.py checks the roles against it)")


def _check_secret_arn(tenant: dict[str, Any], arn: Any, add: Add) -> None:
    """The database password secret is the tenant's own: ParallelCluster grants the head node read access to
    the ARN named here, so another tenant's secret (its munge key) or another account's must not be nameable."""
    region, org = tenant.get("region"), tenant.get("org")
    parts = arn.split(":", 6) if isinstance(arn, str) else []
    if len(parts) != 7 or parts[2] != "secretsmanager" or parts[5] != "secret":
        return  # the schema's pattern reports the form
    k: KeyPath = ("tenant", "parallelcluster", "accounting", "password_secret_arn")
    name = parts[6]
    if parts[1] != SECRET_PARTITION:
        add(k, f"the secret is in partition {escaped(parts[1])}, the tenant's region in {SECRET_PARTITION!r}",
            f"name a secret of the tenant's own account: arn:{SECRET_PARTITION}:secretsmanager:REGION:ACCOUNT:secret:...")
    if isinstance(region, str) and parts[3] != region:
        add(k, f"the secret is in {neutral(parts[3])}, the cluster in {neutral(region)}",
            f"store the database password as a secret in {region} and name its ARN here")
    if isinstance(org, str):
        own = secret_prefix(org)
        if not name.startswith(own):
            add(k, f"the secret {escaped(name, 80)} is not under the tenant's own prefix {own!r}: the head node would "
                "be granted read access to it", f"store the database password as {own}slurmdbd-password and name its ARN")
        elif re.sub(r"-[A-Za-z0-9]{6}$", "", name.removeprefix(own)) in SECRET_NAMES:
            add(k, f"{escaped(name, 80)} is a secret fmcluster manages for the nodes, not a database password",
                f"store the database password as {own}slurmdbd-password and name its ARN")


def secret_account_problem(password_secret_arn: str, account: str) -> str | None:
    """Why the database password secret is not in the deploying account (None when it is). The spec names no
    account, so this runs at deploy, with the caller's account, before `pcluster create-cluster`."""
    parts = password_secret_arn.split(":")
    if len(parts) < 5 or parts[4] != account:
        shown = parts[4] if len(parts) >= 5 else "?"
        return (f"parallelcluster.accounting.password_secret_arn is in account {shown!r}, the deploy in {account!r}: "
                "store the database password as a secret of the tenant's own account, under fmcluster/<org>/")
    return None


def _check_queue(queue: dict[str, Any], q: KeyPath, add: Add) -> None:
    name = queue.get("name")
    if isinstance(name, str):
        if len(name) > NAME_MAX_LENGTH:
            add((*q, "name"), f"{escaped(name)} has {len(name)} characters; AWS ParallelCluster queue names have at most "
                f"{NAME_MAX_LENGTH}", f"shorten it to {NAME_MAX_LENGTH} characters or fewer")
        if name == "default":
            add((*q, "name"), "AWS ParallelCluster forbids the queue name 'default'",
                "use another name; mark the default queue with `default: true`")
    kind = queue.get("capacity_reservation_type")
    if kind == CAPACITY_BLOCK:
        itype = queue.get("instance_type")
        if isinstance(itype, str) and itype not in CAPACITY_BLOCK_TYPES:
            add((*q, "capacity_reservation_type"), f"{neutral(itype)} is not sold as EC2 Capacity Blocks for ML",
                f"use a capacity block of one of: {', '.join(sorted(CAPACITY_BLOCK_TYPES))}; or an On-Demand "
                "Capacity Reservation (capacity_reservation_type: default)")
        if not queue.get("capacity_reservation_id"):
            add((*q, "capacity_reservation_type"), "a Capacity Block queue needs the reservation it launches into",
                "set capacity_reservation_id to the Capacity Block's reservation id (cr-...)")

