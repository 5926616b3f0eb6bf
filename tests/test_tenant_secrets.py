"""The secrets a tenant names for its nodes and makes itself (monitoring.smtp's relay login, the directory's bind
password) are checked before the deploy changes anything (issue 42): a missing one is refused with the file, the key
and the fix, against Secrets Manager (here the emulator's, in-process), instead of failing a node's converge late."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import ROOT
from fmcluster.model import Directory, Tenant, load_tenant
from fmcluster.publish import missing_tenant_secrets, tenant_named_secrets


@pytest.fixture
def secretsmanager() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("secretsmanager", region_name="ap-northeast-1", aws_access_key_id="x",
                           aws_secret_access_key="x")


def _with_directory(tenant: Tenant) -> Tenant:
    return dataclasses.replace(tenant, directory=Directory(
        uri="ldaps://ldap.example.org", base_dn="dc=example,dc=org", bind_dn="cn=reader,dc=example,dc=org",
        bind_password_secret="ldap-bind-password"))


def test_the_tenant_s_own_secrets_are_the_relay_login_and_the_bind_password() -> None:
    tenant = _with_directory(load_tenant("stockmark", ROOT))
    assert tenant_named_secrets(tenant) == [("monitoring.smtp.username_secret", "smtp-username"),
                                            ("monitoring.smtp.password_secret", "smtp-password"),
                                            ("directory.bind_password_secret", "ldap-bind-password")]
    assert tenant_named_secrets(load_tenant("demo", ROOT)) == []


def test_each_missing_secret_is_refused_with_its_file_key_and_fix(secretsmanager: Any) -> None:
    tenant = _with_directory(load_tenant("stockmark", ROOT))
    secretsmanager.create_secret(Name="fmcluster/stockmark/smtp-username", SecretString="AKIA-example")
    refusals = missing_tenant_secrets(tenant, secretsmanager)
    assert len(refusals) == 2
    smtp, bind = refusals
    assert smtp.startswith("inventories/stockmark/group_vars/all/tenant.yml: monitoring.smtp.password_secret: "
                           "secret fmcluster/stockmark/smtp-password does not exist in Secrets Manager "
                           "(ap-northeast-1)")
    assert ("aws secretsmanager create-secret --region ap-northeast-1 --name fmcluster/stockmark/smtp-password"
            in smtp)
    assert "or set monitoring.smtp.password_secret to a secret that exists under fmcluster/stockmark/" in smtp
    assert bind.startswith("inventories/stockmark/group_vars/all/tenant.yml: directory.bind_password_secret: "
                           "secret fmcluster/stockmark/ldap-bind-password does not exist")
    secretsmanager.create_secret(Name="fmcluster/stockmark/smtp-password", SecretString="x")
    secretsmanager.create_secret(Name="fmcluster/stockmark/ldap-bind-password", SecretString="x")
    assert missing_tenant_secrets(tenant, secretsmanager) == []


def test_a_lookup_that_fails_refuses_too(secretsmanager: Any) -> None:
    """Access denied or throttled is not "present": fail closed, naming the answer."""
    class Denied:
        exceptions = secretsmanager.exceptions

        def describe_secret(self, SecretId: str) -> None:  # noqa: N803 - boto3's keyword
            raise RuntimeError("AccessDeniedException: not authorized to perform secretsmanager:DescribeSecret")

    refusals = missing_tenant_secrets(load_tenant("stockmark", ROOT), Denied())
    assert len(refusals) == 2 and all("cannot be looked up" in r and "AccessDenied" in r for r in refusals)


def test_the_deploy_refuses_before_any_secret_key_pair_or_stack(secretsmanager: Any) -> None:
    """The access step checks first: nothing of the tenant's is created when a named secret is missing."""
    from fmcluster.deploy import Deploy

    tenant = load_tenant("stockmark", ROOT)
    deploy = Deploy(tenant, out=lambda line: None)
    deploy._clients[("secretsmanager", None)] = secretsmanager
    outcome = deploy.access()
    assert outcome.status == "failed"
    assert outcome.summary == "2 secret(s) the tenant names are missing; nothing was created or changed"
    assert secretsmanager.list_secrets()["SecretList"] == []


def test_plan_shows_a_missing_secret_and_refuses_where_it_reaches_aws(secretsmanager: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.commands.cluster import secrets_preflight
    from fmcluster.exits import ExitCode
    from fmcluster.providers import NoEndpoint

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "x")
    tenant = load_tenant("stockmark", ROOT)
    lines: list[str] = []
    assert secrets_preflight(tenant, None, None, tenant.capabilities.provider.apis, lines.append) == ExitCode.INVALID
    assert lines[0] == "[secrets] the tenant's own secrets the nodes read (Secrets Manager)"
    assert "monitoring.smtp.username_secret: secret fmcluster/stockmark/smtp-username does not exist" in lines[1]
    assert lines[-1] == "2 secret(s) missing; nothing was planned or changed."
    # Offline, plan says the deploy checks them; a tenant naming none is not asked about.
    offline: list[str] = []
    assert secrets_preflight(tenant, None, NoEndpoint("no credentials", True), tenant.capabilities.provider.apis,
                             offline.append) == ExitCode.OK
    assert offline == ["[secrets] not checked: no credentials; `invoke deploy` checks them before any change"]
    demo = load_tenant("demo", ROOT)
    assert secrets_preflight(demo, None, None, demo.capabilities.provider.apis, offline.append) == ExitCode.OK
