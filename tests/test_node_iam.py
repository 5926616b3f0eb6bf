"""Every AWS call a node makes is allowed by its rendered instance-role policy, on every scheduler; nothing more.

The calls are found two ways and must agree:
- statically: every boto3 operation named in the node agent and the modules it imports (AST), every `aws` CLI
  call in the first-boot scripts, the scheduler's lifecycle scripts and the roles;
- by running the node agent's AWS paths (manifest, secrets, discovery, report, signal, watch) against a recording
  client, which gives the exact bucket keys, secret names and cluster names each call uses.
Each call is then evaluated against the rendered policy of the node's role (tests/iam_policy.py: Allow
statements with IAM's wildcard and policy-variable semantics), for slurm-ec2, HyperPod and ParallelCluster.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import io
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from conftest import ROOT
from fmcluster.paths import NODE_BOOT_DIR
from fmcluster.accounting import secret_roles
from fmcluster.model import Tenant, load_tenant
from fmcluster.manifest import INDEX_KEY
from fmcluster.node.agent import MANIFEST_KEY, Agent, Report, Settings
from fmcluster.publish import index_document
from fmcluster.schedulers.registry import scheduler_for
from fmcluster.stacks.render import load_cfn_yaml
from scheduler_stacks import render_stacks
from fmcluster.stacks.templates.common import report_key
from fmcluster.schedulers.parallelcluster.storage_parts import PARALLELCLUSTER_POLICIES
from iam_policy import Request, Unmodelled, allows, resolve

ACCOUNT = "123456789012"
BUCKET = "fmc-test-storage-databucket-1a2b3c4d5e6f"
ROLE_ID = "AROAEXAMPLEROLEID0001"
ME, OTHER = "i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb"
ADDRESS = "10.1.0.5"
REF = "0123456789abcdef0123456789abcdef01234567"
#: One tenant per scheduler, as the repository's inventories have them.
ORGS = {"slurm-ec2": "stockmark", "hyperpod": "neuronlab", "parallelcluster": "pclab", "pcs": "pcslab"}
ROLES = ("controller", "login", "compute")
#: The role session SageMaker HyperPod runs every node of an instance group under: `aws sts get-caller-identity` on
#: a HyperPod node answers "<role id>:SageMaker" (arn …:assumed-role/<execution role>/SageMaker; Classmethod,
#: https://dev.classmethod.jp/articles/sagemaker-hyperpod-execution-role-s3-bucket-permissions). EC2 names an
#: instance profile's session after the instance.
HYPERPOD_SESSION = "SageMaker"


def session(tenant: Tenant, instance: str = ME) -> str:
    """The role session name a node's credentials carry: HyperPod's one name for every node, EC2's instance id."""
    return HYPERPOD_SESSION if tenant.scheduler == "hyperpod" else instance


# --- the rendered policies of each node role ----------------------------------------------------------

def _names(tenant: Tenant) -> dict[str, str]:
    return {"AWS::Partition": "aws", "AWS::Region": tenant.region, "AWS::AccountId": ACCOUNT,
            "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": f"{tenant.stack_prefix}-cluster",
            "DataBucketName": BUCKET, "DataBucket": BUCKET, "DataBucket.Arn": f"arn:aws:s3:::{BUCKET}",
            "PrivateSubnetId": "subnet-0123", "EfaSecurityGroupId": "sg-0efa", "NodeSecurityGroupId": "sg-0node",
            # PCS's cluster (its node roles may register with it only)
            "Cluster.Arn": f"arn:aws:pcs:{tenant.region}:{ACCOUNT}:cluster/pcs_0123456789"}


@functools.lru_cache(maxsize=None)
def rendered(org: str) -> dict[str, dict[str, Any]]:
    """Stack key → the rendered stack's Resources."""
    return render(load_tenant(org, ROOT))


def render(tenant: Tenant) -> dict[str, dict[str, Any]]:
    return {s.key: load_cfn_yaml(s.body)["Resources"] for s in render_stacks(tenant)}


