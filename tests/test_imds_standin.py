"""The IMDS stand-in (fmcluster.providers.local.imds), for real: the script runs as the provider runs it (by path,
`python3 -I`, standard library only) on a free port of this machine, and is read by botocore's own IMDS clients
(credentials through the IMDSv2 token flow, region) and by plain HTTP where the protocol's edges are the point
(status codes, listings, token expiry, config reload). cloud-init is not installed here: its Ec2 datasource's walk
of the tree (listings followed, `0=<key>` entries read at `0/openssh-key`, security-credentials skipped, every
listed leaf fetched) is retraced by `crawl` below instead."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
from botocore.credentials import InstanceMetadataProvider
from botocore.utils import InstanceMetadataFetcher, InstanceMetadataRegionFetcher

from imds_standin import MAC, SCRIPT, SECRET, SESSION, Imds, facts, free_port, kill, launch, write_atomically

@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Imds]]:
    running: list[Imds] = []

    def started(config: dict[str, Any] | None = None) -> Imds:
        running.append(launch(tmp_path, config))
        return running[-1]

    yield started
    for imds in running:
        kill(imds)


def crawl(imds: Imds, url: str, token: str) -> Any:
    """cloud-init's Ec2 walk of a directory: a listed `x/` is a directory, `N=name` a key read at `N/openssh-key`,
    security-credentials is never read; a leaf holding a newline is a list, one in braces JSON. Every listed entry
    must answer 200, or cloud-init's whole crawl fails."""
    listing = imds.request(url, headers={"X-aws-ec2-metadata-token": token})
    assert listing.status == 200, url
    url = url if url.endswith("/") else url + "/"  # cloud-init joins a child to its parent with one slash
    tree: dict[str, Any] = {}
    for entry in listing.text.splitlines():
        name = entry.rstrip("/")
        if name == "security-credentials":
            continue
        if entry.endswith("/"):
            tree[name] = crawl(imds, f"{url}{name}/", token)
            continue
        resource = name
        if "=" in entry and entry.split("=", 1)[0].isdigit():
            index, name = entry.split("=", 1)
            resource = f"{index}/openssh-key"
        leaf = imds.request(url + resource, headers={"X-aws-ec2-metadata-token": token})
        assert leaf.status == 200, url + resource
        value = leaf.text
        tree[name] = json.loads(value) if value.startswith("{") else value.splitlines() if "\n" in value else value
    return tree


# --- real AWS clients --------------------------------------------------------------------------------------------


def test_botocore_gets_the_role_credentials_through_a_token_and_the_log_keeps_them_secret(start: Callable[..., Imds]) -> None:
    imds = start()
    fetcher = InstanceMetadataFetcher(base_url=imds.url, timeout=2, num_attempts=1, env={})
    found = fetcher.retrieve_iam_role_credentials()
    assert found == {"role_name": "fm-node-role", "access_key": "ASIAEXAMPLE1", "secret_key": SECRET,
                     "token": SESSION, "expiry_time": "2099-01-01T00:00:00Z"}
    credentials = InstanceMetadataProvider(iam_role_fetcher=fetcher).load()
    assert credentials.method == "iam-role" and credentials.get_frozen_credentials().secret_key == SECRET
    region = InstanceMetadataRegionFetcher(base_url=imds.url, timeout=2, num_attempts=1, env={}).retrieve_region()
    assert region == "us-east-2"

    log = imds.stop()
    assert "PUT /latest/api/token 200 127.0.0.1:" in log
    assert "GET /latest/meta-data/iam/security-credentials/fm-node-role 200 127.0.0.1:" in log
    assert SECRET not in log and SESSION not in log and "ASIAEXAMPLE1" not in log


def test_a_rewritten_config_is_served_on_the_next_request(start: Callable[..., Imds]) -> None:
    imds = start()
    fetcher = InstanceMetadataFetcher(base_url=imds.url, timeout=2, num_attempts=1, env={})
    assert fetcher.retrieve_iam_role_credentials()["access_key"] == "ASIAEXAMPLE1"
    rotated = facts(credentials={"access_key_id": "ASIAROTATED2", "secret_access_key": "s2", "token": "t2",
                                 "expiration": "2099-01-02T00:00:00Z", "last_updated": "2025-06-01T13:00:00Z"})
    write_atomically(imds.config, rotated)
    assert fetcher.retrieve_iam_role_credentials()["access_key"] == "ASIAROTATED2"
    document = json.loads(imds.get("/latest/meta-data/iam/security-credentials/fm-node-role").text)
    assert document["LastUpdated"] == "2025-06-01T13:00:00Z" and document["Type"] == "AWS-HMAC"

    # A rewrite that does not parse keeps the last good config (and says so in the log).
    imds.config.write_text("{not json")
    assert imds.get("/latest/meta-data/iam/security-credentials/fm-node-role").status == 200
    assert "not reloaded" in imds.stop()


# --- IMDSv2 ------------------------------------------------------------------------------------------------------


