"""roles/slurm_containers' ECR token refresher (files/fmcluster-ecr-login, run as root by fmcluster-ecr-login.service)
against moto's ECR: the token GetAuthorizationToken answers, written as the containers-auth.json file skopeo reads
(`{"auths": {"<registry>": {"auth": base64("AWS:<password>")}}}`), for the tenant's ECR registries only (as the deploy
split them, fmcluster.containers.ecr_registries), 0644 and atomically; a failure leaves the file as it was. And the
role installs the refresher where the registries are ECR only: its expressions and templates rendered by Ansible's
Templar (the converge itself: tests/test_slurm_containers_role.py)."""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import json
import stat
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest
import yaml
from moto import mock_aws

from conftest import ROOT
from fmcluster.containers import ecr_registries
from role_helpers import trusted

ROLE = ROOT / "roles" / "slurm_containers"
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
ECR_WEST = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
LOCAL = "10.77.128.1:5000"


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("fmcluster_ecr_login", str(ROLE / "files" / "fmcluster-ecr-login"))
    spec = importlib.util.spec_from_loader("fmcluster_ecr_login", loader)
    assert spec
    module = importlib.util.module_from_spec(spec)
    sys.modules["fmcluster_ecr_login"] = module
    loader.exec_module(module)
    return module


login = _load()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


def settings(tmp_path: Path, path: Path, ecr: Any) -> str:
    """fmcluster-container's settings, which the refresher reads: where the tokens go and the ECR registries."""
    conf = tmp_path / "containers.json"
    conf.write_text(json.dumps({"registries": [LOCAL, ECR, ECR_WEST], "authfile": str(path), "ecr_registries": ecr}))
    return str(conf)


def test_the_deploy_splits_the_ecr_registries_with_their_regions_and_leaves_the_others() -> None:
    assert ecr_registries([LOCAL, ECR, ECR_WEST, f"{ECR}.evil.example"]) == [
        {"host": ECR, "region": "us-east-1"}, {"host": ECR_WEST, "region": "eu-west-1"}]


