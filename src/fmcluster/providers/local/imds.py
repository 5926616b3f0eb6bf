"""EC2's Instance Metadata Service (IMDS), stood in on the local substrate: run inside an instance's own network
namespace on 169.254.169.254, it answers the instance's meta-data, user data, identity document and instance
profile credentials the way EC2 does, so cloud-init's Ec2 datasource and the AWS SDKs on the host find them where
they look on AWS instead of being handed them by the deploy.

    python3 -I imds.py --config FILE --address A --port P

Run as a script by path, standard library only: no fmcluster import (it runs once per host, inside the host's
namespace, with `-I`).

Protocol (as EC2 documents it)
- IMDSv2 session: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds: N` (1..21600) answers an
  opaque token (text/plain) and echoes the TTL header. No or a bad TTL: 400. A PUT carrying `X-Forwarded-For`: 403
  (EC2 refuses token requests that went through a proxy). A GET with `X-aws-ec2-metadata-token`: a valid, unexpired
  token is answered, any other token 401. A GET without the header is answered only when `http_tokens` is
  "optional" (IMDSv1); "required": 401.
- The hop limit (`http_put_response_hop_limit`, EC2's default 1) is the IP TTL of the token response, as EC2's
  name for it says: the PUT's answer dies after that many hops, so a process one network hop further (a container
  behind a bridge) gets no token; other answers leave with the system's default TTL.
- `http_endpoint: disabled`: every request is answered 403 (the status cloud-init reads as "IMDS disabled").
- `/` lists the versions; `/latest/` and any dated version `/YYYY-MM-DD/` (and `1.0`) serve the same tree.
  Directories list their children one a line, subdirectories with a trailing `/`, with or without the slash on
  the request; a leaf is answered with or without a trailing slash too (botocore asks for
  `placement/availability-zone/`). Neither listings nor leaves end in a newline: cloud-init reads a value holding
  a newline as a list, botocore uses a listing as the role name as it is.
- `public-keys/` lists `0=<key name>`, `public-keys/0/` lists `openssh-key`.
- No instance profile: no `iam/` (404), as EC2. No user data: `user-data` 404, as EC2.
- `dynamic/instance-identity/` lists `document` only: a stand-in cannot sign, and a signature (pkcs7, rsa2048,
  signature) nobody can verify would be worse than none.
- Unknown path: 404 with EC2's HTML error page; wrong method: 405.

Config file (JSON, written by the provider; re-read on the first request after it changed, so the provider
rotates credentials by replacing it atomically; a config that no longer parses is logged and the last good one
kept). Keys, `?` optional:

    {
      "instance": {
        "instance_id": "i-0123...", "instance_type": "p5.48xlarge", "image_id": "ami-...",
        "launch_index?": 0, "architecture?": "x86_64", "root_device_name?": "/dev/xvda",
        "region": "us-east-1", "availability_zone": "us-east-1a", "availability_zone_id": "use1-az1",
        "account_id": "123456789012", "reservation_id": "r-...", "launch_time": "2025-01-01T00:00:00Z",
        "private_ip": "10.77.128.4", "hostname": "ip-10-77-128-4.ec2.internal",
        "mac": "02:00:0a:4d:80:04", "interface_id": "eni-...",
        "subnet_id": "subnet-...", "subnet_cidr": "10.77.128.0/20",
        "vpc_id": "vpc-...", "vpc_cidrs": ["10.77.0.0/16"],
        "security_groups": [{"id": "sg-...", "name": "compute"}],
        "key_name?": "operator", "public_key?": "ssh-ed25519 AAAA... operator"
      },
      "user_data?": "<base64>" | null,
      "metadata_options?": {"http_tokens?": "required" | "optional", "http_put_response_hop_limit?": 1,
                            "http_endpoint?": "enabled" | "disabled"},
      "instance_profile?": {"arn": "arn:aws:iam::123456789012:instance-profile/x", "id": "AIPA...",
                            "role_name": "x-node"} | null,
      "credentials?": {"access_key_id": "ASIA...", "secret_access_key": "...", "token": "...",
                       "expiration": "2025-01-01T12:00:00Z", "last_updated?": "2025-01-01T00:00:00Z"} | null
    }

`metadata_options` defaults: hop limit 1 and endpoint "enabled" (EC2's defaults); tokens "required", where EC2's
API default is "optional": an omitted option must not quietly open IMDSv1 (images marked ImdsSupport v2.0 get
"required" on EC2 too). An instance profile needs credentials. `last_updated` defaults to the config's mtime.
Required strings must be non-empty, timestamps exactly YYYY-MM-DDTHH:MM:SSZ (UTC): the stand-in refuses to start
on a config that is not so, and keeps the last good one when a rewrite is not.

Each request is logged to stderr as one line: method, path, status, peer. Tokens and secrets never are.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, Union

TOKEN_PATH = "/latest/api/token"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
MAX_TOKEN_TTL = 21600
#: Versions `/` lists: the ones cloud-init (2021-03-23, 2018-09-24, 2016-09-02, 2009-04-04) and the SDKs (latest)
#: ask for, and EC2's first. Any other dated version is served too: the tree does not depend on it.
LISTED_VERSIONS = ("1.0", "2009-04-04", "2016-09-02", "2018-09-24", "2021-03-23", "latest")
VERSION = re.compile(r"^(latest|1\.0|\d{4}-\d{2}-\d{2})$")
ISO8601 = "%Y-%m-%dT%H:%M:%SZ"
#: An idle keep-alive connection is dropped after this long, so a stuck client holds no thread for ever.
IDLE_SECONDS = 30
#: A token request's body is ignored; one larger than this is not a client of IMDS.
MAX_BODY = 65536


class ConfigError(ValueError):
    """The config file does not follow the schema in the module docstring."""


# --- the config --------------------------------------------------------------------------------------------------


def _text(section: dict[str, Any], key: str, default: str | None = None) -> str:
    value = section.get(key)
    value = default if value is None else value
    if not isinstance(value, str) or (not value and default is None):
        raise ConfigError(f"{key}: a non-empty string is required")
    return value


def _section(data: dict[str, Any], key: str, required: bool = False) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: an object is required")
    return value


def _timestamp(value: str, key: str) -> str:
    # botocore parses Expiration with exactly this format; anything else would be refused on the host, not here.
    try:
        datetime.datetime.strptime(value, ISO8601)
    except ValueError:
        raise ConfigError(f"{key}: {value!r} is not YYYY-MM-DDTHH:MM:SSZ") from None
    return value


@dataclass(frozen=True)
class SecurityGroup:
    id: str
    name: str


@dataclass(frozen=True)
class Instance:
    instance_id: str
    instance_type: str
    image_id: str
    launch_index: int
    architecture: str
    root_device_name: str
    region: str
    availability_zone: str
    availability_zone_id: str
    account_id: str
    reservation_id: str
    launch_time: str
    private_ip: str
    hostname: str
    mac: str
    interface_id: str
    subnet_id: str
    subnet_cidr: str
    vpc_id: str
    vpc_cidrs: tuple[str, ...]
    security_groups: tuple[SecurityGroup, ...]
    key_name: str
    public_key: str


@dataclass(frozen=True)
class Options:
    http_tokens: str = "required"
    hop_limit: int = 1
    enabled: bool = True


@dataclass(frozen=True)
class Profile:
    arn: str
    id: str
    role_name: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    token: str = field(repr=False)
    expiration: str
    last_updated: str


@dataclass(frozen=True)
class Config:
    instance: Instance
    options: Options
    profile: Profile | None
    user_data: bytes | None
    last_updated: str


def _groups(value: Any) -> tuple[SecurityGroup, ...]:
    if not isinstance(value, list) or not all(isinstance(g, dict) for g in value):
        raise ConfigError("security_groups: a list of {id, name} is required")
    return tuple(SecurityGroup(_text(g, "id"), _text(g, "name")) for g in value)


def _strings(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: a non-empty list of strings is required")
    return tuple(value)


def _instance(data: dict[str, Any]) -> Instance:
    launch_index = data.get("launch_index", 0)
    if not isinstance(launch_index, int) or isinstance(launch_index, bool) or launch_index < 0:
        raise ConfigError("launch_index: a non-negative integer is required")
    key_name, public_key = _text(data, "key_name", ""), _text(data, "public_key", "")
    if bool(key_name) != bool(public_key):
        raise ConfigError("key_name and public_key go together")
    return Instance(
        instance_id=_text(data, "instance_id"), instance_type=_text(data, "instance_type"),
        image_id=_text(data, "image_id"), launch_index=launch_index,
        architecture=_text(data, "architecture", "x86_64"), root_device_name=_text(data, "root_device_name", "/dev/xvda"),
        region=_text(data, "region"), availability_zone=_text(data, "availability_zone"),
        availability_zone_id=_text(data, "availability_zone_id"), account_id=_text(data, "account_id"),
        reservation_id=_text(data, "reservation_id"), launch_time=_timestamp(_text(data, "launch_time"), "launch_time"),
        private_ip=_text(data, "private_ip"), hostname=_text(data, "hostname"), mac=_text(data, "mac").lower(),
        interface_id=_text(data, "interface_id"), subnet_id=_text(data, "subnet_id"),
        subnet_cidr=_text(data, "subnet_cidr"), vpc_id=_text(data, "vpc_id"),
        vpc_cidrs=_strings(data.get("vpc_cidrs"), "vpc_cidrs"), security_groups=_groups(data.get("security_groups")),
        key_name=key_name, public_key=public_key.strip())


def _options(data: dict[str, Any] | None) -> Options:
    data = data or {}
    tokens = data.get("http_tokens", "required")
    hops = data.get("http_put_response_hop_limit", 1)
    endpoint = data.get("http_endpoint", "enabled")
    if tokens not in ("required", "optional"):
        raise ConfigError("http_tokens: 'required' or 'optional'")
    if not isinstance(hops, int) or isinstance(hops, bool) or not 1 <= hops <= 64:
        raise ConfigError("http_put_response_hop_limit: an integer from 1 to 64 (EC2's range)")
    if endpoint not in ("enabled", "disabled"):
        raise ConfigError("http_endpoint: 'enabled' or 'disabled'")
    return Options(http_tokens=tokens, hop_limit=hops, enabled=endpoint == "enabled")


def _profile(profile: dict[str, Any] | None, credentials: dict[str, Any] | None, updated: str) -> Profile | None:
    if profile is None:
        return None
    if credentials is None:
        # EC2 hands an instance launched with a profile its role's session; a profile without one is a provider bug.
        raise ConfigError("instance_profile needs credentials")
    return Profile(
        arn=_text(profile, "arn"), id=_text(profile, "id"), role_name=_text(profile, "role_name"),
        access_key_id=_text(credentials, "access_key_id"), secret_access_key=_text(credentials, "secret_access_key"),
        token=_text(credentials, "token"), expiration=_timestamp(_text(credentials, "expiration"), "expiration"),
        last_updated=_timestamp(_text(credentials, "last_updated", updated), "last_updated"))


def _user_data(value: Any) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError("user_data: base64 text or null")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as err:
        raise ConfigError(f"user_data: not base64: {err}") from None


def parse_config(text: str, mtime: float) -> Config:
    """The config `text` describes; `mtime` (the file's) stands for LastUpdated when the provider gives none."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"not JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError("the config is a JSON object")
    updated = datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc).strftime(ISO8601)
    return Config(
        instance=_instance(_section(data, "instance", required=True) or {}),
        options=_options(_section(data, "metadata_options")),
        profile=_profile(_section(data, "instance_profile"), _section(data, "credentials"), updated),
        user_data=_user_data(data.get("user_data")), last_updated=updated)


