"""The node boot contract: what every node runs at first boot, whatever made it, and what it reports.

- The slurm-ec2 launch templates' UserData and HyperPod's lifecycle (on_create.sh, fmcluster-lifecycle.env) both
  run src/fmcluster/node/boot/node-user-data.sh with the same settings, which fetches and runs src/fmcluster/node/boot/node-bootstrap.sh.
- node-bootstrap.sh `--fetch` unpacks the pinned commit the deploy published and writes /etc/fmcluster/node.env.
- The node agent (python -m fmcluster.node converge) reads the manifest and the secrets, finds itself among the
  cluster's instances, converges with ansible-pull and files its report in the bucket; each way it can fail
  names what it could not reach.

The scripts hard-code the node's paths (/etc/fmcluster, /var/lib/fmcluster, /usr/local/sbin), so they run in
a throw-away local host (fmcluster.providers.local.hosts: own address, hostname and filesystem) against a real
AWS emulator (moto's server, fmcluster.providers.local.emulator) listening on the host's VPC router address, with the
real AWS CLI of the toolchain — as a node of provider local runs them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from fmcluster.paths import NODE_BOOT_DIR
from fmcluster import versions
from fmcluster.manifest import INDEX_KEY, digest
from fmcluster.model import Tenant, load_tenant
from fmcluster.providers.local.hosts import (
    Bind, Host, HostSpec, bridge_name, ensure_network, host_run, reconcile_hosts, remove_all, router_address,
)
from fmcluster.publish import bootstrap_files, ensure_secrets, index_document, pinned_commit, publish, trust_index
from fmcluster.schedulers.hyperpod.scheduler import LIFECYCLE_ENV, HyperPod
from fmcluster.stacks import aws
from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator
from fmcluster.stacks.render import first_boot_script, load_cfn_yaml
from scheduler_stacks import render_stacks
from localtenant import make_root, manifest_for

ORG = "t-boot"
VPC = "10.93.40.0/24"
PRIVATE = "10.93.40.128/25"
ADDRESS = "10.93.40.132"
HOSTNAME = "ip-10-93-40-132"
BUCKET = "fmc-t-boot-data"
PLAYBOOK = "playbooks/node-convergence.yml"
RECEIVER_URL = "https://hooks.slack.com/services/T0FMC/B0FMC/receiver-url-is-a-secret"
SETTINGS = ("FMCLUSTER_BUCKET", "FMCLUSTER_REGION", "FMCLUSTER_ORG")
BUILT_VENV = "/opt/fmcluster/venv-from-wheelhouse"


def required_settings() -> set[str]:
    """What node-bootstrap.sh refuses to run without (`${VAR:?…}`)."""
    return set(re.findall(r"\$\{(FMCLUSTER_[A-Z_]+):\?", (NODE_BOOT_DIR / "node-bootstrap.sh").read_text()))


def launch_templates(tenant: Tenant) -> dict[str, Any]:
    cluster = next(s for s in render_stacks(tenant) if s.key == "cluster")
    template: dict[str, Any] = load_cfn_yaml(cluster.body)
    return template


def user_data_script(resource: dict[str, Any], refs: dict[str, str]) -> str:
    """A launch template's UserData as EC2 hands it to the instance (Fn::Base64 of an Fn::Join, Refs resolved)."""
    joined = resource["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"]
    assert joined[0] == "", "joined without a separator"
    return "".join(part if isinstance(part, str) else refs[part["Ref"]] for part in joined[1])


def assignments(script: str) -> dict[str, str]:
    """The FMCLUSTER_* settings a script makes before its first command, as the shell reads them (unquoted)."""
    head = script.split("set -euo pipefail", 1)[0]
    return {name: "".join(shlex.split(value))
            for name, value in re.findall(r"^(?:export )?(FMCLUSTER_[A-Z_]+)=(.*)$", head, re.MULTILINE)}


# --- the rendered contract (no host needed) ------------------------------------------------------------------