def test_required_tokens_refuse_a_request_without_one_and_any_bad_token(start: Callable[..., Imds]) -> None:
    imds = start()
    assert imds.request("/latest/meta-data/instance-id").status == 401
    assert imds.request("/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": "forged"}).status == 401
    answer = imds.get("/latest/meta-data/instance-id")
    assert (answer.status, answer.text, answer.headers["Content-Type"]) == (200, "i-0a1b2c3d4e5f60718", "text/plain")


def test_optional_tokens_answer_imdsv1_but_still_refuse_a_bad_token(start: Callable[..., Imds]) -> None:
    imds = start(facts(metadata_options={"http_tokens": "optional"}))
    assert imds.request("/latest/meta-data/instance-id").text == "i-0a1b2c3d4e5f60718"
    assert imds.request("/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": "forged"}).status == 401


@pytest.mark.parametrize("ttl", [None, "0", "21601", "abc", "-5", ""])
def test_a_token_request_without_a_valid_ttl_is_400(start: Callable[..., Imds], ttl: str | None) -> None:
    imds = start()
    headers = {} if ttl is None else {"X-aws-ec2-metadata-token-ttl-seconds": ttl}
    assert imds.request("/latest/api/token", "PUT", headers).status == 400


def test_a_token_answer_echoes_its_ttl_and_a_proxied_token_request_is_403(start: Callable[..., Imds]) -> None:
    imds = start()
    answer = imds.request("/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
    assert answer.status == 200 and answer.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    assert answer.headers["Content-Type"] == "text/plain" and answer.text
    proxied = {"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "10.0.0.9"}
    assert imds.request("/latest/api/token", "PUT", proxied).status == 403
    assert imds.request("/latest/api/token").status == 405


def test_a_token_expires_after_its_ttl(start: Callable[..., Imds]) -> None:
    imds = start()
    token = imds.token(ttl=1)
    assert imds.request("/latest/meta-data/", headers={"X-aws-ec2-metadata-token": token}).status == 200
    time.sleep(1.2)
    assert imds.request("/latest/meta-data/", headers={"X-aws-ec2-metadata-token": token}).status == 401


def reply_ttls(sniffer: socket.socket, port: int) -> list[tuple[bytes, int]]:
    """(first line, IP TTL) of each HTTP answer the stand-in at `port` sent, read off loopback."""
    found = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            frame, address = sniffer.recvfrom(65535)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        if address[2] == socket.PACKET_OUTGOING:  # loopback shows each packet leaving, then arriving
            continue
        ip = frame[14:]  # lo's frames carry an Ethernet header
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != socket.IPPROTO_TCP:
            continue
        tcp = ip[(ip[0] & 0xF) * 4:]
        payload = tcp[(tcp[12] >> 4) * 4:]
        if int.from_bytes(tcp[0:2], "big") == port and payload.startswith(b"HTTP/1.1 "):
            found.append((payload.split(b"\r\n", 1)[0], ip[8]))
            if len(found) == 2:
                break
    return found


def test_the_token_answer_leaves_with_the_hop_limit_as_its_ttl(start: Callable[..., Imds]) -> None:
    try:
        sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    except (PermissionError, AttributeError):
        pytest.skip("reading loopback's packets needs CAP_NET_RAW (Linux)")
    with sniffer:
        # Read only after the requests: a buffer that holds everything loopback carries meanwhile (other tests
        # run beside this one), or the two answers are dropped before they are read. SO_RCVBUFFORCE: root's.
        sniffer.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
        sniffer.bind(("lo", 0))
        sniffer.setblocking(False)
        imds = start(facts(metadata_options={"http_put_response_hop_limit": 3}))
        port = int(imds.url.rsplit(":", 1)[1])
        # One keep-alive connection: the token's answer, then a GET's, which leaves with the default TTL again.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("PUT", "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        token = connection.getresponse().read().decode()
        connection.request("GET", "/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token})
        assert connection.getresponse().read() == b"i-0a1b2c3d4e5f60718"
        connection.close()
        ttls = reply_ttls(sniffer, port)
    assert ttls[0] == (b"HTTP/1.1 200 OK", 3)
    assert ttls[1][1] > 3


def test_a_disabled_endpoint_refuses_everything(start: Callable[..., Imds]) -> None:
    imds = start(facts(metadata_options={"http_endpoint": "disabled", "http_tokens": "optional"}))
    assert imds.request("/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}).status == 403
    assert imds.request("/latest/meta-data/instance-id").status == 403


# --- the tree ----------------------------------------------------------------------------------------------------


def test_listings_mark_directories_with_a_slash_and_end_without_a_newline(start: Callable[..., Imds]) -> None:
    imds = start()
    listing = imds.get("/latest/meta-data/").text
    entries = listing.split("\n")
    assert not listing.endswith("\n") and entries == sorted(entries)
    for directory in ("block-device-mapping/", "iam/", "network/", "placement/", "public-keys/", "services/"):
        assert directory in entries
    for leaf in ("ami-id", "ami-launch-index", "hostname", "instance-id", "instance-type", "local-ipv4", "mac",
                 "profile", "reservation-id", "security-groups"):
        assert leaf in entries
    assert imds.get("/latest/meta-data").text == listing  # a directory without its slash is listed too
    assert imds.get("/latest/meta-data/placement/availability-zone/").text == "us-east-2b"  # botocore's form
    assert imds.get(f"/latest/meta-data/network/interfaces/macs/{MAC}/vpc-ipv4-cidr-blocks").text == \
        "10.77.0.0/16\n10.78.0.0/16"
    assert imds.get("/latest/meta-data/iam/security-credentials/").text == "fm-node-role"
    assert imds.get("/latest/dynamic/").text == "instance-identity/"
    assert imds.get("/latest/").text.split("\n") == ["dynamic", "meta-data", "user-data"]


def test_public_keys_list_index_and_name(start: Callable[..., Imds]) -> None:
    imds = start()
    assert imds.get("/latest/meta-data/public-keys/").text == "0=operator"
    assert imds.get("/latest/meta-data/public-keys/0/").text == "openssh-key"
    assert imds.get("/latest/meta-data/public-keys/0/openssh-key").text == \
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample operator"


def test_dated_versions_serve_the_same_tree_and_the_root_lists_them(start: Callable[..., Imds]) -> None:
    imds = start()
    for version in ("2021-03-23", "2018-09-24", "2016-09-02", "2009-04-04"):
        assert imds.get(f"/{version}/meta-data/instance-id").text == "i-0a1b2c3d4e5f60718"
        assert version in imds.get("/").text.split("\n")
    assert imds.get("/latest/meta-data/no-such-thing").status == 404
    missing = imds.get("/not-a-version/meta-data/")
    assert missing.status == 404 and b"<title>404 - Not Found</title>" in missing.body


def test_the_whole_tree_crawls_as_cloud_init_crawls_it(start: Callable[..., Imds]) -> None:
    imds = start()
    token = imds.token()
    meta = crawl(imds, "/2021-03-23/meta-data/", token)
    assert meta["instance-id"] == "i-0a1b2c3d4e5f60718" and meta["local-hostname"].startswith("ip-10-77-128-4")
    assert meta["public-keys"] == {"operator": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample operator"}
    assert meta["security-groups"] == ["compute", "efa"]
    assert meta["placement"] == {"availability-zone": "us-east-2b", "availability-zone-id": "use2-az2",
                                 "region": "us-east-2"}
    assert meta["services"] == {"domain": "amazonaws.com", "partition": "aws"}
    assert meta["block-device-mapping"] == {"ami": "/dev/xvda", "root": "/dev/xvda"}
    nic = meta["network"]["interfaces"]["macs"][MAC]
    assert nic["vpc-id"] == "vpc-0abc" and nic["security-group-ids"] == ["sg-01", "sg-02"]
    assert nic["local-ipv4s"] == "10.77.128.4" and nic["device-number"] == "0"
    assert set(meta["iam"]) == {"info"}  # the credentials are never crawled
    assert meta["iam"]["info"] == {"Code": "Success", "LastUpdated": meta["iam"]["info"]["LastUpdated"],
                                   "InstanceProfileArn": "arn:aws:iam::123456789012:instance-profile/fm-node",
                                   "InstanceProfileId": "AIPAEXAMPLE"}
    # cloud-init asks for the identity without a trailing slash, then reads what is listed.
    identity = crawl(imds, "/2021-03-23/dynamic/instance-identity", token)
    assert set(identity) == {"document"}
    document = identity["document"]
    assert (document["instanceId"], document["region"], document["availabilityZone"], document["accountId"],
            document["privateIp"], document["version"], document["pendingTime"]) == \
        ("i-0a1b2c3d4e5f60718", "us-east-2", "us-east-2b", "123456789012", "10.77.128.4", "2017-09-30",
         "2025-06-01T12:00:00Z")
    user_data = imds.get("/2021-03-23/user-data")
    assert user_data.body == b"#cloud-config\nruncmd: [true]\n"
    assert user_data.headers["Content-Type"] == "application/octet-stream" and user_data.headers["Server"] == "EC2ws"


def test_no_profile_no_iam_and_no_user_data_no_user_data(start: Callable[..., Imds]) -> None:
    config = facts(user_data=None)
    del config["instance_profile"], config["credentials"]
    imds = start(config)
    assert imds.get("/latest/meta-data/iam/").status == 404
    assert imds.get("/latest/meta-data/iam/security-credentials/").status == 404
    assert "iam/" not in imds.get("/latest/meta-data/").text.split("\n")
    assert imds.get("/latest/user-data").status == 404
    assert imds.get("/latest/").text.split("\n") == ["dynamic", "meta-data"]
    fetcher = InstanceMetadataFetcher(base_url=imds.url, timeout=2, num_attempts=1, env={})
    assert fetcher.retrieve_iam_role_credentials() == {}


def test_a_config_wrong_from_the_start_stops_it_with_the_reason(tmp_path: Path) -> None:
    config = deepcopy(facts())
    config["metadata_options"]["http_tokens"] = "sometimes"
    path = tmp_path / "imds.json"
    path.write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-I", str(SCRIPT), "--config", str(path), "--address", "127.0.0.1",
                           "--port", str(free_port())], capture_output=True, text=True, timeout=10)
    assert done.returncode == 1 and "http_tokens" in done.stderr