class ConfigSource:
    """The config file, re-read when it changed. The provider replaces it atomically (rename), so a change shows
    as a new inode as well as a new mtime; both are compared, mtime alone can repeat within its granularity."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._config: Config | None = None

    def current(self) -> Config:
        with self._lock:
            try:
                stat = os.stat(self._path)
            except OSError as err:
                return self._keep(err)
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if stamp == self._stamp and self._config is not None:
                return self._config
            # Remembered before parsing so a bad rewrite is logged once, not on every request until the next one.
            self._stamp = stamp
            try:
                with open(self._path, encoding="utf-8") as handle:
                    self._config = parse_config(handle.read(), stat.st_mtime)
            except (OSError, ConfigError) as err:
                return self._keep(err)
            return self._config

    def _keep(self, err: Exception) -> Config:
        """The last good config after `err`: a host losing its credentials mid-run to one bad rewrite would be
        worse than stale facts. None yet (at start): the error is the caller's."""
        if self._config is None:
            raise err
        print(f"imds: config {self._path} not reloaded, keeping the last good one: {err}", file=sys.stderr)
        return self._config


# --- the metadata tree -------------------------------------------------------------------------------------------

Node = Union["Directory", str, bytes]


@dataclass(frozen=True)
class Directory:
    """A listed path. `labels` replaces a child's listed name, as it is (public-keys lists `0=<key name>` for
    directory `0`, without the slash: cloud-init reads `N=name` as a key at `N/openssh-key`, `x/` as a directory
    to walk); `slashes` says whether subdirectories are listed with a trailing `/` (EC2's version root lists none)."""

    children: dict[str, Node]
    labels: dict[str, str] = field(default_factory=dict)
    slashes: bool = True

    def listing(self) -> str:
        def label(name: str) -> str:
            if name in self.labels:
                return self.labels[name]
            return name + "/" if self.slashes and isinstance(self.children[name], Directory) else name

        return "\n".join(label(name) for name in sorted(self.children))