@pytest.mark.parametrize("org", ["demo", "stockmark"])
def test_every_launch_template_runs_node_user_data_after_setting_the_bootstrap_s_settings(org: str) -> None:
    tenant = load_tenant(org)
    template = launch_templates(tenant)
    resources = template["Resources"]
    assert "DataBucketName" in template["Parameters"]
    lts = {lid: r for lid, r in resources.items() if r["Type"] == "AWS::EC2::LaunchTemplate"}
    assert len(lts) == 2 + len(tenant.queues)  # controller, login, one per queue
    for lid, resource in lts.items():
        script = user_data_script(resource, {"DataBucketName": "b", "AWS::Region": "r", "AWS::StackName": "s"})
        assert script.startswith("#!/bin/bash\n") and script.endswith(first_boot_script()), lid
        settings = assignments(script)
        assert settings["FMCLUSTER_BUCKET"] == "b" and settings["FMCLUSTER_REGION"] == "r", lid
        assert settings["FMCLUSTER_ORG"] == org and settings["FMCLUSTER_STACK"] == "s", lid
        assert required_settings() <= set(settings), lid
        # CloudFormation waits for the node's signal on the group that made it; the controller instance is
        # pinned and not waited on (it converges after the groups' nodes have started).
        if not settings["FMCLUSTER_SIGNAL_RESOURCE"]:
            (maker,) = [r for r in resources.values() if r["Type"] == "AWS::EC2::Instance"
                        and r["Properties"]["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": lid}]
            assert "CreationPolicy" not in maker, lid
            continue
        signalled = resources[settings["FMCLUSTER_SIGNAL_RESOURCE"]]
        assert signalled["Type"] == "AWS::AutoScaling::AutoScalingGroup" and "CreationPolicy" in signalled, lid
        assert signalled["Properties"]["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": lid}


def test_the_hyperpod_lifecycle_runs_the_same_user_data_script_with_the_same_settings() -> None:
    tenant = load_tenant("demo")
    files = HyperPod(tenant).lifecycle_files("fmc-demo-data")
    assert files["node-user-data.sh"] == first_boot_script().encode()
    settings = assignments(files[LIFECYCLE_ENV].decode())
    assert {k: settings[k] for k in ("FMCLUSTER_BUCKET", "FMCLUSTER_REGION", "FMCLUSTER_ORG")} == {
        "FMCLUSTER_BUCKET": "fmc-demo-data", "FMCLUSTER_REGION": tenant.region, "FMCLUSTER_ORG": "demo"}
    # A HyperPod node learns its group from HyperPod and is not waited on by CloudFormation.
    assert settings["FMCLUSTER_ROLE"] == settings["FMCLUSTER_QUEUE"] == settings["FMCLUSTER_SIGNAL_RESOURCE"] == ""
    assert required_settings() == set(SETTINGS) <= set(settings)
    on_create = files["on_create.sh"].decode()
    assert on_create == (ROOT / "src/fmcluster/schedulers/hyperpod/node_files" / "on_create.sh").read_text()
    assert f'set -a\n# shellcheck source=/dev/null\n. "$here/{LIFECYCLE_ENV}"\nset +a\n' in on_create
    assert on_create.rstrip().endswith('exec bash "$here/node-user-data.sh"')


# --- a node on the local substrate -----------------------------------------------------------------------------

#: The name of the node's role session: an instance id, as EC2 names an instance profile's session.
SESSION_INSTANCE = "i-0b007e57b007e57b0"


