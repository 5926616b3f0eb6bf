"""The data bucket's policy (issue 42): what nodes and services run as root — the bootstrap, the manifest and its
index, HyperPod's lifecycle scripts, the templates CloudFormation reads — is written and deleted by the deploy's
principal alone; nodes keep filing their reports under their own prefix, users their data elsewhere. Evaluated on
the rendered storage template of every bundled tenant (tests/iam_policy.py: resolved intrinsics, IAM's wildcards)."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import ROOT
from fmcluster.model import load_tenant
from fmcluster.stacks.render import load_cfn_yaml
from scheduler_stacks import render_stacks
from fmcluster.stacks.templates.common import CONTROL_PREFIXES
from iam_policy import Request, denies, resolve

BUCKET = "fmc-test-storage-databucket-1a2b3c4d5e6f"
DEPLOYER = "AROADEPLOYERROLE0001"  # the deploy's role id (its caller identity's UserId up to ':')
NODE = "AROANODEROLEID000001:i-0aaaaaaaaaaaaaaaa"
ORGS = ("demo", "stockmark", "neuronlab", "pclab")


def bucket_statements(org: str) -> list[dict[str, Any]]:
    storage = next(s for s in render_stacks(load_tenant(org, ROOT)) if s.key == "storage")
    template = load_cfn_yaml(storage.body)
    assert "DeployPrincipalId" in template["Parameters"]
    document = template["Resources"]["DataBucketPolicy"]["Properties"]["PolicyDocument"]
    names = {"DataBucket": BUCKET, "DataBucket.Arn": f"arn:aws:s3:::{BUCKET}", "DeployPrincipalId": DEPLOYER}
    statements: list[dict[str, Any]] = resolve(document, names)["Statement"]
    return statements


def denied(org: str, action: str, key: str, userid: str) -> bool:
    request = Request(action, f"arn:aws:s3:::{BUCKET}/{key}", {"aws:userid": userid, "aws:SecureTransport": "true"})
    return any(denies(s, request) for s in bucket_statements(org))


@pytest.mark.parametrize("org", ORGS)
@pytest.mark.parametrize("prefix", CONTROL_PREFIXES)
def test_only_the_deploy_writes_or_deletes_what_nodes_run(org: str, prefix: str) -> None:
    key = f"{prefix}node-bootstrap.sh"
    for action in ("s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion"):
        assert denied(org, action, key, NODE), (action, key)
        assert denied(org, action, key, "AIDAANOTHERUSER00001"), (action, key)  # another IAM user of the account
        assert denied(org, action, key, "AROAOTHERDEPLOYER001:AROADEPLOYERROLE0001"), "a session named like it"
        assert not denied(org, action, key, f"{DEPLOYER}:operator@example.org"), (action, key)  # any session of it
        assert not denied(org, action, key, DEPLOYER), (action, key)  # an IAM user's id has no session part
    assert not denied(org, "s3:GetObject", key, NODE), "nodes read it"


@pytest.mark.parametrize("org", ORGS)
def test_nodes_file_reports_and_users_write_data_elsewhere(org: str) -> None:
    assert not denied(org, "s3:PutObject", f"fmcluster/report/{NODE}/i-0aaaaaaaaaaaaaaaa.json", NODE)
    assert not denied(org, "s3:PutObject", "checkpoints/run-1/step-100.pt", "AIDAANOTHERUSER00001")
    assert not denied(org, "s3:DeleteObject", "datasets/a.tar", NODE)


def test_plain_http_stays_denied_to_everyone() -> None:
    request = Request("s3:GetObject", f"arn:aws:s3:::{BUCKET}/x", {"aws:userid": DEPLOYER, "aws:SecureTransport": "false"})
    assert any(denies(s, request) for s in bucket_statements("demo"))
