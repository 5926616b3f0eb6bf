"""fmcluster-s3, the first boot's S3 client (Python's standard library alone), against a real S3 API (moto's
server) and against botocore's own Signature Version 4 signer.

Every catalogued image has python3 but not all have the AWS CLI (src/fmcluster/data/images.yml): the user data
writes this client out and node-bootstrap.sh fetches the bundle and files failure reports with it.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import hashlib
import importlib.machinery
import importlib.util
import re
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fmcluster.paths import NODE_BOOT_DIR
from fmcluster.stacks import aws
from fmcluster.stacks.render import S3_CLIENT_PLACEHOLDER, first_boot_script, packed_s3_client

CLIENT = NODE_BOOT_DIR / "fmcluster-s3"
REGION = "ap-northeast-1"
BUCKET = "fmc-s3-client"


def load_client() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("fmcluster_s3", str(CLIENT))
    spec = importlib.util.spec_from_loader("fmcluster_s3", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize("method,path,query,body,token", [
    ("GET", "/fmcluster/bootstrap/node-bootstrap.sh", {}, b"", ""),
    ("GET", "/", {"list-type": "2", "prefix": "fmcluster/bootstrap/"}, b"", "session-token"),
    ("PUT", "/fmcluster/report/10.0.0.4.json", {}, b'{"ok": false}', ""),
    ("GET", "/fmcluster/bootstrap/wheelhouse/pip-25.3-py3-none-any.whl", {"continuation-token": "a b+c/="}, b"", ""),
])
def test_the_signature_is_botocore_s(method: str, path: str, query: dict[str, str], body: bytes, token: str) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    client = load_client()
    now = datetime.datetime(2026, 12, 3, 16, 40, 5, tzinfo=datetime.timezone.utc)
    host = f"{BUCKET}.s3.{REGION}.amazonaws.com"
    payload = hashlib.sha256(body).hexdigest()
    ours = client.signed_headers(method, host, client._quote(path, "-_.~/"), query, payload, REGION,
                                 ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token), now)

    url = f"https://{host}{path}" + ("?" + "&".join(f"{client._quote(k)}={client._quote(v)}"
                                                    for k, v in sorted(query.items())) if query else "")
    request = AWSRequest(method=method, url=url, data=body,
                         headers={"x-amz-content-sha256": payload, "X-Amz-Date": ours["x-amz-date"]})
    signer = S3SigV4Auth(Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token or None),
                         "s3", REGION)
    request.context["timestamp"] = ours["x-amz-date"]
    if token:
        request.headers["X-Amz-Security-Token"] = token
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    assert ours["authorization"].endswith(f"Signature={expected}")
    assert re.search(r"SignedHeaders=([a-z0-9;-]+)", ours["authorization"]).group(1) == signer.signed_headers(  # type: ignore[union-attr]
        signer.headers_to_sign(request))


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3 = aws.client("s3", REGION, endpoint)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    try:
        yield endpoint
    finally:
        server.stop()


def run_client(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "emulator",
           "AWS_SECRET_ACCESS_KEY": "emulator", "FMCLUSTER_REGION": REGION}
    # The image's python3, not this repository's venv: the client needs nothing else.
    return subprocess.run(["/usr/bin/python3", str(CLIENT), *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def test_get_put_and_sync_against_a_real_s3_api(s3_endpoint: str, tmp_path: Path) -> None:
    s3: Any = aws.client("s3", REGION, s3_endpoint)
    wheel = bytes(range(256)) * 4096  # binary, 1 MiB
    for key, body in {"fmcluster/bootstrap/converge.env": b"FMCLUSTER_REF=abc\n",
                      "fmcluster/bootstrap/wheelhouse/x-1.0-py3-none-any.whl": wheel,
                      "fmcluster/bootstrap/sub dir/a+b.txt": b"odd key"}.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)

    got = run_client(s3_endpoint, "get", f"s3://{BUCKET}/fmcluster/bootstrap/converge.env", str(tmp_path / "c.env"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "c.env").read_bytes() == b"FMCLUSTER_REF=abc\n"

    mirror = tmp_path / "bundle"
    (mirror / "wheelhouse").mkdir(parents=True)
    (mirror / "stale.txt").write_text("from an older bundle")
    synced = run_client(s3_endpoint, "sync", f"s3://{BUCKET}/fmcluster/bootstrap/", str(mirror))
    assert synced.returncode == 0, synced.stderr
    assert sorted(str(p.relative_to(mirror)) for p in mirror.rglob("*") if p.is_file()) == [
        "converge.env", "sub dir/a+b.txt", "wheelhouse/x-1.0-py3-none-any.whl"]
    assert (mirror / "wheelhouse" / "x-1.0-py3-none-any.whl").read_bytes() == wheel

    # A file already there with the object's MD5 is kept as it is (not fetched again).
    kept = mirror / "wheelhouse" / "x-1.0-py3-none-any.whl"
    before = kept.stat().st_ino
    assert run_client(s3_endpoint, "sync", f"s3://{BUCKET}/fmcluster/bootstrap/", str(mirror)).returncode == 0
    assert kept.stat().st_ino == before

    report = tmp_path / "report.json"
    report.write_text('{"ok": false}\n')
    put = run_client(s3_endpoint, "put", str(report), f"s3://{BUCKET}/fmcluster/report/10.0.0.4.json")
    assert put.returncode == 0, put.stderr
    assert s3.get_object(Bucket=BUCKET, Key="fmcluster/report/10.0.0.4.json")["Body"].read() == b'{"ok": false}\n'


def test_what_cannot_be_fetched_fails_naming_the_address_and_s3_s_error(s3_endpoint: str, tmp_path: Path) -> None:
    missing = run_client(s3_endpoint, "get", f"s3://{BUCKET}/fmcluster/nothing", str(tmp_path / "x"))
    assert missing.returncode == 1
    assert "HTTP 404 NoSuchKey" in missing.stderr and "/fmcluster/nothing" in missing.stderr
    assert not (tmp_path / "x").exists()
    empty = run_client(s3_endpoint, "sync", f"s3://{BUCKET}/fmcluster/none/", str(tmp_path / "y"))
    assert empty.returncode == 1 and f"nothing under s3://{BUCKET}/fmcluster/none/" in empty.stderr
    assert run_client(s3_endpoint, "get", "not-an-address", "x").returncode == 1


def test_without_credentials_in_the_environment_it_asks_the_instance_metadata_service() -> None:
    done = subprocess.run([sys.executable, str(CLIENT), "--region", REGION, "get", "s3://b/k", "/dev/null"],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
                          timeout=60, check=False)
    assert done.returncode == 1
    assert "no credentials: none in the environment and the instance metadata service gave none" in done.stderr


def test_the_first_boot_script_carries_the_client_packed_and_runnable(tmp_path: Path) -> None:
    script = first_boot_script()
    packed = packed_s3_client()
    assert packed in script and S3_CLIENT_PLACEHOLDER not in script
    unpacked = gzip.decompress(base64.b64decode(packed))
    assert packed == packed_s3_client(), "byte-stable: an unchanged client changes no launch template"
    (tmp_path / "fmcluster-s3").write_bytes(unpacked)
    usage = subprocess.run([sys.executable, str(tmp_path / "fmcluster-s3")], capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: fmcluster-s3")
    # EC2 takes 16 KB of user data (raw); the first-boot script leaves room for the settings before it. The client's
    # `verify` (issue 42: nodes check what they run) took it from 7.6 KB to 9.3 KB; 10 KB leaves 6 KB for the settings.
    assert len(script.encode()) < 10 * 1024, len(script.encode())


def test_whoami_names_the_caller_as_iam_s_aws_userid_does(s3_endpoint: str) -> None:
    """An instance role's session is "<role id>:<instance id>" (what the report-key policy grants on); the
    emulator's STS gives assumed-role sessions that form, as AWS does."""
    iam: Any = aws.client("iam", REGION, s3_endpoint)
    role = iam.create_role(RoleName="whoami-node", AssumeRolePolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                                 "Action": "sts:AssumeRole"}]}))["Role"]
    session = aws.client("sts", REGION, s3_endpoint).assume_role(RoleArn=role["Arn"],
                                                                 RoleSessionName="i-0123456789abcdef0")["Credentials"]
    env = {"PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": session["AccessKeyId"],
           "AWS_SECRET_ACCESS_KEY": session["SecretAccessKey"], "AWS_SESSION_TOKEN": session["SessionToken"],
           "FMCLUSTER_REGION": REGION}
    done = subprocess.run(["/usr/bin/python3", str(CLIENT), "whoami"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{role['RoleId']}:i-0123456789abcdef0\n"


def _session(endpoint: str, name: str) -> dict[str, str]:
    """The environment of a node whose credentials are a session `name` of an instance role (the emulator's STS)."""
    iam: Any = aws.client("iam", REGION, endpoint)
    try:
        role = iam.get_role(RoleName="instance-id-node")["Role"]
    except iam.exceptions.NoSuchEntityException:
        role = iam.create_role(RoleName="instance-id-node", AssumeRolePolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"Service": "sagemaker.amazonaws.com"}}]}))["Role"]
    creds = aws.client("sts", REGION, endpoint).assume_role(RoleArn=role["Arn"], RoleSessionName=name)["Credentials"]
    return {"PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"], "AWS_SESSION_TOKEN": creds["SessionToken"],
            "FMCLUSTER_REGION": REGION}