@dataclass
class Node:
    """The throw-away host, the emulator it reaches, and the tenant and commit it boots."""

    host: Host
    endpoint: str
    tenant: Tenant
    ref: str
    manifest: dict[str, Any]
    session: dict[str, str]

    def client(self, service: str) -> Any:
        return aws.client(service, self.tenant.region, self.endpoint)

    def env(self, **extra: str) -> dict[str, str]:
        """What an instance's user data has: its AWS endpoint, its role session named after the instance (as EC2
        names an instance profile's: this bare host has no metadata service to ask), the toolchain."""
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/fmcluster/venv/bin",
                "AWS_ENDPOINT_URL": self.endpoint, **self.session, **extra}

    def run(self, script: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return host_run(self.host, ["bash", "-c", script], env=self.env(**(env or {})), timeout=timeout)

    def put(self, path: str, content: str, mode: str = "0644") -> None:
        done = host_run(self.host, ["sh", "-c", f"install -d {os.path.dirname(path)} && cat > {path} && chmod {mode} {path}"],
                        input_text=content)
        assert done.returncode == 0, done.stderr

    def read(self, path: str) -> str:
        done = host_run(self.host, ["cat", path])
        assert done.returncode == 0, done.stderr
        return done.stdout

    def publish_manifest(self, manifest: dict[str, Any]) -> None:
        """A new manifest as the deploy publishes one: the object, the index listing its digest, the SSM parameter
        naming the index (the node uses no manifest the trusted index does not list)."""
        s3 = self.client("s3")
        body = json.dumps(manifest, indent=1, sort_keys=True).encode()
        s3.put_object(Bucket=BUCKET, Key="fmcluster/manifest/cluster.json", Body=body)
        objects = json.loads(s3.get_object(Bucket=BUCKET, Key=INDEX_KEY)["Body"].read())["objects"]
        index = index_document({**objects, "fmcluster/manifest/cluster.json": hashlib.sha256(body).hexdigest()})
        s3.put_object(Bucket=BUCKET, Key=INDEX_KEY, Body=index)
        trust_index(self.client("ssm"), ORG, hashlib.sha256(index).hexdigest(), out=lambda _: None)

    def report_key(self, suffix: str = ".json", instance: str = SESSION_INSTANCE, bucket: str = BUCKET) -> str:
        """Where the node filed its report: fmcluster/report/<its caller identity>/<the instance it found itself to be,
        its session's name before then><suffix>, found as the deploy finds it (by instance id)."""
        listed = self.client("s3").list_objects_v2(Bucket=bucket, Prefix="fmcluster/report/").get("Contents", [])
        # The newest, as the deploy reads it: the emulator gives a role it never made a new id at each AssumeRole.
        mine = sorted((o for o in listed if o["Key"].endswith(f"/{instance}{suffix}")), key=lambda o: o["LastModified"])
        assert mine, f"no report for {instance} in {bucket}: {[o['Key'] for o in listed]}"
        return str(mine[-1]["Key"])

    def report(self, bucket: str = BUCKET, instance: str = SESSION_INSTANCE) -> dict[str, Any]:
        body = self.client("s3").get_object(Bucket=bucket, Key=self.report_key(instance=instance, bucket=bucket))["Body"].read()
        loaded: dict[str, Any] = json.loads(body)
        return loaded

    def agent(self, **extra: str) -> subprocess.CompletedProcess[str]:
        """The node agent as node-bootstrap.sh starts it, from this work tree's code (bound into the host)."""
        settings = dict(line.split("=", 1) for line in self.read("/etc/fmcluster/node.env").splitlines()
                        if not line.startswith("#"))
        env = {**settings, "PYTHONPATH": str(ROOT / "src"), "FMCLUSTER_FETCH_TRIES": "1", **extra}
        return self.run("exec /opt/fmcluster/venv/bin/python -m fmcluster.node converge --trigger test", env, timeout=600)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.skip("local hosts need root (namespaces, veth, mounts)")
    tmp = tmp_path_factory.mktemp("node-boot")
    root = make_root(tmp / "root", ORG, VPC, login=0, queues={"cpu": 1})
    previous = os.environ.get("FMCLUSTER_SUBSTRATE_ROOT")
    os.environ["FMCLUSTER_SUBSTRATE_ROOT"] = str(tmp / "substrate")
    try:
        router = router_address(PRIVATE)
        ensure_network(ORG, VPC, [router])
        endpoint = ensure_emulator(ORG, root, host=router.split("/")[0]).endpoint
        venv = str(ROOT / ".venv")
        spec = HostSpec("i-boot", HOSTNAME, ADDRESS, 25, VPC,
                        (Bind(venv, venv, True), Bind(venv, "/opt/fmcluster/venv", True),
                         Bind(str(ROOT / "src"), str(ROOT / "src"), True)), (str(ROOT),))  # boots its systemd
        (host,), _, _ = reconcile_hosts(ORG, [spec], bridge_name(ORG))
        tenant = load_tenant(ORG, root)
        ref = pinned_commit()
        manifest = manifest_for(tenant, {"DataBucketName": BUCKET})
        manifest["ref"] = ref
        # A receiver URL is a bearer secret (whoever has it posts to the channel): it reaches the node's inventory.
        manifest["vars"]["alertmanager_receivers"] = [{"name": "ops", "type": "slack", "target": RECEIVER_URL}]
        s3 = aws.client("s3", tenant.region, endpoint)
        for bucket in (BUCKET, f"{BUCKET}-empty", f"{BUCKET}-contract"):
            s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": tenant.region})
        done = publish(s3, BUCKET, bootstrap_files(ref, PLAYBOOK), manifest, out=lambda _: None)
        # As the deploy does last: the nodes trust the index whose digest is in the SSM parameter (issue 42).
        trust_index(aws.client("ssm", tenant.region, endpoint), ORG, done.index_sha256, out=lambda _: None)
        sts = aws.client("sts", tenant.region, endpoint)
        assumed = sts.assume_role(RoleArn=f"arn:aws:iam::123456789012:role/{ORG}-node", RoleSessionName=SESSION_INSTANCE)
        credentials = assumed["Credentials"]
        yield Node(host, endpoint, tenant, ref, manifest, {
            "AWS_ACCESS_KEY_ID": credentials["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": credentials["SecretAccessKey"],
            "AWS_SESSION_TOKEN": credentials["SessionToken"]})
    finally:
        remove_all(ORG)
        stop_emulator(ORG, root)
        if previous is None:
            os.environ.pop("FMCLUSTER_SUBSTRATE_ROOT", None)
        else:
            os.environ["FMCLUSTER_SUBSTRATE_ROOT"] = previous


pytestmark = pytest.mark.slow


def test_launch_template_user_data_and_the_hyperpod_lifecycle_hand_the_bootstrap_the_same_settings(node: Node) -> None:
    """Both first-boot paths, run for real: each fetches the bootstrap from the bucket and runs it; the bootstrap
    here is a stand-in that records the settings it was given."""
    bucket = f"{BUCKET}-contract"
    s3 = node.client("s3")
    recorder = "#!/bin/sh\nenv | grep '^FMCLUSTER_' | sort > /tmp/bootstrap-settings\n"
    # Published as the deploy publishes, so the first boot runs it (it checks the index the SSM parameter names);
    # the node bucket's index is named again at the end.
    contract = publish(s3, bucket, {"node-bootstrap.sh": recorder.encode()}, {}, out=lambda _: None)
    ssm = node.client("ssm")
    trusted = ssm.get_parameter(Name=f"/fmcluster/{ORG}/bootstrap-index-sha256")["Parameter"]["Value"]
    trust_index(ssm, ORG, contract.index_sha256, out=lambda _: None)
    try:
        from_launch_template, from_hyperpod = _both_first_boots(node, bucket)
    finally:
        trust_index(ssm, ORG, trusted, out=lambda _: None)
    assert {k: from_launch_template[k] for k in SETTINGS} == {k: from_hyperpod[k] for k in SETTINGS} == {
        "FMCLUSTER_BUCKET": bucket, "FMCLUSTER_REGION": node.tenant.region, "FMCLUSTER_ORG": ORG}
    assert (from_launch_template["FMCLUSTER_STACK"], from_launch_template["FMCLUSTER_SIGNAL_RESOURCE"]) == (
        "fmc-t-boot-cluster", "")  # the controller is not waited on


def _both_first_boots(node: Node, bucket: str) -> tuple[dict[str, str], dict[str, str]]:
    """The settings the bootstrap got from the launch template's user data, and from HyperPod's lifecycle."""
    lt = launch_templates(node.tenant)["Resources"]["ControllerLaunchTemplate"]
    node.put("/var/lib/cloud/instance/user-data.txt", user_data_script(
        lt, {"DataBucketName": bucket, "AWS::Region": node.tenant.region, "AWS::StackName": "fmc-t-boot-cluster"}), "0700")
    ran = node.run("bash /var/lib/cloud/instance/user-data.txt")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    from_launch_template = dict(line.split("=", 1) for line in node.read("/tmp/bootstrap-settings").splitlines())

    for name, body in HyperPod(node.tenant).lifecycle_files(bucket).items():
        node.put(f"/tmp/lifecycle/{name}", body.decode(), "0755")
    ran = node.run("rm /tmp/bootstrap-settings && bash /tmp/lifecycle/on_create.sh")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    from_hyperpod = dict(line.split("=", 1) for line in node.read("/tmp/bootstrap-settings").splitlines())
    return from_launch_template, from_hyperpod


def test_first_boot_fetch_unpacks_the_pinned_commit_and_writes_the_node_s_settings(node: Node) -> None:
    before = Path("/etc/fmcluster/node.env").read_bytes() if Path("/etc/fmcluster/node.env").exists() else None
    # The first boot's own S3 client (the user data writes it; the image has no AWS CLI), and a toolchain folder
    # of the node's own: /opt/fmcluster/venv is this work tree's, bound read-only, in this throw-away host.
    node.put("/usr/local/sbin/fmcluster-s3", (NODE_BOOT_DIR / "fmcluster-s3").read_text(), "0755")
    fetched = node.run(f"fmcluster-s3 get s3://{BUCKET}/fmcluster/bootstrap/node-bootstrap.sh /tmp/nb && "
                       "bash /tmp/nb --fetch", {**dict(zip(SETTINGS, (BUCKET, node.tenant.region, ORG))),
                                                 "FMCLUSTER_VENV": BUILT_VENV}, timeout=600)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    # The toolchain was built from the bundle's wheelhouse with no index, at the node pins.
    pins = node.run(f"{BUILT_VENV}/bin/python -c 'import ansible, boto3; print(ansible.__version__, boto3.__version__)'")
    assert pins.stdout.split() == [versions.load()["node_toolchain"]["ansible-core"],
                                   versions.load()["node_toolchain"]["boto3"]], pins.stderr
    assert node.run(f"readlink {BUILT_VENV}").stdout.strip().startswith(f"{BUILT_VENV}-")

    settings = node.read("/etc/fmcluster/node.env")
    assert settings.startswith("# written by fmcluster-bootstrap")
    assert {line.split("=", 1)[0]: line.split("=", 1)[1] for line in settings.splitlines()[1:]} == {
        "FMCLUSTER_BUCKET": BUCKET, "FMCLUSTER_REGION": node.tenant.region, "FMCLUSTER_ORG": ORG,
        "AWS_ENDPOINT_URL": node.endpoint, **node.session, "FMCLUSTER_REF": node.ref, "FMCLUSTER_PLAYBOOK": PLAYBOOK}
    assert node.run("stat -c %a /etc/fmcluster/node.env").stdout.strip() == "600"
    assert node.run("git -C /var/lib/fmcluster/repo.git rev-parse refs/heads/fmcluster").stdout.strip() == node.ref
    assert node.run("git -C /var/lib/fmcluster/agent rev-parse HEAD").stdout.strip() == node.ref
    assert node.read("/usr/local/sbin/fmcluster-bootstrap") == (NODE_BOOT_DIR / "node-bootstrap.sh").read_text()
    after = Path("/etc/fmcluster/node.env").read_bytes() if Path("/etc/fmcluster/node.env").exists() else None
    assert after == before, "this machine's /etc is not the node's"


def test_a_node_that_cannot_fetch_the_bundle_files_a_report_naming_what_it_could_not_reach(node: Node) -> None:
    """...and, where CloudFormation waits for it (its group's CreationPolicy), signals FAILURE right after: the stack
    rolls back now instead of when the signal Timeout runs out (issue 35)."""
    empty = f"{BUCKET}-empty"
    cf = node.client("cloudformation")
    image = node.client("ec2").describe_images()["Images"][0]["ImageId"]
    waiting = "fmc-t-boot-signal"
    cf.create_change_set(StackName=waiting, ChangeSetName="cs", ChangeSetType="CREATE", TemplateBody=json.dumps(
        {"Resources": {"Node": {"Type": "AWS::EC2::Instance", "Properties": {"ImageId": image},
                                "CreationPolicy": {"ResourceSignal": {"Count": 1, "Timeout": "PT30M"}}}}}))
    cf.execute_change_set(StackName=waiting, ChangeSetName="cs")
    failed = node.run("bash /tmp/nb", {"FMCLUSTER_BUCKET": empty, "FMCLUSTER_REGION": node.tenant.region,
                                       "FMCLUSTER_ORG": ORG, "FMCLUSTER_FETCH_TRIES": "1",
                                       "FMCLUSTER_STACK": waiting, "FMCLUSTER_SIGNAL_RESOURCE": "Node"})
    assert failed.returncode == 1, failed.stderr
    assert "cannot file the report" not in failed.stderr, failed.stderr
    report = node.report(empty)
    assert (report["address"], report["ok"], report["stage"]) == (ADDRESS, False, "bundle")
    assert f"cannot fetch s3://{empty}/fmcluster/bootstrap/" in report["error"]
    assert f"signalled FAILURE to {waiting}/Node" in failed.stderr
    assert cf.describe_stacks(StackName=waiting)["Stacks"][0]["StackStatus"] == "ROLLBACK_COMPLETE"
    reasons = [e.get("ResourceStatusReason") for e in cf.describe_stack_events(StackName=waiting)["StackEvents"]
               if e["ResourceStatus"] == "CREATE_FAILED"]
    assert reasons == [f"Received FAILURE signal with UniqueId {SESSION_INSTANCE}"]


def test_the_agent_waits_for_the_manifest_of_its_commit_then_fails_naming_its_s3_key(node: Node) -> None:
    other = "f" * 40
    failed = node.agent(FMCLUSTER_REF=other)
    assert failed.returncode == 1
    report = node.report()
    assert (report["ok"], report["stage"], report["ref"]) == (False, "manifest", other)
    assert f"cannot read s3://{BUCKET}/fmcluster/manifest/cluster.json for commit ffffffffffff after 1 tries" in report["error"]

    # Published while the agent waits (its second try 2 s later, its third 4 s after that: slack for a loaded
    # machine, where the publish itself took over 1.5 s in CI): it takes it and goes on.
    newer = {**node.manifest, "ref": other}
    later = threading.Timer(0.5, lambda: node.publish_manifest(newer))
    later.start()
    try:
        node.agent(FMCLUSTER_REF=other, FMCLUSTER_FETCH_TRIES="3")
    finally:
        later.join()
        node.publish_manifest(node.manifest)
    report = node.report()
    assert report["stage"] != "manifest" and report["manifest_digest"] == digest(newer)


def test_a_node_that_is_not_among_the_cluster_s_instances_fails_at_identity_naming_its_address(node: Node) -> None:
    assert node.agent().returncode == 1
    report = node.report()
    assert (report["ok"], report["stage"], report["node"]) == (False, "identity", "")
    assert f"find this node ({ADDRESS}) among the cluster's instances (tag fmcluster:org={ORG})" in report["error"]


@pytest.fixture(scope="module")
def instance(node: Node) -> str:
    """The node's instance, as the cluster stack makes the controller: in the private subnet, tagged."""
    ec2 = node.client("ec2")
    vpc = ec2.create_vpc(CidrBlock=VPC)["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=PRIVATE)["Subnet"]["SubnetId"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tags = [{"Key": "fmcluster:org", "Value": ORG}, {"Key": "fmcluster:role", "Value": "controller"}]
    made = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="m5.xlarge", SubnetId=subnet,
                             PrivateIpAddress=ADDRESS, TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    instance_id: str = made["Instances"][0]["InstanceId"]
    return instance_id


def test_a_secret_the_node_cannot_read_fails_the_converge_naming_the_secret(node: Node, instance: str) -> None:
    assert node.agent().returncode == 1
    report = node.report(instance=instance)
    assert (report["ok"], report["stage"], report["node"], report["instance_id"]) == (False, "secrets", HOSTNAME, instance)
    assert f"cannot read secret fmcluster/{ORG}/grafana-admin-password from Secrets Manager after 1 tries" in report["error"]


def test_a_node_converges_itself_reports_to_the_bucket_and_never_shows_a_secret(node: Node, instance: str) -> None:
    ensure_secrets(node.tenant, node.client("secretsmanager"), out=lambda _: None)
    sm = node.client("secretsmanager")
    values = [sm.get_secret_value(SecretId=f"fmcluster/{ORG}/{name}")["SecretString"]
              for name in ("munge-key", "grafana-admin-password")]

    converged = node.agent()
    assert converged.returncode == 0, converged.stdout[-3000:] + converged.stderr[-3000:]
    report = node.report(instance=instance)
    assert (report["ok"], report["stage"], report["node"], report["role"]) == (True, "done", HOSTNAME, "controller")
    assert (report["ref"], report["manifest_digest"]) == (node.ref, digest(node.manifest))
    assert report["changed"] and report["changed"] > 0 and report["failed_tasks"] == []

    for name, value in zip(("munge-key", "grafana-admin-password"), values):
        assert node.read(f"/etc/fmcluster/secrets/{name}") == value
        assert node.run(f"stat -c %a /etc/fmcluster/secrets/{name}").stdout.strip() == "600"
    assert node.run("stat -c %a /etc/fmcluster/secrets").stdout.strip() == "700"
    log = node.client("s3").get_object(Bucket=BUCKET, Key=node.report_key(".log", instance))["Body"].read().decode()
    inventory = node.read("/var/lib/fmcluster/inventory/hosts.yml")
    for value in values:
        for where, text in (("report", json.dumps(report)), ("log", log), ("inventory", inventory),
                            ("agent output", converged.stdout + converged.stderr)):
            assert value not in text, f"a secret value is in the {where}"
    # The node agent it started keeps the node converged from now on.
    pid = node.run("systemctl show -p MainPID --value fmcluster-node-agent").stdout.strip()  # its systemd unit
    assert pid not in ("", "0"), "the node agent's unit is not running"
    cmdline = node.run(f"cat /proc/{pid}/cmdline").stdout  # the host's own process table
    assert cmdline.split("\0")[1:4] == ["-m", "fmcluster.node", "watch"], cmdline


def test_no_file_fmcluster_writes_on_the_node_shows_a_secret_to_an_unprivileged_user(node: Node, instance: str) -> None:
    """Every file an ordinary user (nobody) can read under what fmcluster writes (its settings, state, secrets,
    fact cache, runner artifacts, logs) is searched for each secret: the shared secrets, the alert receiver URL and
    the node's AWS credentials. The published commit's own files (the checkout, the agent's clone) are public."""
    sm = node.client("secretsmanager")
    values = [sm.get_secret_value(SecretId=f"fmcluster/{ORG}/{name}")["SecretString"]
              for name in ("munge-key", "grafana-admin-password")]
    assert node.agent().returncode == 0
    assert RECEIVER_URL in node.read("/var/lib/fmcluster/inventory/hosts.yml")
    secrets = [*values, RECEIVER_URL, node.session["AWS_SECRET_ACCESS_KEY"], node.session["AWS_SESSION_TOKEN"]]
    found = host_run(node.host, ["runuser", "-u", "nobody", "--", "grep", "-rlF", "--exclude-dir=pull",
                                 "--exclude-dir=agent", "--exclude-dir=repo.git", "-f", "-", "/etc/fmcluster",
                                 "/var/lib/fmcluster", "/var/log/fmcluster", "/run/fmcluster", "/opt/fmcluster/bootstrap"],
                     input_text="\n".join(secrets) + "\n")
    assert found.stdout == "", f"files an unprivileged user reads that hold a secret:\n{found.stdout}"
    # What the agent keeps that holds one is root's alone.
    modes = node.run("stat -c '%a %U %n' /var/lib/fmcluster/inventory /var/lib/fmcluster/inventory/hosts.yml "
                     "/var/lib/fmcluster/facts /var/lib/fmcluster/runner /var/log/fmcluster/converge.log "
                     "/var/lib/fmcluster/report.json").stdout.splitlines()
    assert [line.split()[:2] for line in modes] == [["700", "root"], ["600", "root"], ["700", "root"],
                                                     ["700", "root"], ["600", "root"], ["600", "root"]], modes
