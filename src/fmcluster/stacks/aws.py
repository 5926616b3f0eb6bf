"""boto3 clients for a tenant: the usual credential chain on AWS, the tenant's emulator on local.
Nothing else differs between the two providers: how their APIs answer (retries) is handed in with the endpoint
(fmcluster.capabilities.ApiCapabilities, the provider's `capabilities.apis`)."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

from fmcluster.capabilities import ApiCapabilities

EMULATOR_CREDENTIALS = {"aws_access_key_id": "emulator", "aws_secret_access_key": "emulator"}


def session(region: str, endpoint: str | None) -> boto3.session.Session:
    # An endpoint URL of our own (the emulator) takes any credentials; boto3's chain is for AWS's own endpoints.
    if endpoint:
        return boto3.session.Session(region_name=region, **EMULATOR_CREDENTIALS)
    return boto3.session.Session(region_name=region)


def client(service: str, region: str, endpoint: str | None, apis: ApiCapabilities | None = None) -> Any:
    """A client of `service` at `endpoint` (None: AWS's own), retrying as the APIs there call for: `apis`, the
    provider's (every caller in fmcluster hands it in: tests/test_structure.py); None, botocore's standard mode as it
    comes (a test's or a script's client of the emulator)."""
    retries: dict[str, Any] = {"mode": "standard"}
    if apis is not None:
        retries["max_attempts"] = apis.retries  # botocore's name: retries after the first try
    config = Config(retries=retries, connect_timeout=5, read_timeout=120)
    return session(region, endpoint).client(service, endpoint_url=endpoint, config=config)


def has_credentials(region: str) -> bool:
    """Whether the boto3 chain finds credentials (no network call)."""
    return session(region, None).get_credentials() is not None


def ami_available(ec2: Any, ami: str) -> bool:
    """Whether EC2 describes `ami` as an available image (an unknown or malformed id: not; any other error raises)."""
    from botocore.exceptions import ClientError

    try:
        found = ec2.describe_images(ImageIds=[ami])["Images"]
    except ClientError as err:  # InvalidAMIID.NotFound / .Malformed: EC2 says it has no such image
        if str(err.response.get("Error", {}).get("Code", "")).startswith("InvalidAMIID"):
            return False
        raise
    return any(image.get("State", "available") == "available" for image in found)
