"""How the AWS APIs answer is the provider's capability (fmcluster.capabilities.ApiCapabilities), handed in with the
endpoint (issue 41): the clients' retries, the stacks' poll and wait, what an emulator leaves out or stands in. None
of it is guessed from whether an endpoint is set (tests/test_structure.py holds the source to that)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from scheduler_stacks import plan_stacks
from fmcluster.capabilities import AWS_APIS, EMULATOR_APIS, PROVIDERS, ApiCapabilities
from fmcluster.model import load_tenant
from fmcluster.providers.aws import AwsProvider
from fmcluster.providers.local import LocalProvider
from fmcluster.stacks import aws, changesets
from fmcluster.stacks.render import RenderedStack


def test_each_provider_hands_in_the_apis_of_its_row() -> None:
    assert AwsProvider.capabilities.apis is PROVIDERS["aws"].apis is AWS_APIS
    assert LocalProvider.capabilities.apis is PROVIDERS["local"].apis is EMULATOR_APIS
    # AWS's own APIs stand nothing in and lack nothing: what an emulator says is its row's, as data.
    assert not AWS_APIS.emulated and AWS_APIS.capacity_stand_in == AWS_APIS.image_builder_missing == ""
    assert EMULATOR_APIS.emulated and "moto has no capacity reservations" in EMULATOR_APIS.capacity_stand_in
    assert "no EC2 Image Builder" in EMULATOR_APIS.image_builder_missing


@pytest.mark.parametrize("apis", [AWS_APIS, EMULATOR_APIS], ids=["aws", "emulator"])
def test_a_client_retries_as_the_apis_handed_in_say_whatever_its_endpoint(apis: ApiCapabilities) -> None:
    for endpoint in (None, "http://127.0.0.1:9"):  # no call is made: the client's configuration is read
        retries = aws.client("sts", "ap-northeast-1", endpoint, apis).meta.config.retries
        # botocore counts the first try in total_max_attempts: `retries` after it
        assert retries == {"mode": "standard", "total_max_attempts": apis.retries + 1}
    assert aws.client("sts", "ap-northeast-1", None).meta.config.retries == {"mode": "standard"}, "botocore's own"


class _Waited(Exception):
    pass


class _StackInProgress:
    """CloudFormation as apply_stack first meets it: the stack is being updated by another run."""

    def describe_stacks(self, StackName: str) -> dict[str, Any]:  # noqa: N803 - boto3's keyword
        return {"Stacks": [{"StackName": StackName, "StackStatus": "UPDATE_IN_PROGRESS"}]}

    def describe_stack_events(self, StackName: str) -> dict[str, Any]:  # noqa: N803
        return {"StackEvents": []}


@pytest.mark.parametrize("apis", [AWS_APIS, EMULATOR_APIS, replace(AWS_APIS, stack_poll_s=1.5, stack_timeout_s=42.0)],
                         ids=["aws", "emulator", "another"])
def test_a_stack_is_polled_and_waited_for_as_the_apis_say(apis: ApiCapabilities,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[tuple[float, float]] = []

    def wait(cf: Any, name: str, since: Any, out: Any, poll_s: float, timeout_s: float, *rest: Any) -> Any:
        waited.append((poll_s, timeout_s))
        raise _Waited

    monkeypatch.setattr(changesets, "wait_for_stack", wait)
    stack = RenderedStack("network", "fmc-t-network", Path("network.py"), "Resources: {}\n")
    with pytest.raises(_Waited):
        changesets.apply_stack(_StackInProgress(), stack, {}, {}, execute=True, apis=apis, out=lambda line: None)
    assert waited == [(apis.stack_poll_s, apis.stack_timeout_s)]


def test_an_offline_plan_marks_what_the_emulator_will_not_create_only_where_the_apis_are_emulated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, no endpoint is set either way: the provider's capability says what its deploy would not create."""
    for org in ("demo", "stockmark"):
        shutil.copytree(ROOT / "inventories" / org, tmp_path / "inventories" / org,
                        ignore=shutil.ignore_patterns("generated", "hosts.yml"))
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    said: dict[str, str] = {}
    for org in ("demo", "stockmark"):
        lines: list[str] = []
        plan_stacks(load_tenant(org), None, offline=True, out=lines.append)
        said[org] = "\n".join(lines)
    assert "(AWS::FSx::FileSystem)  [the emulator will NOT create this]" in said["demo"], said["demo"]
    assert "(AWS::FSx::FileSystem)" in said["stockmark"] and "the emulator" not in said["stockmark"]
    # the aws tenant rehearsed on the emulator: its APIs handed in, as tests/test_aws_deploy_path.py's provider does
    lines = []
    plan_stacks(load_tenant("stockmark"), None, offline=True, apis=EMULATOR_APIS, out=lines.append)
    assert "(AWS::FSx::FileSystem)  [the emulator will NOT create this]" in "\n".join(lines)