def _interface(instance: Instance) -> Directory:
    return Directory({
        "device-number": "0",
        "interface-id": instance.interface_id,
        "local-hostname": instance.hostname,
        "local-ipv4s": instance.private_ip,
        "mac": instance.mac,
        "owner-id": instance.account_id,
        "security-group-ids": "\n".join(g.id for g in instance.security_groups),
        "security-groups": "\n".join(g.name for g in instance.security_groups),
        "subnet-id": instance.subnet_id,
        "subnet-ipv4-cidr-block": instance.subnet_cidr,
        "vpc-id": instance.vpc_id,
        "vpc-ipv4-cidr-block": instance.vpc_cidrs[0],
        "vpc-ipv4-cidr-blocks": "\n".join(instance.vpc_cidrs),
    })


def _iam(config: Config, profile: Profile) -> Directory:
    info = {"Code": "Success", "LastUpdated": config.last_updated,
            "InstanceProfileArn": profile.arn, "InstanceProfileId": profile.id}
    credentials = {"Code": "Success", "LastUpdated": profile.last_updated, "Type": "AWS-HMAC",
                   "AccessKeyId": profile.access_key_id, "SecretAccessKey": profile.secret_access_key,
                   "Token": profile.token, "Expiration": profile.expiration}
    return Directory({"info": json.dumps(info, indent=2),
                      "security-credentials": Directory({profile.role_name: json.dumps(credentials, indent=2)})})


