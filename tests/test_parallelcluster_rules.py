"""Tenant values AWS ParallelCluster refuses are refused by `invoke validate` before anything runs, each naming the
tenant key, its line and the fix (fmcluster's own checks: no tool environment needed, nothing rendered yet)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from fmcluster import commands
from fmcluster.exits import ExitCode
from fmcluster.schedulers.parallelcluster.settings import settings_of

ROOT = Path(__file__).resolve().parent.parent
PCLAB = yaml.safe_load((ROOT / "inventories/pclab/group_vars/all/tenant.yml").read_text())
SPEC_REL = "inventories/acme/group_vars/all/tenant.yml"
Change = Callable[[dict[str, Any]], None]


def spec_with(change: Change) -> str:
    doc = copy.deepcopy(PCLAB)
    doc["tenant"]["org"] = "acme"
    change(doc["tenant"])
    return yaml.safe_dump(doc, sort_keys=False)


def validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> tuple[int, str]:
    spec = tmp_path / SPEC_REL
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(text)
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    lines: list[str] = []
    return commands.validate("acme", out=lines.append), "\n".join(lines)


def queue0(**values: Any) -> Change:
    return lambda t: t["queues"][0].update(values)


def cpu_queues(n: int) -> Change:
    return lambda t: t.update(queues=[{"name": f"q{i}", "instance_type": "c5.2xlarge", "count": 1} for i in range(n)])


def accounting(**values: Any) -> Change:
    return lambda t: t["parallelcluster"]["accounting"].update(values)


# (case id, change to the bundled parallelcluster tenant, key named, fragments of the message)
REFUSED: list[tuple[str, Change, str, list[str]]] = [
    ("queue-name-longer-than-25", queue0(name="gpu-h100-pretraining-large"), "tenant.queues[0].name",
     ["26 characters", "at most 25"]),
    ("queue-named-default", queue0(name="default"), "tenant.queues[0].name", ["forbids the queue name 'default'"]),
    ("queue-name-uppercase", queue0(name="GPU"), "tenant.queues[0].name", ["not a valid partition name"]),
    ("more-queues-than-parallelcluster-allows", cpu_queues(51), "tenant.queues",
     ["51 queues", "at most 50 Slurm queues", "50 compute resources"]),
    ("efa-on-a-type-without-it", lambda t: t["queues"][1].update(efa=True), "tenant.queues[1].efa",
     ["m5.8xlarge has no EFA interface", "p5.48xlarge"]),
    ("efa-off-on-p5", queue0(efa=False), "tenant.queues[0].efa", ["p5.48xlarge has 32 EFA interfaces"]),
    ("capacity-reservation-id-malformed", queue0(capacity_reservation_id="cb-123"), "tenant.queues[0].capacity_reservation_id",
     ["'cb-123' has the wrong form"]),
    ("os-not-debian-family", lambda t: t["parallelcluster"].update(os="alinux2023"), "tenant.parallelcluster.os",
     ["'alinux2023' is not allowed", "ubuntu2204"]),
    ("os-without-an-image-contract", lambda t: t["parallelcluster"].update(os="ubuntu2404"), "tenant.parallelcluster.os",
     ["no contract for ParallelCluster's 'ubuntu2404' AMI", "use ubuntu2204", "parallelcluster-ubuntu2404",
      "src/fmcluster/schedulers/parallelcluster/images.yml"]),
    ("ssh-key-name-with-newline", lambda t: t["parallelcluster"].update(ssh_key_name="key\nName: x"),
     "tenant.parallelcluster.ssh_key_name", ["contains a control character"]),
    ("accounting-secret-not-secretsmanager", accounting(password_secret_arn="arn:aws:ssm:us-east-1:123456789012:parameter/x"),
     "tenant.parallelcluster.accounting.password_secret_arn", ["has the wrong form"]),
    ("accounting-secret-in-another-region",
     accounting(password_secret_arn="arn:aws:secretsmanager:eu-west-1:123456789012:secret:fmcluster/acme/db-AbC"),
     "tenant.parallelcluster.accounting.password_secret_arn", ["the secret is in eu-west-1, the cluster in us-east-1"]),
    ("accounting-uri-with-scheme", accounting(uri="mysql://db:3306"), "tenant.parallelcluster.accounting.uri",
     ["has the wrong form"]),
    ("accounting-uri-without-its-secret", accounting(uri="slurmdb.example.internal:3306"),
     "tenant.parallelcluster.accounting.uri", ["uri without password_secret_arn", "remove uri to have fmcluster create"]),
    ("accounting-created-database-user-too-long", accounting(user_name="slurm_accounting_user"),
     "tenant.parallelcluster.accounting.user_name", ["cannot be the master user of the database fmcluster creates"]),
    ("lustre-on-a-directory-parallelcluster-reserves", lambda t: t["storage"]["lustre"].update(mount_point="/opt/slurm"),
     "tenant.storage.lustre.mount_point", ["'/opt/slurm' is reserved by AWS ParallelCluster"]),
    ("home-on-a-directory-parallelcluster-reserves", lambda t: t["storage"]["openzfs"].update(mount_point="/opt/parallelcluster/"),
     "tenant.storage.openzfs.mount_point", ["reserved by AWS ParallelCluster"]),
    ("programme-not-a-tag-value", lambda t: t.update(programme="geniac\n- evil: {x}"), "tenant.programme",
     ["contains a control character"]),
    ("unknown-key-in-parallelcluster-section", lambda t: t["parallelcluster"].update(KeyName="k"),
     "tenant.parallelcluster.KeyName", ["unknown key 'KeyName'", "ssh_key_name"]),
]


@pytest.mark.parametrize("case_id,change,key,fragments", REFUSED, ids=[c[0] for c in REFUSED])
def test_parallelcluster_refusal_names_the_tenant_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case_id: str,
                                                      change: Change, key: str, fragments: list[str]) -> None:
    code, output = validate(tmp_path, monkeypatch, spec_with(change))
    assert code == ExitCode.INVALID, output
    assert f"{SPEC_REL}:" in output and f" {key}:" in output, output
    assert "fix:" in output and "nothing was deployed" in output
    for fragment in fragments:
        assert fragment in output, f"{case_id}: {fragment!r} not in\n{output}"


def test_there_are_at_least_ten_refused_parallelcluster_inputs() -> None:
    assert len({case for case, *_ in REFUSED}) >= 10


def test_the_refusal_points_at_the_line_of_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = spec_with(queue0(name="default"))
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "name: default" in row)
    _, output = validate(tmp_path, monkeypatch, text)
    assert f"{SPEC_REL}:{line}: tenant.queues[0].name:" in output


def test_capacity_block_rules_apply_once_the_queue_key_exists() -> None:
    """`capacity_reservation_type` arrives with another change; the rules read the raw spec, so they hold then."""
    from fmcluster.schedulers.parallelcluster.rules import check_tenant

    found: list[tuple[tuple[str | int, ...], str]] = []
    check_tenant({"queues": [{"name": "cpu", "instance_type": "c5.2xlarge", "count": 1,
                              "capacity_reservation_type": "capacity-block"}]},
                 lambda path, message, fix: found.append((path, message)))
    assert [m for _, m in found] == ["c5.2xlarge is not sold as EC2 Capacity Blocks for ML",
                                     "a Capacity Block queue needs the reservation it launches into"]
    assert {p for p, _ in found} == {("tenant", "queues", 0, "capacity_reservation_type")}


def test_a_valid_parallelcluster_tenant_passes_fmclusters_own_checks() -> None:
    from fmcluster.model import load_tenant

    tenant = load_tenant("pclab", ROOT)
    settings = settings_of(tenant)
    assert settings is not None and settings.os == "ubuntu2204"
    assert settings.accounting is not None and settings.accounting.user_name == "slurm"


def test_new_tenant_scaffolds_a_parallelcluster_tenant(tmp_path: Path) -> None:
    from fmcluster.schedulers.parallelcluster.config import render_cluster_config
    from fmcluster.scaffold import new_tenant

    tenant = new_tenant("acme", {"scheduler": "parallelcluster", "instance_type": "p4d.24xlarge", "count": "2",
                                 "region": "us-east-1", "availability_zone": "us-east-1a"}, output_dir=tmp_path)
    assert tenant.scheduler == "parallelcluster" and settings_of(tenant) is not None
    cfg = render_cluster_config(tenant)
    assert cfg.data["Scheduling"]["SlurmQueues"][0]["ComputeResources"][0]["InstanceType"] == "p4d.24xlarge"
    other = new_tenant("other", {}, output_dir=tmp_path)
    assert other.scheduler == "slurm-ec2" and "parallelcluster" not in other.spec_path.read_text()
