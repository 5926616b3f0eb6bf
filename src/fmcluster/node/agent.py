"""The node agent: how every node converges itself, at first boot and whenever its cluster changes.

    converge   read the manifest and the secrets, find this node among the cluster's nodes (AWS APIs),
               write the inventory, run ansible-pull for this node at the pinned commit, report
    watch      re-converge when the deploy publishes a new commit or manifest, or (controller and login
               nodes) when nodes join or leave; the node_convergence role keeps it running

It runs on the node's own toolchain (/opt/fmcluster/venv: ansible-core, ansible-runner, boto3, PyYAML) from
its checkout of the pinned commit, with the settings fmcluster-bootstrap wrote to /etc/fmcluster/node.env.
Every report goes to s3://<bucket>/fmcluster/report/<aws:userid>/<instance id>.json (and the log next to it): under
the node's own caller identity, "<role id>:<role session name>", the one prefix its role may write, named by its own
instance id, so nodes that share one role session (HyperPod's "SageMaker") never overwrite each other. `invoke
deploy` and `invoke status` read it there for that instance: no ssh from the deploy machine.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import boto3
from botocore.config import Config

from fmcluster.manifest import (INDEX_KEY, assemble_inventory, check_digest, digest, index_parameter, inventory_yaml,
                                membership_digest, membership_playbook, trusted_objects)
from fmcluster.baked import IMAGE_MARKER, booted_image, installed_since
from fmcluster.node.strategy import mitogen_env
from fmcluster.nodes import Node, discover, node_at

STATE_DIR = Path("/var/lib/fmcluster")
ETC_DIR = Path("/etc/fmcluster")
BUNDLE_DIR = Path("/opt/fmcluster/bootstrap")
VENV = Path("/opt/fmcluster/venv")
LOCK = Path("/run/fmcluster/converge.lock")
LOG = Path("/var/log/fmcluster/converge.log")
MANIFEST_KEY = "fmcluster/manifest/cluster.json"
BOOTSTRAP_PREFIX = "fmcluster/bootstrap/"
REPORT_PREFIX = "fmcluster/report/"
#: present in the state directory while its report.json is one the bucket did not take (the watch files it again)
UNFILED_MARK = "report.unfiled"
CONVERGE_TIMEOUT_S = 3600
LOG_TAIL_LINES = 40
#: What the user data installed: fetches a published bundle (`--fetch`) or boots the node.
BOOTSTRAP = "/usr/local/sbin/fmcluster-bootstrap"
#: The instance metadata service (EC2's, HyperPod's nodes', the local substrate's stand-in): the node's instance id.
#: AWS_EC2_METADATA_SERVICE_ENDPOINT names another, as the AWS SDKs read it.
IMDS = "http://169.254.169.254"
IMDS_TIMEOUT_S = 2.0

T = TypeVar("T")


def private_dir(path: Path) -> Path:
    """A directory only root reads (0700, also when it already exists): what the agent keeps that may hold a
    secret, the inventory (alert receiver URLs), Ansible's fact cache (the converge's environment) and the runner's
    artifacts (every task's output)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, only root's (0600) from its first byte: a new file renamed over the old one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    tmp.replace(path)


class StageFailed(RuntimeError):
    """A converge stage could not complete; the message names what could not be reached or read."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


@dataclass
class Settings:
    """What fmcluster-bootstrap passed on (node.env) and where things live on the node."""

    bucket: str
    region: str
    org: str
    ref: str
    playbook: str
    stack: str = ""
    signal_resource: str = ""
    fetch_tries: int = 8

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        missing = [k for k in ("FMCLUSTER_BUCKET", "FMCLUSTER_REGION", "FMCLUSTER_ORG", "FMCLUSTER_REF") if not env.get(k)]
        if missing:
            raise StageFailed("settings", f"{', '.join(missing)} not set (fmcluster-bootstrap writes {ETC_DIR}/node.env)")
        return Settings(env["FMCLUSTER_BUCKET"], env["FMCLUSTER_REGION"], env["FMCLUSTER_ORG"], env["FMCLUSTER_REF"],
                        env.get("FMCLUSTER_PLAYBOOK", "playbooks/site.yml"), env.get("FMCLUSTER_STACK", ""),
                        env.get("FMCLUSTER_SIGNAL_RESOURCE", ""), int(env.get("FMCLUSTER_FETCH_TRIES", "8")))


@dataclass
class Report:
    """One converge's outcome, as the deploy reads it."""

    address: str
    trigger: str
    started: str
    ok: bool = False
    stage: str = "start"
    error: str = ""
    node: str = ""
    role: str = ""
    queue: str | None = None
    instance_id: str = ""
    ref: str = ""
    manifest_digest: str = ""
    membership_digest: str = ""
    #: The playbook this converge ran: site.yml, or membership.yml when only the membership changed.
    playbook: str = ""
    changed: int | None = None
    failed_tasks: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    finished: str = ""
    log: str = ""
    log_tail: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: First boot only: seconds of each stage (the bootstrap's fetch, packages, toolchain, commit; then converge).
    boot_stages: dict[str, float] = field(default_factory=dict)
    #: First boot only: the image this node booted (a baked one names its digest; issue 40) and every package its
    #: first boot installed, name → version (dpkg.log of this boot: on a current baked image, none).
    image: str = ""
    first_boot_installed: dict[str, str] = field(default_factory=dict)
    #: The converge's slowest tasks, {"task", "seconds"}, slowest first: where a node's time went.
    slowest_tasks: list[dict[str, Any]] = field(default_factory=list)
    #: First boot only, on a failure it tries again: which attempt failed and when the next starts (the deploy
    #: waits on; a failure with no retry is final).
    retry: str = ""


#: How many of a converge's slowest tasks its report names.
SLOWEST_TASKS = 8

#: A first boot's converge is tried this often when it fails on something transient, waiting between tries: on AWS
#: one node's FAILURE signal rolls the whole cluster stack back, controller included, and a package mirror's or a
#: registry's hiccup on one of 16 nodes is not a reason to. Three converges and 4 minutes fit the hour a first boot
#: has (the cluster stack's signal timeout).
FIRST_BOOT_ATTEMPTS = 3
FIRST_BOOT_RETRY_DELAYS_S = (60.0, 180.0)
#: What a transient failure prints (apt, DNS, HTTP, S3 and registry throttling); anything else fails at once.
TRANSIENT_SIGNS = (
    "Failed to fetch", "Temporary failure resolving", "Temporary failure in name resolution", "Could not resolve",
    "Connection timed out", "Connection reset by peer", "Unable to fetch some archives", "Hash Sum mismatch",
    "Could not get lock", "502 Bad Gateway", "503 Service Unavailable", "504 Gateway Time", "Read timed out",
    "TooManyRequests", "toomanyrequests", "SlowDown", "RequestTimeout", "ThrottlingException",
)


def transient(report: Report) -> bool:
    """A converge that failed on something that goes away by itself (the evidence: its error, failed tasks, log end)."""
    evidence = " ".join([report.error, *(str(t.get("msg", "")) for t in report.failed_tasks), *report.log_tail])
    return not report.ok and report.stage == "converge" and any(sign in evidence for sign in TRANSIENT_SIGNS)


def checked_out(checkout: Path, ref: str) -> bool:
    """Whether `checkout` holds commit `ref` with nothing changed (tracked or not): what ansible-pull --clean leaves."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else "\0"
    return (checkout / ".git").exists() and git("rev-parse", "HEAD") == ref and git("status", "--porcelain") == ""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def my_address() -> str:
    """The address this node reaches AWS from: its primary private address (no packet is sent)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    target = urlparse(endpoint).hostname if endpoint else "169.254.169.254"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((target or "169.254.169.254", 9))
        return str(sock.getsockname()[0])


#: Linux's ioctl for an interface's IPv4 address (SIOCGIFADDR, <linux/sockios.h>).
SIOCGIFADDR = 0x8915


def my_addresses() -> list[str]:
    """Every IPv4 address this node's interfaces hold, the one it reaches AWS from (my_address) first. A node finds
    itself among the cluster's instances by any of them: a HyperPod instance has an address in the customer VPC
    (resource_config.json's CustomerIpAddress, the one SageMaker lists) and one on HyperPod's agent network
    (AgentIpAddress; awsome-distributed-ai, 5.sagemaker-hyperpod/tools/devops-agent/docs/hyperpod-mental-model.md),
    and which of them the route to the metadata service leaves from is not documented (AWS's lifecycle samples
    take the default route's, wait_for_hyperpod_slurm.sh every address, as this does)."""
    found = [my_address()]
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, name.encode()[:15].ljust(256, b"\0"))
            except OSError:
                continue  # no IPv4 address on this interface (an EFA-only one, a down link)
        address = socket.inet_ntoa(packed[20:24])
        if not address.startswith("127.") and address not in found:
            found.append(address)
    return found


def metadata_instance_id(base: str = "", timeout: float = IMDS_TIMEOUT_S) -> str:
    """This instance's id from the instance metadata service (IMDSv2: a session token first); "" when it answers
    none. HyperPod's nodes answer it too (awsome-distributed-training's patching-backup.sh keys each node's backup
    by it)."""
    base = (base or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or IMDS).rstrip("/")
    try:
        token_request = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                               headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        with urllib.request.urlopen(token_request, timeout=timeout) as response:
            token = response.read().decode()
        get = urllib.request.Request(f"{base}/latest/meta-data/instance-id",
                                     headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(get, timeout=timeout) as response:
            found = response.read().decode().strip()
    except (OSError, ValueError):
        return ""
    return found if found.startswith("i-") and "/" not in found else ""


def session_instance(user_id: str) -> str:
    """The instance a caller identity's session is named after ("<role id>:i-…", EC2's); "" for any other session."""
    session = user_id.rpartition(":")[2] if ":" in user_id else ""
    return session if session.startswith("i-") else ""


def retry(what: str, stage: str, tries: int, call: Callable[[], T], accept: Callable[[T], bool] = lambda _: True) -> T:
    """call() until it returns an accepted value; exponential backoff (2, 4 … 30 s); StageFailed naming `what`."""
    delay, last = 2.0, ""
    for attempt in range(1, tries + 1):
        try:
            value = call()
            if accept(value):
                return value
            last = "not ready"
        except Exception as err:  # noqa: BLE001 - any failure to reach it is retried, then reported
            last = f"{type(err).__name__}: {err}"
        if attempt < tries:
            print(f"fmcluster-node: {what}: {last} (try {attempt}/{tries}); retrying in {delay:.0f}s", file=sys.stderr)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
    raise StageFailed(stage, f"cannot {what} after {tries} tries: {last}")


class Agent:
    def __init__(self, settings: Settings, state_dir: Path = STATE_DIR, etc_dir: Path = ETC_DIR) -> None:
        self.settings = settings
        self.state_dir, self.etc_dir = state_dir, etc_dir
        config = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=5, read_timeout=60)
        self.session = boto3.session.Session(region_name=settings.region)
        self.config = config
        self.s3 = self.client("s3")
        self._identity = ""
        self._instance = ""

    def client(self, service: str) -> Any:
        return self.session.client(service, config=self.config)

    def identity(self) -> str:
        """This node's aws:userid (STS GetCallerIdentity, allowed to every caller): its report's name."""
        if not self._identity:
            user_id = str(self.client("sts").get_caller_identity()["UserId"])
            if not user_id or "/" in user_id:
                raise StageFailed("report", f"STS gave no usable caller identity ({user_id!r})")
            self._identity = user_id
        return self._identity

    def instance_id(self, report: Report) -> str:
        """This node's instance id, which names its report under its identity: the one discovery found it as (what
        the deploy reads it by), else the instance metadata service's, else its session's name where that names an
        instance (EC2's); "" when none says (the report then cannot be filed: it would speak for no node)."""
        if report.instance_id:
            return report.instance_id
        if not getattr(self, "_instance", ""):
            self._instance = self.metadata_instance_id() or session_instance(self.identity())
        return self._instance

    def metadata_instance_id(self) -> str:
        return metadata_instance_id()

    # --- what the deploy published ----------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            body = self.s3.get_object(Bucket=self.settings.bucket, Key=MANIFEST_KEY)["Body"].read()
            # The manifest drives what the roles do as root: used only once it is the deploy's (a mismatch is
            # retried, for a deploy publishing now names its new index last, then reported).
            self.verify(MANIFEST_KEY, body)
            loaded: dict[str, Any] = json.loads(body)
            return loaded

        where = f"read s3://{self.settings.bucket}/{MANIFEST_KEY} for commit {self.settings.ref[:12]}"
        # The deploy publishes the bundle, then the manifest that names its commit: wait until they agree.
        return retry(where, "manifest", self.settings.fetch_tries, read, lambda m: m.get("ref") == self.settings.ref)

    def verify(self, key: str, body: bytes) -> None:
        """Raise DigestMismatch unless `body` is what the deploy published as `key`: the SHA-256 its index lists, the
        index's own the one in the SSM parameter the deploy alone writes (the node role may only read it)."""
        parameter = index_parameter(self.settings.org)
        trusted = str(self.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"])
        index = self.s3.get_object(Bucket=self.settings.bucket, Key=INDEX_KEY)["Body"].read()
        check_digest(key, trusted_objects(index, trusted, parameter).get(key, ""), body)

    def secrets(self, manifest: dict[str, Any], role: str) -> list[str]:
        """Each shared secret this node's role reads into /etc/fmcluster/secrets/<name> (root only); returns the
        names written."""
        client = self.client("secretsmanager")
        folder = private_dir(self.etc_dir / "secrets")
        written = []
        for name, spec in sorted(manifest.get("secrets", {}).items()):
            if role not in spec.get("roles", []):
                continue
            secret = str(spec["id"])
            value = retry(f"read secret {secret} from Secrets Manager", "secrets", self.settings.fetch_tries,
                          lambda: str(client.get_secret_value(SecretId=secret)["SecretString"]))
            path = folder / name
            if not path.exists() or path.read_text() != value or path.stat().st_mode & 0o077:
                write_private(path, value)
                written.append(name)
        return written

    def discover(self, manifest: dict[str, Any]) -> list[Node]:
        return discover(manifest.get("discovery", {}), self.client, self.settings.org)

    def whoami(self, manifest: dict[str, Any], addresses: Sequence[str]) -> tuple[Node, list[Node]]:
        """This node among the cluster's instances, by any of its addresses (my_addresses), and all of them."""
        found: dict[str, Any] = {}

        def look() -> Node | None:
            found["nodes"] = self.discover(manifest)
            return next((n for n in (node_at(found["nodes"], a) for a in addresses) if n is not None), None)

        me = retry(f"find this node ({', '.join(addresses)}) among the cluster's instances "
                   f"(tag fmcluster:org={self.settings.org})",
                   "identity", self.settings.fetch_tries, look, lambda n: n is not None)
        assert me is not None
        return me, found["nodes"]

    # --- converge -----------------------------------------------------------------------------------------
    def write_inventory(self, manifest: dict[str, Any], nodes: list[Node]) -> Path:
        folder = private_dir(self.state_dir / "inventory")
        extra = {"fmcluster_aws_endpoint_url": os.environ.get("AWS_ENDPOINT_URL", ""),
                 "fmcluster_bucket": self.settings.bucket}
        document = assemble_inventory(manifest, nodes, extra)
        path = folder / "hosts.yml"
        text = inventory_yaml(document, "# written by the fmcluster node agent from the manifest and the AWS APIs\n")
        if not path.exists() or path.read_text() != text or path.stat().st_mode & 0o077:
            write_private(path, text)
        return path

    def run_playbook(self, me: Node, inventory: Path, report: Report, playbook: str) -> int:
        log = LOG
        log.parent.mkdir(parents=True, exist_ok=True)
        report.log = str(log)
        failed: list[dict[str, str]] = []
        stats: dict[str, Any] = {}
        took: dict[str, float] = {}

        def on_event(event: dict[str, Any]) -> bool:
            data = event.get("event_data", {})
            kind = event.get("event")
            if kind in ("runner_on_ok", "runner_on_failed", "runner_on_skipped") and \
                    isinstance(data.get("duration"), (int, float)):
                task = str(data.get("task", ""))
                took[task] = took.get(task, 0.0) + float(data["duration"])
            if kind == "playbook_on_task_start":
                print(f"fmcluster-node: [{me.name}] {data.get('task', '')}", flush=True)
            elif kind == "runner_on_failed" and not data.get("ignore_errors"):
                result = data.get("res", {})
                failed.append({"host": str(data.get("host", "")), "task": str(data.get("task", "")),
                               "msg": str(result.get("msg") or result.get("stderr") or "")[:500]})
            elif kind == "playbook_on_stats":
                stats.update(data)
            return True

        private = private_dir(self.state_dir / "runner")
        venv_bin = Path(sys.executable).parent
        checkout = self.state_dir / "pull"
        membership_pass = playbook != self.settings.playbook
        strategy = mitogen_env()
        # The modules' interpreter is the image's python3, from the manifest (images.yml contract python_interpreter:
        # the group vars' ansible_python_interpreter), never the venv's: Mitogen runs a module in place, where the apt
        # modules cannot re-start themselves under the interpreter that has the distribution's apt binding.
        play = ["--limit", me.name, "--extra-vars", "ansible_connection=local", playbook]
        env = {**clean_environment(), "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
               "ANSIBLE_INVENTORY": str(inventory), "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1",
               "PYTHONPATH": startup_path(os.environ.get("PYTHONPATH", "")),
               **fact_cache_env(private_dir(self.state_dir / "facts"), reuse=membership_pass)}
        if strategy:
            env.update(strategy)
        else:
            report.notes.append("Mitogen is missing from the node's venv (versions.yml node_toolchain): Ansible ran "
                                "its own linear strategy, a few times slower")
        if membership_pass and checked_out(checkout, self.settings.ref):
            # A membership pass of the commit already checked out (and unmodified): ansible-pull would only
            # check the same commit out again, a whole Ansible run of its own before the play.
            executable, argv, cwd = venv_bin / "ansible-playbook", play, str(checkout)
            report.notes.append(f"ran {playbook} in the checkout of {self.settings.ref[:12]} (no new commit to pull)")
        else:
            # The inventory goes through ANSIBLE_INVENTORY, not --inventory: ansible-pull then checks the repository
            # out on `localhost` alone, whereas with the inventory it would also run the checkout for this node's
            # own name (its hostname is in the inventory) at the same time, into the same directory.
            executable, cwd = venv_bin / "ansible-pull", None
            argv = ["--url", str(self.state_dir / "repo.git"), "--checkout", self.settings.ref,
                    "--directory", str(checkout), "--full", "--clean", *play]
        stdout, stderr, rc = run_ansible(executable, argv, cwd, env, private, on_event)
        write_private(log, stdout + ("\n" + stderr if stderr else ""))
        report.slowest_tasks = [{"task": task, "seconds": round(seconds, 1)} for task, seconds
                                in sorted(took.items(), key=lambda item: -item[1])[:SLOWEST_TASKS]]
        report.failed_tasks = failed
        report.changed = sum((stats.get("changed") or {}).values()) if stats else None
        report.log_tail = (stdout + stderr).strip().splitlines()[-LOG_TAIL_LINES:]
        return int(rc)

    def converge(self, trigger: str, membership_only: bool = False) -> Report:
        """Converge this node and report. `membership_only`: the commit and the manifest are the ones last
        converged and only the node list changed: the manifest's membership playbook (when it names one) runs
        instead of the whole site playbook. A first boot that fails on something transient tries again
        (FIRST_BOOT_ATTEMPTS), each failed try reported with its retry, before it signals."""
        started = time.monotonic()
        attempts = FIRST_BOOT_ATTEMPTS if trigger == "first-boot" else 1
        for attempt in range(1, attempts + 1):
            report = self.attempt(trigger, membership_only)
            if report.ok or attempt == attempts or not transient(report):
                break
            delay = FIRST_BOOT_RETRY_DELAYS_S[min(attempt, len(FIRST_BOOT_RETRY_DELAYS_S)) - 1]
            report.retry = (f"attempt {attempt} of {attempts} failed on a transient error; trying again in "
                            f"{delay:.0f}s")
            self.file_report(report)
            time.sleep(delay)
        if trigger == "first-boot":
            report.boot_stages = {**self.bootstrap_stages(), "converge": round(time.monotonic() - started, 1)}
            report.image, report.first_boot_installed = booted_image(Path(IMAGE_MARKER)), first_boot_installs()
            if attempt > 1:
                report.notes.append(f"first boot converged on attempt {attempt} of {attempts}" if report.ok
                                    else f"first boot failed {attempt} times")
        self.file_report(report)
        if trigger == "first-boot":
            self.signal(report)
        return report

    def attempt(self, trigger: str, membership_only: bool) -> Report:
        """One converge, its report filled in (not filed)."""
        started = time.monotonic()
        report = Report(address="unknown", trigger=trigger, started=now(), ref=self.settings.ref)
        try:
            report.stage = "identity"
            addresses = my_addresses()
            report.address = addresses[0]
            report.stage = "manifest"
            manifest = self.manifest()
            report.manifest_digest = digest(manifest)
            me, nodes = self.whoami(manifest, addresses)
            report.address = me.address  # the address the cluster knows this node by
            report.node, report.role, report.queue, report.instance_id = me.name, me.role, me.queue, me.instance_id
            report.membership_digest = membership_digest(nodes)
            report.stage = "secrets"
            written = self.secrets(manifest, me.role)
            if written:
                report.notes.append(f"secrets written: {', '.join(written)}")
            report.stage = "inventory"
            inventory = self.write_inventory(manifest, nodes)
            report.stage = "converge"
            report.playbook = (membership_only and membership_playbook(manifest)) or self.settings.playbook
            rc = self.run_playbook(me, inventory, report, report.playbook)
            if rc != 0:
                first = report.failed_tasks[0] if report.failed_tasks else {}
                raise StageFailed("converge", f"ansible-pull exited {rc}" +
                                  (f": task '{first.get('task')}': {first.get('msg')}" if first else ""))
            report.ok = True
            report.stage = "done"
            self.record_converged(report)
        except StageFailed as err:
            report.stage, report.error = err.stage, str(err)
        except Exception as err:  # noqa: BLE001 - whatever broke, the deploy must hear about it
            report.error = f"{type(err).__name__}: {err}"
            report.log_tail = traceback.format_exc().splitlines()[-LOG_TAIL_LINES:]
        report.seconds = round(time.monotonic() - started, 1)
        report.finished = now()
        return report

    def fetch_commit(self, ref: str) -> bool:
        """fmcluster-bootstrap --fetch of a newly published commit. A failure is reported (stage `bundle`, with
        what the bootstrap could not do): the deploy waiting for this commit hears it instead of timing out."""
        started = time.monotonic()
        # Who this node is, from its last report (the bootstrap's own failure report would overwrite it).
        last = json.loads((self.state_dir / "report.json").read_text()) if (self.state_dir / "report.json").is_file() else {}
        done = subprocess.run([BOOTSTRAP, "--fetch"], capture_output=True, text=True, check=False)
        print(done.stdout + done.stderr, end="", file=sys.stderr, flush=True)
        if done.returncode == 0:
            return True
        tail = (done.stdout + done.stderr).strip().splitlines()[-LOG_TAIL_LINES:]
        report = Report(address=my_address(), trigger=f"new commit {ref[:12]}", started=now(), stage="bundle",
                        error=f"cannot fetch the bundle of commit {ref[:12]}: {BOOTSTRAP} --fetch exited "
                              f"{done.returncode}: {tail[-1] if tail else 'no output'}",
                        node=last.get("node", ""), role=last.get("role", ""), queue=last.get("queue"),
                        instance_id=last.get("instance_id", ""), ref=ref, log_tail=tail,
                        seconds=round(time.monotonic() - started, 1), finished=now())
        self.file_report(report)
        return False

    def bootstrap_stages(self) -> dict[str, float]:
        """The stage times node-bootstrap.sh recorded for this boot (none when it could not)."""
        try:
            raw = json.loads((self.state_dir / "boot-stages.json").read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float))} if isinstance(raw, dict) else {}

    def record_converged(self, report: Report) -> None:
        state = {"ref": report.ref, "manifest_digest": report.manifest_digest,
                 "membership_digest": report.membership_digest, "finished": now()}
        (self.state_dir / "converged.json").write_text(json.dumps(state, indent=1) + "\n")

    def converged(self) -> dict[str, str]:
        try:
            loaded: dict[str, str] = json.loads((self.state_dir / "converged.json").read_text())
            return loaded
        except (OSError, ValueError):
            return {}

    def file_report(self, report: Report) -> None:
        body = json.dumps(asdict(report), indent=1)
        write_private(self.state_dir / "report.json", body + "\n")
        self._put_report(report, body)
        print(f"fmcluster-node: {report.node or report.address}: {'converged' if report.ok else 'FAILED'} "
              f"(stage {report.stage}) in {report.seconds}s {report.error}", flush=True)

    def file_unfiled_report(self) -> None:
        """File again the last report the bucket did not take (its endpoint out of reach for all the client's
        retries): the deploy waits for it, and without it would wait out its whole budget for a node long done."""
        if not (self.state_dir / UNFILED_MARK).is_file():
            return
        try:
            body = (self.state_dir / "report.json").read_text().rstrip("\n")
            report = Report(**json.loads(body))
        except (OSError, ValueError, TypeError):
            (self.state_dir / UNFILED_MARK).unlink(missing_ok=True)  # nothing readable to file
            return
        if self._put_report(report, body):  # the body file_report wrote, as it wrote it
            print(f"fmcluster-node: filed the report of the converge started {report.started}, which the bucket had "
                  "not taken then", flush=True)

    def _put_report(self, report: Report, body: str) -> bool:
        key = f"{REPORT_PREFIX}<identity>/<instance id>"
        try:
            identity = self.identity()
            key = f"{REPORT_PREFIX}{identity}/<instance id>"
            instance = self.instance_id(report)
            if not instance:
                raise StageFailed("report", "no instance id: discovery did not find this node, the instance metadata "
                                            "service gave none and the caller identity's session names no instance")
            key = f"{REPORT_PREFIX}{identity}/{instance}"
            self.s3.put_object(Bucket=self.settings.bucket, Key=f"{key}.json", Body=body.encode())
            if report.log and Path(report.log).is_file():
                self.s3.put_object(Bucket=self.settings.bucket, Key=f"{key}.log", Body=Path(report.log).read_bytes())
        except Exception as err:  # noqa: BLE001 - the watch files it again; until then the deploy sees a silent node
            print(f"fmcluster-node: cannot file the report to s3://{self.settings.bucket}/{key}.json: {err}",
                  file=sys.stderr)
            (self.state_dir / UNFILED_MARK).touch()
            return False
        (self.state_dir / UNFILED_MARK).unlink(missing_ok=True)
        return True

    def signal(self, report: Report) -> None:
        """Tell CloudFormation the node is ready, or that its first boot failed (CreationPolicy of its group), once, at
        first boot. A FAILURE fails the group (and rolls the stack back) at once instead of at the signal Timeout,
        also when the converge failed before the node knew itself from the manifest: its instance id is then the
        instance metadata service's (or its caller identity's session's, EC2's "<role id>:<instance id>")."""
        if not (self.settings.stack and self.settings.signal_resource):
            return
        try:
            unique_id = self.instance_id(report) or self.identity().rsplit(":", 1)[-1]
            self.client("cloudformation").signal_resource(
                StackName=self.settings.stack, LogicalResourceId=self.settings.signal_resource,
                UniqueId=unique_id, Status="SUCCESS" if report.ok else "FAILURE")
        except Exception as err:  # noqa: BLE001 - the stack's own timeout is the gate; say why it will fire
            print(f"fmcluster-node: signal to {self.settings.stack}/{self.settings.signal_resource} failed: {err}",
                  file=sys.stderr)

    # --- watch --------------------------------------------------------------------------------------------
    def wanted(self, role: str) -> dict[str, str]:
        """What a converge would be made for now: commit, manifest and (controller, login) membership."""
        env = self.s3.get_object(Bucket=self.settings.bucket, Key=f"{BOOTSTRAP_PREFIX}converge.env")["Body"].read()
        ref = next((line.split("=", 1)[1].strip() for line in env.decode().splitlines()
                    if line.startswith("FMCLUSTER_REF=")), "")
        manifest = json.loads(self.s3.get_object(Bucket=self.settings.bucket, Key=MANIFEST_KEY)["Body"].read())
        wanted = {"ref": ref, "manifest_digest": digest(manifest)}
        if role in ("controller", "login"):
            wanted["membership_digest"] = membership_digest(self.discover(manifest))
        return wanted