def role_policies(tenant: Tenant, stacks: dict[str, dict[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """fmcluster role → the resolved policy documents fmcluster gives that role's nodes (managed AWS policies
    aside: nothing of ours may depend on them); `stacks`: the tenant's rendered stacks (default: the bundled
    tenant's of that org)."""
    stacks = stacks if stacks is not None else rendered(tenant.org)
    if "cluster" in stacks and tenant.scheduler != "parallelcluster":
        roles = {name: res for name, res in stacks["cluster"].items() if res["Type"] == "AWS::IAM::Role"}
        controller = next(n for n in roles if n.startswith("Controller"))
        node = next(n for n in roles if not n.startswith("Controller"))
        documents = {name: [resolve(p["PolicyDocument"], _names(tenant)) for p in res["Properties"]["Policies"]]
                     for name, res in roles.items()}
        return {"controller": documents[controller], "login": documents[node], "compute": documents[node]}
    out = {}
    for name, roles_ in PARALLELCLUSTER_POLICIES.items():
        document = resolve(stacks["storage"][name]["Properties"]["PolicyDocument"], _names(tenant))
        out.update({role: [document] for role in roles_})
    return out


def signals(tenant: Tenant) -> bool:
    """Whether CloudFormation waits for the cluster's login and compute nodes to signal (a CreationPolicy)."""
    stacks = rendered(tenant.org)
    return any("CreationPolicy" in res for res in stacks.get("cluster", {}).values())


# --- the node agent's calls, recorded --------------------------------------------------------------------

@dataclass
class Call:
    service: str
    operation: str  # botocore's snake_case name
    params: dict[str, Any]


class Recorder:
    """A boto3 session stand-in: records each call and answers what the agent needs to go on."""

    def __init__(self, tenant: Tenant, instance: str = ME) -> None:
        self.tenant, self.instance = tenant, instance
        self.calls: list[Call] = []
        outputs = {"ClusterName": f"{tenant.stack_prefix}-cluster"}
        self.manifest = {"ref": REF, "discovery": scheduler_for(tenant).discovery(outputs),
                         "secrets": {name: {"id": f"fmcluster/{tenant.org}/{name}", "roles": list(roles)}
                                     for name, roles in secret_roles(tenant).items()}}

    def client(self, service: str, config: Any = None) -> Any:
        return _Client(self, service)

    def answer(self, call: Call) -> Any:
        manifest = json.dumps(self.manifest).encode()
        # The deploy's index and the SSM parameter naming it, as the deploy publishes them (fmcluster.publish).
        index = index_document({MANIFEST_KEY: hashlib.sha256(manifest).hexdigest()})
        if call.operation == "get_object":
            key = call.params["Key"]
            body = manifest if key == MANIFEST_KEY else index if key == INDEX_KEY else f"FMCLUSTER_REF={REF}\n".encode()
            return {"Body": io.BytesIO(body)}
        if call.operation == "get_parameter":
            return {"Parameter": {"Name": call.params["Name"], "Value": hashlib.sha256(index).hexdigest()}}
        if call.operation == "get_secret_value":
            return {"SecretString": "secret-value"}
        if call.operation == "describe_instances":
            return {"Reservations": []}
        if call.operation == "list_cluster_nodes":
            return {"ClusterNodeSummaries": [{"InstanceGroupName": "controller", "InstanceId": ME,
                                              "InstanceStatus": {"Status": "Running"}, "InstanceType": "ml.m5.xlarge"}]}
        if call.operation == "get_caller_identity":
            return {"UserId": f"{ROLE_ID}:{session(self.tenant, self.instance)}", "Account": ACCOUNT,
                    "Arn": f"arn:aws:sts::{ACCOUNT}:assumed-role/node/{session(self.tenant, self.instance)}"}
        if call.operation == "describe_cluster_node":
            return {"NodeDetails": {"PrivatePrimaryIp": ADDRESS}}
        return {}


class _Client:
    def __init__(self, recorder: Recorder, service: str) -> None:
        self.recorder, self.service = recorder, service

    def get_paginator(self, operation: str) -> Any:
        client = self

        class Paginator:
            def paginate(self, **params: Any) -> Iterator[Any]:
                yield client._call(operation, params)
        return Paginator()

    def _call(self, operation: str, params: dict[str, Any]) -> Any:
        call = Call(self.service, operation, params)
        self.recorder.calls.append(call)
        return self.recorder.answer(call)

    def __getattr__(self, operation: str) -> Any:
        return lambda **params: self._call(operation, params)


def agent_calls(tenant: Tenant, role: str, tmp_path: Path, instance: str = ME) -> list[Call]:
    """What the node agent asks AWS on a node of `role` (instance `instance`): first boot (manifest, secrets,
    discovery, report and, where CloudFormation waits for the node, the signal) and its watch (what the deploy
    published)."""
    recorder = Recorder(tenant, instance)
    signal = signals(tenant) and role != "controller"
    settings = Settings(BUCKET, tenant.region, tenant.org, REF, "playbooks/site.yml",
                        f"{tenant.stack_prefix}-cluster" if signal else "", "QueueGroup" if signal else "", 1)
    (tmp_path / "state").mkdir(exist_ok=True)
    agent = Agent(settings, state_dir=tmp_path / "state", etc_dir=tmp_path / "etc")
    agent.session = recorder
    agent.s3 = recorder.client("s3")
    manifest = agent.manifest()
    agent.secrets(manifest, role)
    agent.discover(manifest)
    report = Report(address=ADDRESS, trigger="first-boot", started="now", ok=True, stage="done", instance_id=instance)
    agent.file_report(report)
    agent.signal(report)
    agent.wanted(role)
    return recorder.calls


# --- calls → IAM requests ----------------------------------------------------------------------------------

#: Actions IAM never denies ("No permissions are required to perform this operation", STS's reference): no
#: policy grants them, so the policy check leaves them out.
NEEDS_NO_PERMISSION = frozenset({"sts:GetCallerIdentity"})

#: botocore operations whose IAM action is not named after them.
ACTION_OF = {("s3", "ListObjectsV2"): "s3:ListBucket", ("s3", "HeadObject"): "s3:GetObject"}


@functools.lru_cache(maxsize=None)
def _model(service: str) -> Any:
    return _BOTOCORE.get_service_model(service)


_BOTOCORE = botocore.session.get_session()


@functools.lru_cache(maxsize=None)
def operation_name(service: str, snake: str) -> str:
    from botocore import xform_name
    return str(next(op for op in _model(service).operation_names if xform_name(op) == snake))


def context(tenant: Tenant, instance: str = ME) -> dict[str, str]:
    """The request context of a call with this instance's role credentials (its session: `session`)."""
    return {"aws:userid": f"{ROLE_ID}:{session(tenant, instance)}", "aws:PrincipalAccount": ACCOUNT,
            "ec2:SourceInstanceARN": f"arn:aws:ec2:{tenant.region}:{ACCOUNT}:instance/{instance}"}


def request(tenant: Tenant, call: Call) -> Request:
    op = operation_name(call.service, call.operation)
    action = ACTION_OF.get((call.service, op), f"{_model(call.service).signing_name}:{op}")
    region, p = tenant.region, call.params
    ctx = context(tenant)
    if call.service == "s3" and "Key" in p:
        return Request(action, f"arn:aws:s3:::{p['Bucket']}/{p['Key']}", ctx)
    if call.service == "s3":
        return Request(action, f"arn:aws:s3:::{p['Bucket']}", {**ctx, "s3:prefix": p.get("Prefix", "")})
    if call.service == "secretsmanager":
        return Request(action, f"arn:aws:secretsmanager:{region}:{ACCOUNT}:secret:{p['SecretId']}-AbCdEf", ctx)
    if call.service == "sagemaker":
        # The cluster's ARN ends in the id SageMaker gave it; the org tag is the stack's (Tags of the cluster).
        return Request(action, f"arn:aws:sagemaker:{region}:{ACCOUNT}:cluster/a1b2c3d4e5f6",
                       {**ctx, "aws:ResourceTag/fmcluster:org": tenant.org})
    if call.service == "cloudformation":
        return Request(action, f"arn:aws:cloudformation:{region}:{ACCOUNT}:stack/{p['StackName']}/0a1b2c3d-uuid", ctx)
    if call.service == "ssm":  # a parameter's ARN drops the leading "/" of its name
        return Request(action, f"arn:aws:ssm:{region}:{ACCOUNT}:parameter/{p['Name'].lstrip('/')}", ctx)
    if call.service == "ec2" and op.startswith("Describe"):
        return Request(action, "*", ctx)
    if action in NEEDS_NO_PERMISSION:
        return Request(action, "*", ctx)
    raise Unmodelled(f"no resource model for {call.service}.{op}: add one here and grant it in the node policies")


def is_report(req: Request) -> bool:
    return req.action == "s3:PutObject" and "/fmcluster/report/" in req.resource


# --- static: what the code and scripts call -------------------------------------------------------------

def agent_modules() -> list[Path]:
    """The node agent and every fmcluster module it imports, transitively."""
    todo, seen = ["fmcluster.node.agent", "fmcluster.node.__main__"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = ROOT / "src" / (name.replace(".", "/") + ".py")
        if not path.is_file():
            path = path.with_suffix("") / "__init__.py"
        seen.add(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fmcluster"):
                todo.append(node.module)
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("fmcluster")]
    return sorted({ROOT / "src" / (n.replace(".", "/") + ".py") for n in seen
                   if (ROOT / "src" / (n.replace(".", "/") + ".py")).is_file()})


def static_operations() -> set[tuple[str, str]]:
    """(service, snake_case operation) of every boto3 call written in the agent's modules: the services are the
    string arguments of `client(...)`, the operations every attribute call (or paginator) of those services."""
    from botocore import xform_name
    trees = [ast.parse(p.read_text()) for p in agent_modules()]
    services = {n.args[0].value for t in trees for n in ast.walk(t) if isinstance(n, ast.Call) and n.args
                and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
                and (getattr(n.func, "attr", None) == "client" or getattr(n.func, "id", None) == "client")}
    operations = {s: {xform_name(op) for op in _model(s).operation_names} for s in services}
    found = set()
    for tree in trees:
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
                continue
            name = n.func.attr
            if name == "get_paginator" and n.args and isinstance(n.args[0], ast.Constant):
                name = str(n.args[0].value)
            found |= {(s, name) for s, ops in operations.items() if name in ops}
    return found


def script_variables(tenant: Tenant) -> dict[str, str]:
    """What the node scripts' variables hold on a node of `tenant` (instance ME)."""
    return {"$s3": f"s3://{BUCKET}/fmcluster", "$FMCLUSTER_BUCKET": BUCKET, "${address:-unknown}": ADDRESS,
            "${identity}": f"{ROLE_ID}:{session(tenant)}", "${instance}": ME,
            "$boot": "fmcluster/bootstrap/node-bootstrap.sh"}


def script_files() -> list[Path]:
    files = [NODE_BOOT_DIR / "node-bootstrap.sh", NODE_BOOT_DIR / "node-user-data.sh",
             *sorted((ROOT / "src/fmcluster/schedulers").glob("*/node_files/*.sh"))]
    files += [p for p in sorted((ROOT / "roles").rglob("*")) if p.is_file() and p.suffix in (".sh", ".j2", ".yml", ".py")]
    return files


#: Where a word `aws` is the command run: the start of a shell command, or an Ansible command/shell task's.
AWS_COMMAND = re.compile(r"(?:^|[;&|(!]\s*|\b(?:then|do|exec|if|cmd:|command:|shell:)\s+)aws\s+([a-z0-9-]+)\s+([a-z0-9-]+)(.*)")


#: A call of the first boot's stdlib S3 client (src/fmcluster/node/boot/fmcluster-s3), however the script names its path.
S3_CLIENT_COMMAND = re.compile(r'(?:"\$s3client"|"\$bin_dir/fmcluster-s3"|\bfmcluster-s3)\s+([a-z-]+)\b(.*)')


def _substituted(url: str, tenant: Tenant) -> str:
    for variable, value in script_variables(tenant).items():
        url = url.replace(variable, value)
    return url


def s3_client_requests(tenant: Tenant, verb: str, rest: str, signalled: bool = False) -> list[Request]:
    """The IAM requests of one fmcluster-s3 call: get (GetObject), put (PutObject), sync (ListBucket on the prefix,
    GetObject on its objects), whoami (STS GetCallerIdentity, which IAM never denies) and signal (SignalResource on
    the cluster stack, made only where the user data names a resource to signal: `signalled`)."""
    ctx = context(tenant)
    words = [_substituted(w, tenant) for w in shlex.split(rest.split("||")[0].split("&&")[0].split(" 2>")[0])]
    if verb in ("whoami", "instance-id"):  # STS GetCallerIdentity (never denied) and the instance metadata service
        return []
    if verb == "signal":
        assert words[:2] == ["$FMCLUSTER_STACK", "$FMCLUSTER_SIGNAL_RESOURCE"], words
        stack = f"arn:aws:cloudformation:{tenant.region}:{ACCOUNT}:stack/{tenant.stack_prefix}-cluster/0a1b2c3d-uuid"
        return [Request("cloudformation:SignalResource", stack, ctx)] if signalled else []
    if verb == "verify":  # the SSM parameter naming the deploy's index (GetParameter), then the index (GetObject)
        parameter, url = words[0].replace("$FMCLUSTER_ORG", tenant.org), words[1]
        bucket, _, key = url.removeprefix("s3://").partition("/")
        return [Request("ssm:GetParameter", f"arn:aws:ssm:{tenant.region}:{ACCOUNT}:parameter/{parameter.lstrip('/')}",
                        ctx), Request("s3:GetObject", f"arn:aws:s3:::{bucket}/{key}", ctx)]
    assert verb in ("get", "put", "sync"), f"fmcluster-s3 {verb}: model it in this test"
    url = words[1] if verb == "put" else words[0]
    bucket, _, key = url.removeprefix("s3://").partition("/")
    if verb == "put":
        return [Request("s3:PutObject", f"arn:aws:s3:::{bucket}/{key}", ctx)]
    if verb == "get":
        return [Request("s3:GetObject", f"arn:aws:s3:::{bucket}/{key}", ctx)]
    return [Request("s3:ListBucket", f"arn:aws:s3:::{bucket}", {**ctx, "s3:prefix": key}),
            Request("s3:GetObject", f"arn:aws:s3:::{bucket}/{key}node-bootstrap.sh", ctx)]


def script_requests(tenant: Tenant, role: str = "") -> list[tuple[str, Request]]:
    """(where, request) for every `aws` CLI call in the node scripts and roles (and a refusal of boto3 there), as a
    node of `role` makes them."""
    signalled = bool(role) and signals(tenant) and role != "controller"
    out = []
    for path in script_files():
        text = path.read_text().replace("\\\n", " ")
        where = str(path.relative_to(ROOT))
        assert "boto3" not in text or path.suffix != ".py", f"{where}: boto3 in a role: model its calls here"
        for line in text.splitlines():
            code = line.split(" #", 1)[0].strip()
            if code.startswith("#"):
                continue
            if client := S3_CLIENT_COMMAND.search(code):
                out += [(where, r) for r in s3_client_requests(tenant, *client.groups(), signalled)]
                continue
            match = AWS_COMMAND.search(code)
            if not match:
                continue
            service, command, rest = match.groups()
            assert (service, command) == ("s3", "cp"), f"{where}: `aws {service} {command}`: model it in this test"
            words = shlex.split(rest.split("||")[0].split("&&")[0].split(" 2>")[0])
            args, skip = [], False
            for w in words:
                if skip:
                    skip = False
                elif w.startswith("--"):
                    skip = w in ("--region", "--endpoint-url")
                else:
                    args.append(w)
            source, dest = (a for a in args[:2])
            for variable, value in script_variables(tenant).items():
                source, dest = source.replace(variable, value), dest.replace(variable, value)
            recursive = "--recursive" in words
            ctx = context(tenant)
            for url, action in ((source, "s3:GetObject"), (dest, "s3:PutObject")):
                if not url.startswith("s3://"):
                    continue
                bucket, _, key = url[5:].partition("/")
                if recursive:
                    out.append((where, Request("s3:ListBucket", f"arn:aws:s3:::{bucket}", {**ctx, "s3:prefix": key})))
                    key += "node-bootstrap.sh"  # one object of the prefix
                out.append((where, Request(action, f"arn:aws:s3:::{bucket}/{key}", ctx)))
    return out


# --- the tests --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tenants() -> dict[str, Tenant]:
    return {scheduler: load_tenant(org, ROOT) for scheduler, org in ORGS.items()}


def test_the_repository_has_one_tenant_of_each_scheduler(tenants: dict[str, Tenant]) -> None:
    assert {t.scheduler for t in tenants.values()} == set(ORGS)


def test_every_boto3_call_in_the_node_agent_is_exercised_here(tenants: dict[str, Tenant], tmp_path: Path) -> None:
    """The recorded runs (every scheduler, every role) cover each call the code can make: a new call fails here
    until it is modelled below and granted in the node policies."""
    recorded = {(c.service, c.operation) for tenant in tenants.values() for role in ROLES
                for c in agent_calls(tenant, role, tmp_path)}
    written = static_operations()
    assert written == recorded, f"written, not exercised: {written - recorded}; exercised, not found: {recorded - written}"
    assert ("sagemaker", "list_cluster_nodes") in written and ("s3", "put_object") in written, "the scan sees calls"


@pytest.mark.parametrize("scheduler", sorted(ORGS))
@pytest.mark.parametrize("role", ROLES)
def test_every_aws_call_of_a_node_is_allowed_by_its_role_policy(scheduler: str, role: str,
                                                               tenants: dict[str, Tenant], tmp_path: Path) -> None:
    tenant = tenants[scheduler]
    policies = role_policies(tenant)[role]
    calls = [("node agent", request(tenant, c)) for c in agent_calls(tenant, role, tmp_path)]
    calls += script_requests(tenant, role)
    denied = [(where, r.action, r.resource) for where, r in calls
              if r.action not in NEEDS_NO_PERMISSION and not allows(policies, r)]
    assert not denied, f"{scheduler} {role}: denied by its own policy: {denied}"
    if role == "controller" and scheduler_for(tenant).manifest_vars()["prometheus_node_discovery"]["kind"] == "ec2":
        for action in ("ec2:DescribeInstances", "ec2:DescribeAvailabilityZones"):  # Prometheus's EC2 discovery
            assert allows(policies, Request(action, "*", context(tenant))), (scheduler, action)


@pytest.mark.parametrize("scheduler", sorted(ORGS))
def test_a_node_files_its_report_under_the_key_its_policy_allows(scheduler: str, tenants: dict[str, Tenant],
                                                                tmp_path: Path) -> None:
    tenant = tenants[scheduler]
    for role in ROLES:
        policies = role_policies(tenant)[role]
        reports = [r for r in (request(tenant, c) for c in agent_calls(tenant, role, tmp_path)) if is_report(r)]
        reports += [r for _, r in script_requests(tenant) if is_report(r)]
        assert reports and all(allows(policies, r) for r in reports), [r.resource for r in reports]


@pytest.mark.parametrize("scheduler", sorted(ORGS))
def test_a_node_may_write_its_own_report_and_never_another_sessions(scheduler: str, tenants: dict[str, Tenant]) -> None:
    """Reports are fmcluster/report/<aws:userid>/<instance id>.json (and .log): a node writes only under its own
    role session, and there only report and log objects named by an instance id."""
    tenant = tenants[scheduler]
    bucket = f"arn:aws:s3:::{BUCKET}/"
    for role, policies in role_policies(tenant).items():
        mine, theirs = f"{ROLE_ID}:{session(tenant)}", f"{ROLE_ID}:{OTHER}"
        other_role = f"AROAEXAMPLEOTHERROLE1:{session(tenant)}"
        for suffix in (".json", ".log"):
            assert allows(policies, Request("s3:PutObject", bucket + report_key(mine, ME, suffix), context(tenant))), role
            for key in (report_key(theirs, OTHER, suffix), report_key(theirs, ME, suffix),
                        report_key(other_role, ME, suffix)):
                assert not allows(policies, Request("s3:PutObject", bucket + key, context(tenant))), (role, key)
        for key in ("fmcluster/report/x.json", "fmcluster/report/*.json", f"fmcluster/report/{mine}.json",
                    f"fmcluster/report/{mine}/x.json", f"fmcluster/report/{mine}/{ME}.json.extra",
                    f"fmcluster/report/{mine}/{ME}.sh", f"fmcluster/report/{mine}x/{ME}.json",
                    f"fmcluster/report/{ROLE_ID}/{ME}.json", "fmcluster/manifest/cluster.json",
                    "fmcluster/bootstrap/node-bootstrap.sh", "hyperpod/lifecycle/on_create.sh", "data/checkpoint.pt"):
            assert not allows(policies, Request("s3:PutObject", bucket + key, context(tenant))), (role, key)
        # A caller whose identity has no session (no aws:userid) matches no report statement at all.
        assert not allows(policies, Request("s3:PutObject", bucket + report_key(mine, ME), {}))
        for key in (report_key(theirs, OTHER), report_key(mine, OTHER), "data/checkpoint.pt"):
            assert not allows(policies, Request("s3:GetObject", bucket + key, context(tenant))), (role, key)


def test_hyperpod_nodes_sharing_one_role_session_file_their_reports_apart(tenants: dict[str, Tenant],
                                                                          tmp_path: Path) -> None:
    """Every HyperPod node of a group is "<role id>:SageMaker" to IAM: a report keyed on the caller identity alone
    would be one object that each node overwrites (and the deploy would wait for the others until it gave up).
    Keyed on the instance id below the session, two such nodes file two reports, each allowed by the group's role."""
    tenant = tenants["hyperpod"]
    for role in ROLES:
        policies = role_policies(tenant)[role]
        keys = []
        for instance in (ME, OTHER):
            puts = [request(tenant, c) for c in agent_calls(tenant, role, tmp_path, instance) if c.operation == "put_object"]
            assert puts and all(allows(policies, r) for r in puts), [r.resource for r in puts]
            keys.append({r.resource for r in puts})
            assert all(f"/fmcluster/report/{ROLE_ID}:{HYPERPOD_SESSION}/{instance}." in r.resource for r in puts), keys
        assert not keys[0] & keys[1], f"{role}: two nodes of one session file the same object: {keys}"


@pytest.mark.parametrize("scheduler", sorted(ORGS))
def test_login_and_compute_nodes_read_only_the_munge_key(scheduler: str, tenants: dict[str, Tenant]) -> None:
    tenant = tenants[scheduler]
    region = tenant.region
    arn = f"arn:aws:secretsmanager:{region}:{ACCOUNT}:secret:fmcluster/{tenant.org}/{{}}-AbCdEf"
    for role, policies in role_policies(tenant).items():
        for name, readers in {**secret_roles(tenant), "slurmdbd-storage-password": ("controller",)}.items():
            read = allows(policies, Request("secretsmanager:GetSecretValue", arn.format(name), context(tenant)))
            assert read == (role in readers and name in secret_roles(tenant)), (role, name)
        for other in (f"fmcluster/{tenant.org}/munge-key-extra-AbCdEf", "fmcluster/other/munge-key-AbCdEf",
                      f"fmcluster/{tenant.org}/munge-key"):
            request_ = Request("secretsmanager:GetSecretValue",
                               f"arn:aws:secretsmanager:{region}:{ACCOUNT}:secret:{other}", context(tenant))
            assert not allows(policies, request_), (role, other)


def test_hyperpod_discovery_is_limited_to_clusters_carrying_the_tenants_org_tag(tenants: dict[str, Tenant]) -> None:
    tenant = tenants["hyperpod"]
    for policies in role_policies(tenant).values():
        cluster = f"arn:aws:sagemaker:{tenant.region}:{ACCOUNT}:cluster/a1b2c3d4e5f6"
        for action in ("sagemaker:ListClusterNodes", "sagemaker:DescribeClusterNode"):
            assert allows(policies, Request(action, cluster, {"aws:ResourceTag/fmcluster:org": tenant.org}))
            assert not allows(policies, Request(action, cluster, {"aws:ResourceTag/fmcluster:org": "someone-else"}))
            assert not allows(policies, Request(action, cluster, {}))
        assert not allows(policies, Request("sagemaker:DeleteCluster", cluster,
                                            {"aws:ResourceTag/fmcluster:org": tenant.org}))


@pytest.mark.parametrize(("prefix", "listed"), [
    ("hyperpod/lifecycle/", True),  # the SourceS3Uri as the template gives it
    ("hyperpod/lifecycle", True),  # ... without its trailing slash, which the API's pattern allows
    ("hyperpod/lifecycle/base-config/", True),  # a folder under it
    (None, False),  # the whole bucket
    ("", False),
    ("hyperpod/lifecycle-old", False),
    ("fmcluster/report/", False),
    ("data/", False),
])
def test_hyperpod_may_list_its_lifecycle_folder_however_it_names_it_and_nothing_else(
        tenants: dict[str, Tenant], prefix: str | None, listed: bool) -> None:
    """Issue 36: the execution roles listed only where s3:prefix is like hyperpod/lifecycle/*, and no AWS page says
    with which prefix HyperPod lists SourceS3Uri (AWS's own policies grant s3:ListBucket on the whole bucket). The
    folder's name with or without the slash, and what is under it, are listable; the bucket's other prefixes are not."""
    tenant = tenants["hyperpod"]
    ctx = {**context(tenant), **({} if prefix is None else {"s3:prefix": prefix})}
    for role, policies in role_policies(tenant).items():
        assert allows(policies, Request("s3:ListBucket", f"arn:aws:s3:::{BUCKET}", ctx)) is listed, (role, prefix)
        assert allows(policies, Request("s3:GetObject", f"arn:aws:s3:::{BUCKET}/hyperpod/lifecycle/on_create.sh",
                                        context(tenant))), role


WORKSPACE = "ws-00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize("scheduler", sorted(ORGS))
def test_prometheus_on_the_controller_may_remote_write_to_the_tenants_amp_workspace_only(
        scheduler: str, tenants: dict[str, Tenant]) -> None:
    """Prometheus runs on the controller (ParallelCluster: the head node) and signs its remote write with the
    instance role: aps:RemoteWrite on the tenant's workspace, on the controller only, and only when the tenant
    configures remote write."""
    tenant = tenants[scheduler]
    region = tenant.region
    url = f"https://aps-workspaces.{region}.amazonaws.com/workspaces/{WORKSPACE}/api/v1/remote_write"
    writing = dataclasses.replace(tenant, monitoring=dataclasses.replace(tenant.monitoring, remote_write_url=url))
    quiet = dataclasses.replace(tenant, monitoring=dataclasses.replace(tenant.monitoring, remote_write_url=None))
    workspace = f"arn:aws:aps:{region}:{ACCOUNT}:workspace/{WORKSPACE}"
    for role, policies in role_policies(writing, render(writing)).items():
        assert allows(policies, Request("aps:RemoteWrite", workspace, context(tenant))) == (role == "controller"), role
        for other in (f"arn:aws:aps:{region}:{ACCOUNT}:workspace/ws-11111111-0000-0000-0000-000000000000",
                      f"arn:aws:aps:{region}:210987654321:workspace/{WORKSPACE}"):
            assert not allows(policies, Request("aps:RemoteWrite", other, context(tenant))), (role, other)
        for action in ("aps:QueryMetrics", "aps:DeleteWorkspace"):
            assert not allows(policies, Request(action, workspace, context(tenant))), (role, action)
    for role, policies in role_policies(quiet, render(quiet)).items():
        assert not allows(policies, Request("aps:RemoteWrite", workspace, context(tenant))), role


def test_the_bundled_hyperpod_tenant_with_remote_write_grants_it(tenants: dict[str, Tenant]) -> None:
    tenant = tenants["hyperpod"]
    assert tenant.monitoring.remote_write_url, "neuronlab configures remote write to Amazon Managed Prometheus"
    workspace = f"arn:aws:aps:{tenant.region}:{ACCOUNT}:workspace/{WORKSPACE}"
    assert allows(role_policies(tenant)["controller"], Request("aps:RemoteWrite", workspace, context(tenant)))


@pytest.mark.parametrize("scheduler", sorted(ORGS))
def test_alertmanager_on_the_controller_may_publish_to_the_tenants_sns_receivers_only(
        scheduler: str, tenants: dict[str, Tenant]) -> None:
    """Alertmanager runs on the controller (ParallelCluster: the head node) and signs an SNS receiver's Publish with
    the instance role (its sns_config: SigV4, no keys given): sns:Publish on the receivers' topics, on the controller
    only, and only when the tenant has SNS receivers. Locally no SNS is called, so only the rendered policy shows it."""
    from fmcluster.model import AlertReceiver

    tenant = tenants[scheduler]
    topic = f"arn:aws:sns:{tenant.region}:{ACCOUNT}:fmc-alerts"
    sns = AlertReceiver("oncall-sns", "sns", topic)
    paging = dataclasses.replace(tenant, monitoring=dataclasses.replace(
        tenant.monitoring, alert_receivers=(*tenant.monitoring.alert_receivers, sns)))
    quiet = dataclasses.replace(tenant, monitoring=dataclasses.replace(
        tenant.monitoring, alert_receivers=tuple(r for r in tenant.monitoring.alert_receivers if r.type != "sns")))
    for role, policies in role_policies(paging, render(paging)).items():
        assert allows(policies, Request("sns:Publish", topic, context(tenant))) == (role == "controller"), role
        other = f"arn:aws:sns:{tenant.region}:{ACCOUNT}:someone-elses-topic"
        assert not allows(policies, Request("sns:Publish", other, context(tenant))), role
        assert not allows(policies, Request("sns:DeleteTopic", topic, context(tenant))), role
    for role, policies in role_policies(quiet, render(quiet)).items():
        assert not allows(policies, Request("sns:Publish", topic, context(tenant))), role
    # and the IMDS rule lets Alertmanager's account reach the role's credentials (roles/imds_guard, manifest.imds_vars)
    import yaml

    from fmcluster.manifest import PROMETHEUS_USER

    defaults = yaml.safe_load((ROOT / "roles/alertmanager/defaults/main.yml").read_text())
    assert defaults["alertmanager_user"] == PROMETHEUS_USER


# --- the evaluator itself ---------------------------------------------------------------------------------

def test_the_evaluator_substitutes_policy_variables_literally_and_fails_closed() -> None:
    doc = {"Statement": [{"Effect": "Allow", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::b/r/${aws:userid}.json"}]}
    assert allows([doc], Request("s3:putobject", "arn:aws:s3:::b/r/A:i-1.json", {"aws:userid": "A:i-1"}))
    # A value is matched literally: a '*' in it is no wildcard.
    assert not allows([doc], Request("s3:PutObject", "arn:aws:s3:::b/r/A:i-1.json", {"aws:userid": "A:*"}))
    assert not allows([doc], Request("s3:PutObject", "arn:aws:s3:::b/r/A:i-1.json", {}))
    literal = {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:s3:::b/${*}"}]}
    assert allows([literal], Request("s3:GetObject", "arn:aws:s3:::b/*"))
    assert not allows([literal], Request("s3:GetObject", "arn:aws:s3:::b/x"))
    for statement in ({"Effect": "Deny", "Action": "*", "Resource": "*"},
                      {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"},
                      {"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": {"IpAddress": {"aws:SourceIp": "0/0"}}}):
        with pytest.raises(Unmodelled):
            allows([{"Statement": [statement]}], Request("s3:GetObject", "arn:aws:s3:::b/x", {"aws:SourceIp": "1"}))
    assert resolve({"Fn::Join": ["", [{"Fn::Sub": "a-${X}-${!aws:userid}"}, "${aws:userid}"]]}, {"X": "x"}) == \
        "a-x-${aws:userid}${aws:userid}"


@pytest.mark.parametrize("scheduler", sorted(ORGS))
def test_every_node_may_get_an_ecr_token_and_pull_only_the_tenants_own_repositories(
        scheduler: str, tenants: dict[str, Tenant]) -> None:
    """The node's ECR token refresher (roles/slurm_containers, docs/containers.md) calls GetAuthorizationToken, which
    takes only `*`; the token then grants what the role grants: pulls from the tenant's account's repositories in its
    region, none from another account's or another region's, and no push."""
    tenant = tenants[scheduler]
    assert tenant.containers.enabled and not tenant.containers.registries, "the bundled tenants use the stack's ECR"
    region = tenant.region
    mine = f"arn:aws:ecr:{region}:{ACCOUNT}:repository/team-a/megatron"
    for role, policies in role_policies(tenant).items():
        assert allows(policies, Request("ecr:GetAuthorizationToken", "*", context(tenant))), role
        for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"):
            assert allows(policies, Request(action, mine, context(tenant))), (role, action)
            for other in (f"arn:aws:ecr:{region}:210987654321:repository/team-a/megatron",
                          f"arn:aws:ecr:eu-north-1:{ACCOUNT}:repository/team-a/megatron"):
                assert not allows(policies, Request(action, other, context(tenant))), (role, action, other)
        for action in ("ecr:PutImage", "ecr:InitiateLayerUpload", "ecr:BatchDeleteImage", "ecr:SetRepositoryPolicy"):
            assert not allows(policies, Request(action, mine, context(tenant))), (role, action)


def test_ecr_pulls_follow_the_specs_registries_and_vanish_without_containers(tenants: dict[str, Tenant]) -> None:
    tenant = tenants["slurm-ec2"]
    other_region = dataclasses.replace(tenant, containers=dataclasses.replace(
        tenant.containers, registries=(f"{ACCOUNT}.dkr.ecr.eu-north-1.amazonaws.com",)))
    for role, policies in role_policies(other_region, render(other_region)).items():
        for where in (tenant.region, "eu-north-1"):
            arn = f"arn:aws:ecr:{where}:{ACCOUNT}:repository/nemo"
            assert allows(policies, Request("ecr:BatchGetImage", arn, context(tenant))), (role, where)
        arn = f"arn:aws:ecr:ap-south-1:{ACCOUNT}:repository/nemo"
        assert not allows(policies, Request("ecr:BatchGetImage", arn, context(tenant))), role
    off = dataclasses.replace(tenant, containers=dataclasses.replace(tenant.containers, enabled=False))
    for role, policies in role_policies(off, render(off)).items():
        assert not allows(policies, Request("ecr:GetAuthorizationToken", "*", context(tenant))), role