def test_the_refresher_writes_ecrs_token_for_the_tenants_registries_only(aws: Any, tmp_path: Path) -> None:
    path = tmp_path / "fmcluster" / "ecr-auth.json"
    assert login.main([settings(tmp_path, path, ecr_registries([LOCAL, ECR, ECR_WEST]))]) == 0
    written = json.loads(path.read_text())
    assert sorted(written) == ["auths"] and sorted(written["auths"]) == sorted([ECR, ECR_WEST])
    expected = boto3.client("ecr", region_name="us-east-1").get_authorization_token()["authorizationData"][0]
    for host in (ECR, ECR_WEST):
        auth = written["auths"][host]["auth"]
        user, _, password = base64.b64decode(auth, validate=True).decode().partition(":")
        assert user == "AWS" and password, host  # what skopeo sends as basic auth: AWS:<password>
    assert written["auths"][ECR]["auth"] == expected["authorizationToken"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # users' fmcluster-container reads it
    assert [p.name for p in path.parent.iterdir()] == ["ecr-auth.json"], "no temporary file left beside it"


def test_a_failed_refresh_leaves_the_file_as_it_was_and_exits_1(aws: Any, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ecr-auth.json"
    path.write_text('{"auths": {"old": {"auth": "x"}}}')
    for broken, says in (([{"host": ECR}], "no authfile and ecr_registries"), ([], "ecr_registries is empty")):
        assert login.main([settings(tmp_path, path, broken)]) == 1  # no registry and region: nothing asked or written
        assert says in capsys.readouterr().err

    class Broken:
        def get_authorization_token(self) -> dict[str, Any]:
            return {"authorizationData": [{"authorizationToken": base64.b64encode(b"nobody:").decode()}]}

    conf = settings(tmp_path, path, ecr_registries([ECR]))
    assert login.main([conf], client_for=lambda region: Broken()) == 1
    assert "not AWS:<password>" in capsys.readouterr().err
    assert path.read_text() == '{"auths": {"old": {"auth": "x"}}}'
    assert login.main([conf, ECR]) == 64


# --- the role: where it installs the refresher -----------------------------------------------------------------


def _template(variables: dict[str, Any], text: str) -> Any:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=trusted(variables))
    return templar.template(trust_as_template(text))


def _role_vars(registries: list[str], insecure: list[str], **registered: Any) -> dict[str, Any]:
    """The role's variables as the manifest gives them (fmcluster.containers), on a first converge unless
    `registered` says what changed."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    return {**defaults, "slurm_containers_registries": registries, "slurm_containers_insecure_registries": insecure,
            "slurm_containers_ecr_registries": ecr_registries(registries),
            "ansible_check_mode": False, "slurm_containers_ecr_units": {"changed": False},
            "slurm_containers_ecr_program": {"changed": False}, "slurm_containers_settings": {"changed": False},
            "slurm_containers_ecr_tokens": {"stat": {"exists": False}}, **registered}


def _when(variables: dict[str, Any], name: str) -> Any:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    task = next(t for t in tasks if t["name"] == name)
    return _template(variables, "{{ %s }}" % task["when"])


@pytest.mark.parametrize(("registries", "insecure", "ecr"), [
    ([ECR], [], True), ([ECR, ECR_WEST], [], True), ([LOCAL], [LOCAL], False)])
def test_the_role_installs_the_refresher_for_ecr_registries_only(registries: list[str], insecure: list[str],
                                                                 ecr: bool) -> None:
    variables = _role_vars(registries, insecure)
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    gated = [t for t in tasks if "fmcluster-ecr-login" in json.dumps(t)]
    assert gated, "the role has refresher tasks"
    for task in gated:
        assert _template(variables, "{{ %s }}" % task["when"]) == ecr, task["name"]
    settings = json.loads(str(_template(variables, (ROLE / "templates" / "containers.json.j2").read_text())))
    assert settings["authfile"] == "/etc/fmcluster/ecr-auth.json"
    assert settings["ecr_registries"] == ecr_registries(registries)  # the refresher's and fmcluster-container's
    check = next(t for t in tasks if t["name"] == "Check the tenant's registries")["ansible.builtin.assert"]["that"]
    assert all(_template(variables, "{{ %s }}" % that) for that in check)
    foreign = {**variables, "slurm_containers_ecr_registries": ecr_registries([ECR.replace("123", "210")])}
    assert not _template(foreign, "{{ %s }}" % check[-1]), "an ECR registry the node does not pull from is refused"


def test_the_tokens_are_got_again_at_converge_only_when_what_the_refresher_runs_with_changed() -> None:
    settled = {"slurm_containers_ecr_tokens": {"stat": {"exists": True}}}
    assert _when(_role_vars([ECR], [], **settled), "Get the ECR tokens now") is False  # idempotent
    for changed in ("slurm_containers_settings", "slurm_containers_ecr_units", "slurm_containers_ecr_program"):
        variables = _role_vars([ECR], [], **settled, **{changed: {"changed": True}})
        assert _when(variables, "Get the ECR tokens now") is True, changed


def test_the_refresher_units_run_it_as_root_at_boot_and_every_6_hours_for_the_tenants_ecr() -> None:
    variables = _role_vars([ECR, ECR_WEST], [])
    service = str(_template(variables, (ROLE / "templates" / "fmcluster-ecr-login.service.j2").read_text()))
    timer = str(_template(variables, (ROLE / "templates" / "fmcluster-ecr-login.timer.j2").read_text()))
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    assert exec_start == ("ExecStart=/opt/fmcluster/venv/bin/python3 /usr/local/sbin/fmcluster-ecr-login "
                          "/etc/fmcluster/containers.json")
    assert "Type=oneshot" in service and "User=" not in service  # root: IMDS is root's only (roles/imds_guard)
    assert "OnBootSec=" in timer and "OnUnitActiveSec=6h" in timer and "Unit=fmcluster-ecr-login.service" in timer