def first_boot_installs(dpkg_log: Path = Path("/var/log/dpkg.log")) -> dict[str, str]:
    """What dpkg installed since this machine booted (its uptime back from now, in dpkg.log's local time)."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        text = dpkg_log.read_text(errors="replace")
    except (OSError, ValueError, IndexError):
        return {}
    return installed_since(text, datetime.fromtimestamp(time.time() - uptime))


def run_ansible(executable: Path, argv: list[str], cwd: str | None, env: dict[str, str], private: Path,
                on_event: Callable[[dict[str, Any]], bool]) -> tuple[str, str, int]:
    """One Ansible command through ansible-runner (its events: progress, failed tasks, timings). The runner's own
    per-run fact cache is off: it would point the cache at a fresh artifacts directory every run, and the node's
    cache (fact_cache_env) must outlive the run that recorded it."""
    import ansible_runner

    stdout, stderr, rc = ansible_runner.run_command(
        executable_cmd=str(executable), cmdline_args=argv, private_data_dir=str(private), host_cwd=cwd,
        event_handler=on_event, envvars=env, quiet=True, timeout=CONVERGE_TIMEOUT_S, rotate_artifacts=3,
        fact_cache_type="none")
    return str(stdout), str(stderr), int(rc)


def fact_cache_env(directory: Path, reuse: bool) -> dict[str, str]:
    """Ansible settings of the node's fact cache: every converge gathers and records this host's facts; a
    membership pass (`reuse`) reads the recorded ones instead of gathering again (a second of a few: nothing
    about the host changes when another node joins)."""
    return {"ANSIBLE_CACHE_PLUGIN": "jsonfile", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(directory),
            "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "0", "ANSIBLE_GATHERING": "smart" if reuse else "implicit"}


#: sitecustomize for the Pythons of the agent's Ansible runs: the bytecode cache of module payloads
#: (fmcluster.node.bytecode_cache), which the agent's own source provides.
STARTUP_DIR = Path(__file__).resolve().parent / "startup"
AGENT_SRC = Path(__file__).resolve().parents[2]


def startup_path(inherited: str) -> str:
    """PYTHONPATH of an Ansible run: the startup folder first, the agent's source, then what the agent had."""
    entries = [str(STARTUP_DIR), str(AGENT_SRC), *[e for e in inherited.split(os.pathsep) if e]]
    return os.pathsep.join(dict.fromkeys(entries))


