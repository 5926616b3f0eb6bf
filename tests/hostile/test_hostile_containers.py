"""Hostile `containers.registries` (issue 39): a tenant's nodes pull images only from the tenant's own registries. The
provider gives one (on AWS the account's ECR in the region, from the storage stack's output; locally the VPC's
registry on the router address); the spec may add ECR registries of the same account. Anything else (a public
registry, another organization's, a URL, a port, shell or template characters, a second account, any registry on the
local provider) is refused by `invoke validate` with the file, the line, the key and a fix; another account than the
one the stacks are in is refused when the manifest is built, where the account is known."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fmcluster.containers import ForeignRegistry
from fmcluster.model import load_tenant
from hostile_helpers import HOSTILE, assert_refused, spec_text, validate, write_tenant
from localtenant import manifest_for

Change = Callable[[dict[str, Any]], Any]
KEY = "tenant.containers.registries"
OWN = "123456789012.dkr.ecr.ap-northeast-1.amazonaws.com"
FIX_ECR = "push the image to your account's ECR and list it as ACCOUNT.dkr.ecr.REGION.amazonaws.com"


def registries(*hosts: str) -> Change:
    def change(t: dict[str, Any]) -> None:
        t["containers"] = {"registries": list(hosts)}
    return change


REFUSED: list[tuple[str, str, Change, str, tuple[str, ...]]] = [
    ("docker-hub", "stockmark", registries("docker.io"), f"{KEY}[0]",
     ("'docker.io' is not an ECR registry of the tenant's account", FIX_ECR)),
    ("ghcr", "stockmark", registries(OWN, "ghcr.io"), f"{KEY}[1]", ("'ghcr.io' is not an ECR registry",)),
    ("public-ecr", "stockmark", registries("public.ecr.aws"), f"{KEY}[0]", ("is not an ECR registry",)),
    ("a-url", "stockmark", registries(f"https://{OWN}"), f"{KEY}[0]", ("is not an ECR registry",)),
    ("a-port", "stockmark", registries(f"{OWN}:443"), f"{KEY}[0]", ("is not an ECR registry",)),
    ("a-path", "stockmark", registries(f"{OWN}/team"), f"{KEY}[0]", ("is not an ECR registry",)),
    ("lookalike-host", "stockmark", registries("123456789012.dkr.ecr.ap-northeast-1.amazonaws.com.evil.example"),
     f"{KEY}[0]", ("is not an ECR registry",)),
    ("short-account", "stockmark", registries("12345.dkr.ecr.ap-northeast-1.amazonaws.com"), f"{KEY}[0]",
     ("is not an ECR registry",)),
    ("unknown-region", "stockmark", registries("123456789012.dkr.ecr.ap-northeast-9.amazonaws.com"), f"{KEY}[0]",
     ("names 'ap-northeast-9', not a known AWS region",)),
    ("two-accounts", "stockmark", registries(OWN, "210987654321.dkr.ecr.us-east-1.amazonaws.com"), f"{KEY}[1]",
     ("is of account 210987654321, another than containers.registries[0]'s",
      "list only your account's ECR registries")),
    ("any-registry-on-local", "demo", registries(OWN), f"{KEY}[0]",
     ("provider local's nodes reach only the VPC's container registry",
      "remove containers.registries and push images to the VPC's registry")),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_registry_outside_the_tenant_s_own_is_refused_with_file_line_key_and_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, str, Change, str, tuple[str, ...]]) -> None:
    _, base, change, key, fragments = case
    write_tenant(tmp_path, spec_text(change, base=base))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, key, fragments)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_registry_is_refused_never_rendered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile: str) -> None:
    for host in (f"{OWN}{hostile}", f"123456789012{hostile}.dkr.ecr.ap-northeast-1.amazonaws.com"):
        write_tenant(tmp_path, spec_text(registries(host), base="stockmark"))
        code, output = validate(tmp_path, monkeypatch)
        assert code == 2 and "Traceback" not in output, output


def test_the_tenant_s_own_ecr_registries_are_accepted_and_reach_the_nodes_after_the_provider_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other_region = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    write_tenant(tmp_path, spec_text(registries(OWN, other_region), base="stockmark"))
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output
    variables = manifest_for(load_tenant("acme", tmp_path), {"ContainerRegistry": OWN})["vars"]
    assert variables["slurm_containers_registries"] == [OWN, other_region]
    assert variables["slurm_containers_insecure_registries"] == []
    assert variables["slurm_containers_ecr_registries"] == [{"host": OWN, "region": "ap-northeast-1"},
                                                            {"host": other_region, "region": "us-east-1"}]
    assert variables["fmcluster_containers"] is True


def test_another_account_than_the_stacks_is_refused_when_the_manifest_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline the account is not known; the deploy reads it from the storage stack's ContainerRegistry output."""
    write_tenant(tmp_path, spec_text(registries(OWN), base="stockmark"))
    assert validate(tmp_path, monkeypatch)[0] == 0
    tenant = load_tenant("acme", tmp_path)
    with pytest.raises(ForeignRegistry) as refused:
        manifest_for(tenant, {"ContainerRegistry": "210987654321.dkr.ecr.ap-northeast-1.amazonaws.com"})
    message = str(refused.value)
    assert message.startswith("inventories/acme/group_vars/all/tenant.yml: containers.registries[0]: ")
    assert "is not a registry of the tenant's account 210987654321" in message and "Fix: push the image" in message


def test_a_local_tenant_s_nodes_pull_only_from_the_vpc_s_registry_over_http(tmp_path: Path) -> None:
    demo = load_tenant("demo")
    variables = manifest_for(demo, {"ContainerRegistry": OWN})["vars"]
    # demo's VPC 10.77.0.0/16: the private subnet's router address (fmcluster.providers.local.registry).
    assert variables["slurm_containers_registries"] == ["10.77.128.1:5000"]
    assert variables["slurm_containers_insecure_registries"] == ["10.77.128.1:5000"]
    assert variables["slurm_containers_ecr_registries"] == []  # no refresher, no token asked for
    assert variables["slurm_containers_mounts"] == ["/fsx"]
    assert variables["slurm_containers_cache_dir"] == "/fsx/.fmcluster/containers"
    assert [u["name"] for u in variables["slurm_containers_users"]] == ["alice", "bob"]


def test_an_aws_tenant_without_stack_outputs_gets_no_registry_and_the_role_refuses_to_converge() -> None:
    """`invoke plan` offline: the account is not known; roles/slurm_containers asserts a registry before any change."""
    variables = manifest_for(load_tenant("stockmark"))["vars"]
    assert variables["slurm_containers_registries"] == []


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_acceptance_image_is_refused_never_rendered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile: str) -> None:
    """The image the acceptance job runs nccl-tests from (tests/acceptance/test_container_jobs.py) is pasted into a
    job script: anything but a plain reference in the tenant's registry is refused with the key and a fix."""
    def image(text: str) -> Change:
        def change(t: dict[str, Any]) -> None:
            t["acceptance"] = {**t.get("acceptance", {}), "image": text}
        return change

    for text in (f"{OWN}/nccl-tests:1{hostile}", f"{OWN}/nccl{hostile}tests:1", f"{OWN}{hostile}/nccl-tests:1"):
        write_tenant(tmp_path, spec_text(image(text), base="stockmark"))
        code, output = validate(tmp_path, monkeypatch)
        assert code == 2 and "Traceback" not in output, (text, output)
        assert "tenant.acceptance.image" in output and "\n    fix: " in output, output