def _meta_data(config: Config) -> Directory:
    instance = config.instance
    tree: dict[str, Node] = {
        "ami-id": instance.image_id,
        "ami-launch-index": str(instance.launch_index),
        "ami-manifest-path": "(unknown)",
        "block-device-mapping": Directory({"ami": instance.root_device_name, "root": instance.root_device_name}),
        "hostname": instance.hostname,
        "instance-action": "none",
        "instance-id": instance.instance_id,
        "instance-life-cycle": "on-demand",
        "instance-type": instance.instance_type,
        "local-hostname": instance.hostname,
        "local-ipv4": instance.private_ip,
        "mac": instance.mac,
        "network": Directory({"interfaces": Directory({"macs": Directory({instance.mac: _interface(instance)})})}),
        "placement": Directory({"availability-zone": instance.availability_zone,
                                "availability-zone-id": instance.availability_zone_id,
                                "region": instance.region}),
        "profile": "default-hvm",
        "reservation-id": instance.reservation_id,
        "security-groups": "\n".join(g.name for g in instance.security_groups),
        "services": Directory({"domain": "amazonaws.com", "partition": "aws"}),
    }
    if instance.key_name:
        tree["public-keys"] = Directory({"0": Directory({"openssh-key": instance.public_key})},
                                        labels={"0": f"0={instance.key_name}"})
    if config.profile is not None:
        tree["iam"] = _iam(config, config.profile)
    return Directory(tree)