#: Variables of an enclosing Ansible or ansible-runner run: a daemon started from inside a converge must not
#: hand them to the converges it runs later (the runner's own callback would be loaded twice).
INHERITED_PREFIXES = ("ANSIBLE_", "RUNNER_", "AWX_")


def clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_PREFIXES)}


@contextmanager
def converge_lock() -> Iterator[None]:
    """One converge at a time on a node (first boot, the watcher, an operator)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def converge_main(trigger: str) -> int:
    try:
        settings = Settings.from_env()
    except StageFailed as err:
        print(f"fmcluster-node: {err}", file=sys.stderr)
        return 2
    with converge_lock():
        report = Agent(settings).converge(trigger)
    return 0 if report.ok else 1


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines of a file fmcluster-bootstrap wrote (values never need shell unquoting)."""
    values = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip().strip("'\"")
    return values


def watch_main(interval: float) -> int:
    """Poll what the deploy published and the cluster's membership; re-converge on a difference.

    A failed converge is retried with backoff (up to 10 minutes) unless what is wanted changes again."""
    settings = Settings.from_env()
    agent = Agent(settings)
    backoff, next_try = interval, 0.0
    failed_for: dict[str, str] = {}
    while True:
        try:
            agent.file_unfiled_report()
            role = json.loads((STATE_DIR / "report.json").read_text()).get("role", "") \
                if (STATE_DIR / "report.json").is_file() else ""
            wanted = agent.wanted(role)
            stale = [k for k, v in wanted.items() if agent.converged().get(k) != v]
            if stale and wanted["ref"] != settings.ref and (wanted != failed_for or time.monotonic() >= next_try):
                # A new commit: fetch its bundle, then become the new commit's agent (it converges next round).
                if agent.fetch_commit(wanted["ref"]):
                    env = {**os.environ, **read_env_file(ETC_DIR / "node.env")}
                    os.execve(sys.executable, [sys.executable, "-m", "fmcluster.node", "watch", "--interval",
                                               str(interval)], env)
                backoff = backoff * 2 if wanted == failed_for else interval * 2
                failed_for, next_try = wanted, time.monotonic() + min(backoff, 600.0)
                continue
            if stale and (wanted != failed_for or time.monotonic() >= next_try):
                with converge_lock():
                    # Another converge (first boot, an operator) may have finished while this one waited.
                    stale = [k for k, v in wanted.items() if agent.converged().get(k) != v]
                    if not stale:
                        continue
                    trigger = f"changed: {', '.join(stale)}"
                    report = agent.converge(trigger, membership_only=stale == ["membership_digest"])
                    if not report.ok and report.playbook != settings.playbook:
                        # The targeted pass failed: the whole converge repairs whatever it could not.
                        report = agent.converge(f"{trigger} (membership pass failed: {report.error})")
                if report.ok:
                    backoff, failed_for = interval, {}
                else:
                    backoff = backoff * 2 if wanted == failed_for else interval * 2
                    failed_for, next_try = wanted, time.monotonic() + min(backoff, 600.0)
        except Exception as err:  # noqa: BLE001 - keep watching; the next round retries
            print(f"fmcluster-node: watch: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        time.sleep(interval)
