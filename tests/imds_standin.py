"""The IMDS stand-in (fmcluster.providers.local.imds) started for a test, as the provider runs it: the script by path,
`python3 -I`, on a free port of this machine. tests/test_imds_standin.py tests the stand-in itself; other tests ask
it what a node asks EC2's metadata service (its instance id) instead of a stub of their own."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import ROOT

SCRIPT = ROOT / "src" / "fmcluster" / "providers" / "local" / "imds.py"
MAC = "02:00:0a:4d:80:04"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY"
SESSION = "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN"
#: No proxy between the tests and the stand-in, whatever this machine's environment says.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def facts(**over: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "instance": {
            "instance_id": "i-0a1b2c3d4e5f60718", "instance_type": "p5.48xlarge", "image_id": "ami-0123456789abcdef0",
            "region": "us-east-2", "availability_zone": "us-east-2b", "availability_zone_id": "use2-az2",
            "account_id": "123456789012", "reservation_id": "r-0fedcba9876543210",
            "launch_time": "2025-06-01T12:00:00Z", "private_ip": "10.77.128.4",
            "hostname": "ip-10-77-128-4.us-east-2.compute.internal", "mac": MAC, "interface_id": "eni-0abc",
            "subnet_id": "subnet-0abc", "subnet_cidr": "10.77.128.0/20", "vpc_id": "vpc-0abc",
            "vpc_cidrs": ["10.77.0.0/16", "10.78.0.0/16"],
            "security_groups": [{"id": "sg-01", "name": "compute"}, {"id": "sg-02", "name": "efa"}],
            "key_name": "operator", "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample operator",
        },
        "user_data": base64.b64encode(b"#cloud-config\nruncmd: [true]\n").decode(),
        "metadata_options": {"http_tokens": "required", "http_put_response_hop_limit": 1, "http_endpoint": "enabled"},
        "instance_profile": {"arn": "arn:aws:iam::123456789012:instance-profile/fm-node", "id": "AIPAEXAMPLE",
                             "role_name": "fm-node-role"},
        "credentials": {"access_key_id": "ASIAEXAMPLE1", "secret_access_key": SECRET, "token": SESSION,
                        "expiration": "2099-01-01T00:00:00Z"},
    }
    config.update(over)
    return config


def write_atomically(path: Path, config: dict[str, Any]) -> None:
    """As the provider rotates credentials: a new file renamed over the old one."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(config))
    os.replace(partial, path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]

    @property
    def text(self) -> str:
        return self.body.decode()


@dataclass
class Imds:
    url: str
    config: Path
    process: subprocess.Popen[bytes]

    def request(self, path: str, method: str = "GET", headers: dict[str, str] | None = None) -> Answer:
        request = urllib.request.Request(self.url + path, method=method, headers=headers or {})
        try:
            with OPENER.open(request, timeout=5) as response:
                return Answer(response.status, response.read(), dict(response.headers))
        except urllib.error.HTTPError as err:
            return Answer(err.code, err.read(), dict(err.headers))

    def token(self, ttl: int = 60) -> str:
        answer = self.request("/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})
        assert answer.status == 200, answer
        return answer.text

    def get(self, path: str) -> Answer:
        return self.request(path, headers={"X-aws-ec2-metadata-token": self.token()})

    def stop(self) -> str:
        """SIGTERM, as the provider stops it; returns its log (stderr)."""
        self.process.send_signal(signal.SIGTERM)
        _out, err = self.process.communicate(timeout=10)
        assert self.process.returncode == 0, err
        return err.decode()


def launch(directory: Path, config: dict[str, Any] | None = None) -> Imds:
    """The stand-in serving `config` (facts() by default), listening once this returns."""
    path = directory / "imds.json"
    write_atomically(path, facts() if config is None else config)
    port = free_port()
    process = subprocess.Popen([sys.executable, "-I", str(SCRIPT), "--config", str(path),
                                "--address", "127.0.0.1", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    imds = Imds(f"http://127.0.0.1:{port}", path, process)
    deadline = time.monotonic() + 10
    while True:  # answering at all (even 401) is up
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                kill(imds)
                raise AssertionError(f"the stand-in did not start listening: {process.communicate()[1].decode()}")
            time.sleep(0.05)
    return imds


def kill(imds: Imds) -> None:
    if imds.process.poll() is None:
        imds.process.kill()
    imds.process.communicate()


@contextmanager
def serving(directory: Path, instance_id: str) -> Iterator[str]:
    """The stand-in for an instance `instance_id` (IMDSv2 tokens required); yields its URL."""
    config = facts()
    config["instance"]["instance_id"] = instance_id
    imds = launch(directory, config)
    try:
        yield imds.url
    finally:
        kill(imds)