def _identity(instance: Instance) -> str:
    document = {
        "accountId": instance.account_id, "architecture": instance.architecture,
        "availabilityZone": instance.availability_zone, "billingProducts": None, "devpayProductCodes": None,
        "marketplaceProductCodes": None, "imageId": instance.image_id, "instanceId": instance.instance_id,
        "instanceType": instance.instance_type, "kernelId": None, "pendingTime": instance.launch_time,
        "privateIp": instance.private_ip, "ramdiskId": None, "region": instance.region, "version": "2017-09-30",
    }
    return json.dumps(document, indent=2)


def version_tree(config: Config) -> Directory:
    """What one version (`/latest/`, `/2021-03-23/`, ...) serves."""
    tree: dict[str, Node] = {
        "meta-data": _meta_data(config),
        "dynamic": Directory({"instance-identity": Directory({"document": _identity(config.instance)})}),
    }
    if config.user_data is not None:
        tree["user-data"] = config.user_data
    return Directory(tree, slashes=False)


def lookup(config: Config, path: str) -> Node | None:
    """The node at request path `path` (already unquoted, query stripped), or None."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return Directory({v: "" for v in LISTED_VERSIONS}, slashes=False)
    if not VERSION.match(parts[0]):
        return None
    node: Node = version_tree(config)
    for part in parts[1:]:
        if not isinstance(node, Directory) or part not in node.children:
            return None
        node = node.children[part]
    return node


# --- tokens ------------------------------------------------------------------------------------------------------


class Tokens:
    """IMDSv2 session tokens: opaque to the client, verifiable without a table (deadline + nonce, signed with a
    key that lives and dies with this process), so tokens cost no memory and a restart revokes them all, as an
    instance's stop does on EC2. The deadline is on the monotonic clock: a wall-clock step neither expires nor
    revives a token."""

    _LAYOUT = struct.Struct(">Q16s")

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _sign(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:24]

    def issue(self, ttl: int) -> str:
        body = self._LAYOUT.pack(time.monotonic_ns() + ttl * 1_000_000_000, secrets.token_bytes(16))
        return base64.urlsafe_b64encode(body + self._sign(body)).decode("ascii")

    def valid(self, token: str) -> bool:
        try:
            raw = base64.urlsafe_b64decode(token.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            return False
        body, mac = raw[:self._LAYOUT.size], raw[self._LAYOUT.size:]
        if len(body) != self._LAYOUT.size or not hmac.compare_digest(mac, self._sign(body)):
            return False
        deadline, _nonce = self._LAYOUT.unpack(body)
        return bool(time.monotonic_ns() < deadline)


def parse_ttl(value: str | None) -> int | None:
    """The token TTL a PUT asks for, or None when EC2 would answer 400 (missing, not a plain integer, out of range)."""
    if value is None or not re.fullmatch(r"[0-9]{1,6}", value.strip()):
        return None
    ttl = int(value.strip())
    return ttl if 1 <= ttl <= MAX_TOKEN_TTL else None


# --- HTTP --------------------------------------------------------------------------------------------------------

REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed"}


def error_page(status: int) -> bytes:
    """The body EC2's IMDS answers an error with (an XHTML page naming the status)."""
    title = f"{status} - {REASONS[status]}"
    return (
        '<?xml version="1.0" encoding="iso-8859-1"?>\n'
        '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
        '\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
        '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n'
        f" <head>\n  <title>{title}</title>\n </head>\n <body>\n  <h1>{title}</h1>\n </body>\n</html>\n"
    ).encode("ascii")


