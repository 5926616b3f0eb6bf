"""The health data files are complete and consistent with the program, the roles, the alerts and the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from fmcluster.health import data, docs
from fmcluster.health.checks import REGISTRY
from fmcluster.health.model import ACTIONS, CONTEXTS, FACTS
from fmcluster.model import load_tenant
from localtenant import manifest_for

CHECKS = data.checks_doc()
XIDS = data.xid_doc()


def test_every_check_is_complete_and_unique() -> None:
    names = [c["name"] for c in CHECKS["checks"]]
    assert len(names) == len(set(names))
    for check in CHECKS["checks"]:
        assert check["scope"] in ("node", "cluster"), check
        assert set(check["contexts"]) <= set(CONTEXTS) and check["contexts"], check
        assert set(check.get("when") or []) <= set(FACTS), check
        assert check["on_failure"] in (*ACTIONS[1:], "per xid"), check
        assert check["source"] in CHECKS["sources"], check
        assert "http" in CHECKS["sources"][check["source"]]


def test_every_node_check_in_the_data_has_a_function_and_every_function_a_row() -> None:
    node_checks = {c["name"] for c in CHECKS["checks"] if c["scope"] == "node"}
    assert node_checks == set(REGISTRY)


def test_the_xid_table_has_one_sourced_row_per_xid() -> None:
    xids = [row["xid"] for row in XIDS["xids"]]
    assert len(xids) == len(set(xids)) and xids == sorted(xids)
    for row in XIDS["xids"]:
        assert row["action"] in ACTIONS and row["source"] in XIDS["sources"] and row["why"], row
    assert XIDS["unknown_action"] in ACTIONS[1:]


def test_the_brief_s_two_examples() -> None:
    actions = {row["xid"]: row["action"] for row in XIDS["xids"]}
    assert (actions[79], actions[13]) == ("replace", "none")


def test_the_application_xids_the_alerts_ignore_need_no_action_here_either() -> None:
    rules = yaml.safe_load((ROOT / "roles/prometheus/files/rules/fmcluster-alerts.yml").read_text())["groups"]
    expr = next(r["expr"] for g in rules for r in g["rules"] if r.get("alert") == "GpuXidError")
    ignored = {int(x) for x in re.search(r'xid!~"([0-9|]+)"', expr).group(1).split("|")} - {0}  # type: ignore[union-attr]
    actions = {row["xid"]: row["action"] for row in XIDS["xids"]}
    application = {13, 31, 43, 45}
    assert application <= ignored and {actions[x] for x in application} == {"none"}


def test_triage_knows_every_external_reason_it_may_meet() -> None:
    matches = [r["match"] for r in CHECKS["external_reasons"]]
    assert "Not responding" in matches and "fmcluster acceptance" in matches
    assert all(r["action"] in ACTIONS and r["source"] in CHECKS["sources"] for r in CHECKS["external_reasons"])


def test_docs_health_md_lists_every_check_from_the_data_file() -> None:
    page = (ROOT / "docs" / "health.md").read_text()
    assert docs.render_page(page) == page, "run: .venv/bin/python -m fmcluster.health.docs"
    for check in CHECKS["checks"]:
        assert f"| `{check['name']}` |" in page


def test_the_role_defaults_are_what_the_python_config_builder_assumes() -> None:
    defaults = yaml.safe_load((ROOT / "roles/node_health/defaults/main.yml").read_text())
    assert defaults["node_health_disk"] == [dict(d) for d in data.DEFAULT_DISK]
    assert defaults["node_health_timeouts"] == data.DEFAULT_TIMEOUTS


def test_an_aws_tenant_checks_its_lustre_and_openzfs_mounts_and_reports_on_lustre() -> None:
    values = manifest_for(load_tenant("stockmark"), {"LustreDnsName": "fs-1.fsx.aws", "LustreMountName": "abc",
                                                     "HomeDnsName": "fs-2.fsx.aws"})["vars"]
    assert values["node_health_mounts"] == [{"path": "/fsx", "fstype": "lustre"}, {"path": "/home", "fstype": "nfs4"}]
    assert (values["node_health_report_dir"], values["node_health_report_requires_mount"]) == (
        "/fsx/.fmcluster/health/reports", "/fsx")
    assert values["slurm_health_check_program"] == "/opt/fmcluster/health/bin/fmcluster-health-slurmd"
    assert values["slurm_health_check_interval"] == values["node_health_interval"] == 300


def test_a_file_system_the_stacks_did_not_create_is_checked_as_mounted_of_any_type() -> None:
    # The local substrate binds a shared directory at the mount point (the emulator makes no FSx).
    values = manifest_for(load_tenant("demo"))["vars"]
    assert values["node_health_mounts"] == [{"path": "/fsx", "fstype": ""}]
    assert values["node_health_report_requires_mount"] == "/fsx"
    assert values["slurm_health_check_interval"] == values["node_health_interval"] == 30


@pytest.mark.parametrize("org, expected", [
    ("demo", {"slurm_accounting": True}),
    ("stockmark", {"slurm_accounting": True, "slurm_accounting_storage_user": "slurm"}),
])
def test_accounting_is_on_by_default_with_a_password_generated_on_the_controller(org: str, expected: dict) -> None:
    manifest = manifest_for(load_tenant(org))
    assert expected.items() <= manifest["vars"].items()
    assert "slurm_accounting_storage_pass_generate" not in manifest["vars"]  # the role's default: true
    assert "slurmdbd-storage-password" not in manifest["secrets"]


def _tenant_with(tmp_path: Path, org: str, base: str, accounting_section: dict) -> Path:
    spec = yaml.safe_load((ROOT / "inventories" / base / "group_vars" / "all" / "tenant.yml").read_text())
    spec["tenant"]["org"] = org
    spec["tenant"]["accounting"] = accounting_section
    path = tmp_path / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(spec))
    return path


def test_an_rds_endpoint_the_tenant_names_is_used_as_it_is_with_its_secret(tmp_path: Path) -> None:
    from fmcluster.model import load_spec

    path = _tenant_with(tmp_path, "rdsorg", "stockmark",
                        {"database_endpoint": "acct.cluster-c1a2b3.ap-northeast-1.rds.amazonaws.com:3307"})
    manifest = manifest_for(load_spec(path))
    values = manifest["vars"]
    assert values["slurm_accounting_database"] == "external"
    assert (values["slurm_accounting_storage_host"], values["slurm_accounting_storage_port"]) == (
        "acct.cluster-c1a2b3.ap-northeast-1.rds.amazonaws.com", 3307)
    assert values["slurm_accounting_storage_pass_generate"] is False
    assert values["slurm_accounting_storage_pass_secret"] == "fmcluster/rdsorg/slurmdbd-storage-password"
    # The node agent writes it on the controller only, where the role reads it.
    assert manifest["secrets"]["slurmdbd-storage-password"] == {"id": "fmcluster/rdsorg/slurmdbd-storage-password",
                                                               "roles": ["controller"]}
    assert values["slurm_accounting_storage_pass_file"] == "/etc/fmcluster/secrets/slurmdbd-storage-password"
    assert not any("pass" in k and isinstance(v, str) and len(v) > 20 and "/" not in v for k, v in values.items())


def test_accounting_can_be_switched_off(tmp_path: Path) -> None:
    from fmcluster.model import load_spec

    values = manifest_for(load_spec(_tenant_with(tmp_path, "noacct", "stockmark", {"enabled": False})))["vars"]
    assert values["slurm_accounting"] is False
    assert not [k for k in values if k.startswith("slurm_accounting_")]


@pytest.mark.parametrize("section, words", [
    ({"database_endpoint": "db.example.org"}, "provider local cannot reach a database endpoint"),
    ({"database_endpoint": "db.example.org; DROP TABLE"}, "has the wrong form"),
    ({"database_user": "slurm'--"}, "has the wrong form"),
])
def test_bad_accounting_settings_are_refused_with_the_key_named(tmp_path: Path, section: dict, words: str) -> None:
    from fmcluster.model import TenantInvalid, load_spec

    with pytest.raises(TenantInvalid) as err:
        load_spec(_tenant_with(tmp_path, "badacct", "demo", section))
    text = err.value.render()
    assert "tenant.accounting." in text and words in text
