"""The capacity pre-flight (fmcluster.capacity), against the AWS emulator: a reservation of the wrong type, zone or
size, an expired Capacity Block or a too-small quota is refused by `invoke plan` and `invoke deploy` with the
tenant key and the fix, before any stack, secret or key pair exists.

moto has no capacity reservations or EC2 Service Quotas; fmcluster's emulator stands them in (emulator_server fix 9),
created here through the same EC2 calls an operator makes (CreateCapacityReservation, PurchaseCapacityBlock).
One emulator serves the module: no scenario creates anything but reservations.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from capacity_helpers import point_tenant_at, reserve
from conftest import ROOT
from fmcluster import commands
from fmcluster.exits import ExitCode
from fmcluster.capabilities import EMULATOR_APIS
from fmcluster.capacity import END_MARGIN, preflight, quota_of
from fmcluster.model import load_tenant
from fmcluster.stacks import aws
from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator
from fmcluster.providers.local.emulator_server import EMULATOR_EC2_QUOTA

pytestmark = pytest.mark.slow  # one emulator (a moto server process) for the module, ~1 s per scenario
ORG, NAMED = "stockmark", "cr-0123456789abcdef0"  # slurm-ec2, 16 × p5.48xlarge in ap-northeast-1a


class Emulated:
    def __init__(self, root: Path, endpoint: str) -> None:
        self.root, self.endpoint = root, endpoint

    def client(self, service: str) -> Any:
        return aws.client(service, "ap-northeast-1", self.endpoint)

    @property
    def spec(self) -> Path:
        return self.root / "inventories" / ORG / "group_vars" / "all" / "tenant.yml"

    def tenant_naming(self, rid: str, block: bool = False) -> Any:
        """A fresh copy of the tenant, its queue naming `rid`."""
        shutil.copy(ROOT / "inventories" / ORG / "group_vars" / "all" / "tenant.yml", self.spec)
        point_tenant_at(self.spec, NAMED, rid)
        if block:
            self.spec.write_text(self.spec.read_text().replace(
                f"capacity_reservation_id: {rid}\n",
                f"capacity_reservation_id: {rid}\n      capacity_reservation_type: capacity-block\n"))
        return load_tenant(ORG)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulated]:
    root = tmp_path_factory.mktemp("capacity")
    shutil.copytree(ROOT / "inventories" / ORG, root / "inventories" / ORG,
                    ignore=shutil.ignore_patterns("generated", "hosts.yml"))
    previous = os.environ.get("FMCLUSTER_ROOT")
    os.environ["FMCLUSTER_ROOT"] = str(root)
    emulator = ensure_emulator(ORG, root)
    try:
        yield Emulated(root, emulator.endpoint)
    finally:
        stop_emulator(ORG, root)
        os.environ["FMCLUSTER_ROOT"] = previous or str(ROOT)


def _nothing_changed(emulated: Emulated) -> None:
    assert emulated.client("cloudformation").describe_stacks()["Stacks"] == [], "no stack may exist"
    assert emulated.client("secretsmanager").list_secrets()["SecretList"] == [], "no secret may exist"
    assert emulated.client("ec2").describe_key_pairs()["KeyPairs"] == [], "no key pair may exist"


def _refused_by_plan_and_deploy(emulated: Emulated, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str], key: str, words: str) -> None:
    from fmcluster.deploy import Deploy
    from fmcluster.providers.aws import AwsProvider

    monkeypatch.setattr(commands.cluster, "_endpoint", lambda tenant, start: (emulated.endpoint, None))
    assert commands.plan(ORG) == ExitCode.INVALID
    out = capsys.readouterr().out
    assert "tenant.yml:" in out and f" {key}: " in out and words in out and "fix: " in out, out
    assert "nothing was planned or changed" in out and "rendered" not in out, "plan stops before the stacks"
    _nothing_changed(emulated)

    tenant = load_tenant(ORG)
    lines: list[str] = []
    deploy = Deploy(tenant, out=lines.append)
    provider = AwsProvider(tenant)
    monkeypatch.setattr(provider, "endpoint", lambda start, out: emulated.endpoint)
    deploy.provider = provider
    reports = deploy.run()
    assert [(r.name, r.outcome.status) for r in reports] == [("validate", "ok"), ("endpoint", "ok"),
                                                             ("capacity", "failed")], "\n".join(lines)
    assert any(key in d for d in reports[-1].outcome.details) and words in "\n".join(reports[-1].outcome.details)
    _nothing_changed(emulated)


@pytest.mark.parametrize(("instance_type", "zone", "size", "key", "words"), [
    ("p4d.24xlarge", "ap-northeast-1a", 16, "tenant.queues[0].instance_type",
     "holds p4d.24xlarge, queue gpu asks for p5.48xlarge"),
    ("p5.48xlarge", "ap-northeast-1c", 16, "tenant.availability_zone",
     "is in ap-northeast-1c, the cluster in ap-northeast-1a"),
    ("p5.48xlarge", "ap-northeast-1a", 8, "tenant.queues[0].count", "holds 8 instances, queue gpu asks for 16"),
], ids=["another-instance-type", "another-zone", "too-small"])
def test_a_reservation_that_does_not_fit_the_queue_is_refused_before_any_change(
        emulated: Emulated, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], instance_type: str,
        zone: str, size: int, key: str, words: str) -> None:
    emulated.tenant_naming(reserve(emulated.client("ec2"), instance_type, zone, size))
    _refused_by_plan_and_deploy(emulated, monkeypatch, capsys, key, words)


def test_an_expired_capacity_block_is_refused_before_any_change(
        emulated: Emulated, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    three_days_ago = datetime.now(timezone.utc) - timedelta(days=3)
    rid = reserve(emulated.client("ec2"), "p5.48xlarge", "ap-northeast-1a", 16, "capacity-block", three_days_ago, 24)
    emulated.tenant_naming(rid, block=True)
    _refused_by_plan_and_deploy(emulated, monkeypatch, capsys, "tenant.queues[0].capacity_reservation_id",
                                f"a Capacity Block for ML {rid} ended at")


def test_an_on_demand_reservation_named_as_a_capacity_block_is_refused(emulated: Emulated) -> None:
    tenant = emulated.tenant_naming(reserve(emulated.client("ec2"), "p5.48xlarge", "ap-northeast-1a", 16), block=True)
    result = preflight(tenant, emulated.client, stand_in=EMULATOR_APIS.capacity_stand_in)
    assert [p.key for p in result.refusals] == ["tenant.queues[0].capacity_reservation_type"]
    assert "set capacity_reservation_type: default" in result.refusals[0].fix


def test_a_capacity_block_ending_within_the_margin_is_refused(emulated: Emulated) -> None:
    rid = reserve(emulated.client("ec2"), "p5.48xlarge", "ap-northeast-1a", 16, "capacity-block",
                  datetime.now(timezone.utc) - timedelta(hours=23, minutes=30), 24)
    result = preflight(emulated.tenant_naming(rid, block=True), emulated.client, stand_in=EMULATOR_APIS.capacity_stand_in)
    (refusal,) = result.refusals
    assert refusal.key == "tenant.queues[0].capacity_reservation_id" and f"less than {END_MARGIN}" in refusal.message


def test_an_unknown_reservation_is_refused_with_the_command_that_lists_them(emulated: Emulated) -> None:
    result = preflight(emulated.tenant_naming("cr-0badbadbadbadbad0"), emulated.client, stand_in=EMULATOR_APIS.capacity_stand_in)
    (refusal,) = result.refusals
    assert "no capacity reservation cr-0badbadbadbadbad0 in ap-northeast-1" in refusal.message
    assert "aws ec2 describe-capacity-reservations --region ap-northeast-1" in refusal.fix


def test_a_matching_reservation_and_quota_pass_and_the_stand_in_is_said(emulated: Emulated) -> None:
    tenant = emulated.tenant_naming(reserve(emulated.client("ec2"), "p5.48xlarge", "ap-northeast-1a", 16))
    result = preflight(tenant, emulated.client, stand_in=EMULATOR_APIS.capacity_stand_in)
    assert result.ok, [p.render() for p in result.refusals]
    text = "\n".join(result.lines)
    assert "queue gpu: an On-Demand Capacity Reservation cr-" in text and "16 × p5.48xlarge in ap-northeast-1a" in text
    assert "quota Running On-Demand Standard" in text and "needs 40 (controller 1 × m5.8xlarge, login 1 × m5.2xlarge)" in text
    assert "moto has no capacity reservations or EC2 Service Quotas" in text


def test_a_quota_below_what_the_nodes_outside_reservations_need_is_refused(emulated: Emulated) -> None:
    tenant = emulated.tenant_naming(reserve(emulated.client("ec2"), "p5.48xlarge", "ap-northeast-1a", 16))
    code, _ = quota_of(tenant.controller)
    quotas = emulated.client("service-quotas")
    quotas.request_service_quota_increase(ServiceCode="ec2", QuotaCode=code, DesiredValue=32)
    try:
        result = preflight(tenant, emulated.client, stand_in=EMULATOR_APIS.capacity_stand_in)
    finally:
        quotas.request_service_quota_increase(ServiceCode="ec2", QuotaCode=code, DesiredValue=EMULATOR_EC2_QUOTA)
    (refusal,) = result.refusals
    assert f"({code}) in ap-northeast-1 is 32 vCPUs" in refusal.message and "need 40" in refusal.message
    assert f"--quota-code {code} --desired-value 40" in refusal.fix


def test_quota_codes_follow_the_instance_family() -> None:
    from fmcluster.catalog import load_catalog

    catalog = load_catalog()
    assert quota_of(catalog["p5.48xlarge"])[0] == "L-417A185B"
    assert quota_of(catalog["trn1.32xlarge"])[0] == "L-2C3B7624"
    assert quota_of(catalog["c5.2xlarge"])[0] == quota_of(catalog["m5.xlarge"])[0] == "L-1216C47A"


def test_an_active_capacity_block_yields_its_scale_in_time_one_margin_before_its_end(emulated: Emulated) -> None:
    started = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    rid = reserve(emulated.client("ec2"), "p5.48xlarge", "ap-northeast-1a", 16, "capacity-block", started, 48)
    result = preflight(emulated.tenant_naming(rid, block=True), emulated.client, stand_in=EMULATOR_APIS.capacity_stand_in)
    assert result.ok, [p.render() for p in result.refusals]
    assert result.scale_in == {"gpu": (started + timedelta(hours=48) - END_MARGIN).strftime("%Y-%m-%dT%H:%M:%SZ")}