class Server(ThreadingHTTPServer):
    # A client that never hangs up must not keep the process alive at SIGTERM.
    daemon_threads = True

    def __init__(self, address: tuple[str, int], source: ConfigSource) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.source = source
        self.tokens = Tokens()
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    timeout = IDLE_SECONDS

    def version_string(self) -> str:
        return "EC2ws"  # EC2's Server header; not this Python's version

    # -- answers --

    def _answer(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None,
                hops: int | None = None) -> None:
        if hops is not None:
            self._set_hops(hops)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if hops is not None:
            self._set_hops(None)

    def _error(self, status: int, headers: dict[str, str] | None = None) -> None:
        self._answer(status, error_page(status), "text/html", headers)

    def _set_hops(self, hops: int | None) -> None:
        """The IP TTL (IPv6: hop limit) of what this connection sends next; None: back to the system's default."""
        ipv6 = self.connection.family == socket.AF_INET6
        level, option = (socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS) if ipv6 else (socket.IPPROTO_IP, socket.IP_TTL)
        # -1: Linux's "the default again" (net.ipv4.ip_default_ttl, the route's hop limit) for both families.
        self.connection.setsockopt(level, option, -1 if hops is None else hops)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # One line a request, the path without its query; headers (tokens) and bodies (credentials) never.
        path = urllib.parse.urlsplit(self.path).path
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        print(f"imds: {self.command} {path} {code} {peer}", file=sys.stderr, flush=True)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        # Malformed requests (http.server answers them itself) are logged too, with the peer.
        print(f"imds: {self.client_address[0]}: {format % args}", file=sys.stderr, flush=True)

    # -- methods --

    def _config(self) -> Config | None:
        """The current config, or None after answering 403 when the endpoint is disabled."""
        config = self.server.source.current()
        if not config.options.enabled:
            # A refused request's body is left unread: the connection cannot carry another request.
            self.close_connection = True
            self._error(403)
            return None
        return config

    def _discard_body(self) -> bool:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            return False
        self.rfile.read(length)
        return True

    def do_PUT(self) -> None:
        config = self._config()
        if config is None:
            return
        if not self._discard_body():
            self._error(400)
        elif urllib.parse.urlsplit(self.path).path != TOKEN_PATH:
            self._error(405, {"Allow": "GET"})
        elif self.headers.get("X-Forwarded-For") is not None:
            self._error(403)
        elif (ttl := parse_ttl(self.headers.get(TTL_HEADER))) is None:
            self._error(400)
        else:
            self._answer(200, self.server.tokens.issue(ttl).encode("ascii"), "text/plain",
                         {TTL_HEADER: str(ttl)}, hops=config.options.hop_limit)

    def _authorized(self, config: Config) -> bool:
        token = self.headers.get(TOKEN_HEADER)
        if token is None:
            return config.options.http_tokens == "optional"
        return self.server.tokens.valid(token.strip())

    def do_GET(self) -> None:
        config = self._config()
        if config is None:
            return
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if path == TOKEN_PATH:
            self._error(405, {"Allow": "PUT"})
            return
        if not self._authorized(config):
            self._error(401)
            return
        node = lookup(config, path)
        if node is None:
            self._error(404)
        elif isinstance(node, Directory):
            self._answer(200, node.listing().encode("utf-8"), "text/plain")
        elif isinstance(node, bytes):
            self._answer(200, node, "application/octet-stream")
        else:
            self._answer(200, node.encode("utf-8"), "text/plain")

    def _not_allowed(self) -> None:
        if self._config() is not None:
            self.close_connection = True  # its body is not read
            self._error(405, {"Allow": "GET, PUT"})

    do_POST = do_DELETE = do_PATCH = _not_allowed


# --- main --------------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="imds.py", description="EC2 instance metadata service stand-in")
    parser.add_argument("--config", required=True, help="the instance's JSON config (see the module docstring)")
    parser.add_argument("--address", default="169.254.169.254")
    parser.add_argument("--port", type=int, default=80)
    args = parser.parse_args(argv)
    source = ConfigSource(args.config)
    try:
        source.current()  # a config that is wrong from the start is the provider's bug: fail loudly, now
        server = Server((args.address, args.port), source)
    except (OSError, ConfigError) as err:
        print(f"imds: cannot start: {err}", file=sys.stderr)
        return 1

    def stop(signum: int, _frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return: call it from another thread, never the serving one.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"imds: serving {args.address}:{server.server_address[1]}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