def test_instance_id_is_the_metadata_service_s_and_never_a_shared_session_s(s3_endpoint: str, tmp_path: Path) -> None:
    """`instance-id` names a node's report below its caller identity: the instance metadata service's answer (IMDSv2),
    else the session's name where it names an instance (EC2's); HyperPod's one session for every node of a group,
    "SageMaker", names none, and the command fails rather than give every node one name."""
    from imds_standin import serving

    def instance_id(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/usr/bin/python3", str(CLIENT), "instance-id"], capture_output=True, text=True,
                              env=env, timeout=60, check=False)

    shared = _session(s3_endpoint, "SageMaker")
    with serving(tmp_path, "i-0fedcba9876543210") as url:  # the local substrate's stand-in: tokens required
        done = instance_id({**shared, "AWS_EC2_METADATA_SERVICE_ENDPOINT": url})
        assert (done.returncode, done.stdout) == (0, "i-0fedcba9876543210\n"), done.stderr
    no_imds = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:9"}
    done = instance_id({**_session(s3_endpoint, "i-0123456789abcdef0"), **no_imds})
    assert (done.returncode, done.stdout) == (0, "i-0123456789abcdef0\n"), done.stderr
    done = instance_id({**shared, **no_imds})
    assert done.returncode == 1 and done.stdout == ""
    assert "no instance id: the instance metadata service gave none and the caller's session ('SageMaker')" in done.stderr
