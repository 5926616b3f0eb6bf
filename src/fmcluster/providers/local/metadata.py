"""Each local host's instance metadata: what EC2 knows of the instance, served by the host's own IMDS stand-in.

The stand-in (fmcluster.providers.local.imds, standard library only) runs in the host's network namespace on
169.254.169.254:80, outside the host's other namespaces, as EC2's metadata service runs outside the instance.
What it serves comes from the emulator alone — the instance as DescribeInstances reports it, its key pair's public
key, its user data, its launch template's MetadataOptions, and its instance profile's role session from STS — and
is written here as the stand-in's config (`<substrate>/imds/<instance id>.json`, root only). Nothing is handed to
the host itself: cloud-init and the AWS SDKs on it ask the metadata service, as on AWS.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fmcluster.providers.local import imds, instance_role
from fmcluster.providers.local.hosts import Host, SubstrateError, read_pid, substrate_root

Client = Callable[[str], Any]
ADDRESS = "169.254.169.254"
PORT = 80
#: How long the stand-in may take to listen.
START_TIMEOUT_S = 10.0
#: Debian 12's cloud-init (22.4) asks for an IMDSv2 token only where it identifies EC2 by the hypervisor UUID
#: (/sys/hypervisor/uuid "ec2…", or DMI, which it does not read in a container), and a container can present
#: neither. So a local instance's metadata service also answers IMDSv1, whatever its launch template asks
#: (listed in docs/local-nodes.md); the SDKs and fmcluster-s3 ask with tokens all the same.
LOCAL_HTTP_TOKENS = "optional"


def config_path(host: Host) -> Path:
    return substrate_root(host.org) / "imds" / f"{host.key}.json"


def log_path(host: Host) -> Path:
    return substrate_root(host.org) / "imds" / f"{host.key}.log"


def _pid_path(host: Host) -> Path:
    return substrate_root(host.org) / "imds" / f"{host.key}.pid"


def _metadata_options(instance: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """The instance's MetadataOptions as EC2 applies them: the instance's own, else its launch template's, else
    EC2's defaults (the stand-in's)."""
    options = instance.get("MetadataOptions") or template.get("MetadataOptions") or {}
    chosen: dict[str, Any] = {"http_tokens": LOCAL_HTTP_TOKENS}
    if options.get("HttpPutResponseHopLimit"):
        chosen["http_put_response_hop_limit"] = int(options["HttpPutResponseHopLimit"])
    if options.get("HttpEndpoint"):
        chosen["http_endpoint"] = options["HttpEndpoint"]
    return chosen


def instance_config(instance: dict[str, Any], reservation_id: str, account_id: str, region: str,
                    vpc_cidrs: Sequence[str], subnet_cidr: str, public_key: str, user_data: str,
                    template: dict[str, Any], session: instance_role.RoleSession) -> dict[str, Any]:
    """The stand-in's config for `instance` (schema: fmcluster.providers.local.imds)."""
    interface = (instance.get("NetworkInterfaces") or [{}])[0]
    address = instance.get("PrivateIpAddress", "")
    launched: Any = instance.get("LaunchTime")
    if not hasattr(launched, "strftime"):
        launched = datetime.now(timezone.utc)
    zone = (instance.get("Placement") or {}).get("AvailabilityZone", f"{region}a")
    facts: dict[str, Any] = {
        "instance_id": instance["InstanceId"], "instance_type": instance.get("InstanceType") or "unknown",
        "image_id": instance.get("ImageId") or "ami-00000000", "launch_index": int(instance.get("AmiLaunchIndex", 0)),
        "architecture": instance.get("Architecture", "x86_64"),
        "root_device_name": instance.get("RootDeviceName", "/dev/xvda"),
        "region": region, "availability_zone": zone, "availability_zone_id": zone,
        "account_id": account_id, "reservation_id": reservation_id,
        "launch_time": launched.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "private_ip": address, "hostname": instance.get("PrivateDnsName") or f"ip-{address.replace('.', '-')}",
        "mac": mac(instance), "interface_id": interface.get("NetworkInterfaceId") or "eni-00000000",
        "subnet_id": instance.get("SubnetId") or "subnet-00000000", "subnet_cidr": subnet_cidr,
        "vpc_id": instance.get("VpcId") or "vpc-00000000", "vpc_cidrs": list(vpc_cidrs),
        "security_groups": [{"id": g["GroupId"], "name": g.get("GroupName", g["GroupId"])}
                            for g in instance.get("SecurityGroups", [])],
    }
    if instance.get("KeyName") and public_key:
        facts.update({"key_name": instance["KeyName"], "public_key": public_key.strip()})
    return {
        "instance": facts,
        "user_data": user_data or None,
        "metadata_options": _metadata_options(instance, template),
        "instance_profile": {"arn": session.profile_arn, "id": session.profile_id, "role_name": session.role_name},
        "credentials": {"access_key_id": session.access_key_id, "secret_access_key": session.secret_access_key,
                        "token": session.token, "expiration": session.expiration},
    }


def mac(instance: dict[str, Any]) -> str:
    """The primary interface's MAC: the emulator's, else a locally administered one from the address (02:…, as
    EC2's ENIs have). The host's eth0 takes it, so what the metadata says and what the host sees agree."""
    given = str(((instance.get("NetworkInterfaces") or [{}])[0]).get("MacAddress") or "").lower()
    if re.fullmatch(r"(?:[0-9a-f]{2}:){5}[0-9a-f]{2}", given):  # the emulator's are not always MACs ("5202x")
        return given
    return "02:00:" + ":".join(f"{int(octet):02x}" for octet in instance.get("PrivateIpAddress", "0.0.0.0").split("."))


def write_config(host: Host, config: dict[str, Any]) -> None:
    path = config_path(host)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as sink:
        json.dump(config, sink, indent=1)
    tmp.replace(path)  # the stand-in re-reads a replaced config on its next request


def running(host: Host) -> bool:
    return read_pid(_pid_path(host)) is not None


def ensure_service(host: Host) -> bool:
    """The host's metadata service on 169.254.169.254:80 in its network namespace; returns whether it was started.
    SubstrateError with the stand-in's log when it does not come up."""
    if running(host):
        return False
    done = subprocess.run(["ip", "-n", host.netns, "addr", "replace", f"{ADDRESS}/32", "dev", "lo"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SubstrateError(f"cannot give host {host.hostname}'s network the metadata address: {done.stderr.strip()}")
    log = log_path(host)
    with log.open("ab") as sink:
        proc = subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, "-I", str(Path(imds.__file__)),
                                 "--config", str(config_path(host)), "--address", ADDRESS, "--port", str(PORT)],
                                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    _pid_path(host).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while f"imds: serving {ADDRESS}:{PORT}" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:])
            raise SubstrateError(f"the metadata service of host {host.hostname} did not start; {log}:\n{tail}")
        time.sleep(0.05)
    return True
