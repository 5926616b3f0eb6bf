"""The rendered stacks of every bundled tenant, byte for byte: a refactoring that changes a template shows here
(issue 27: "rendered stacks byte-identical before and after"). A change made on purpose is recorded by
regenerating them and reviewing the diff:

    FMCLUSTER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_rendered_golden.py
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from conftest import ROOT
from fmcluster.model import load_tenant
from fmcluster.stacks.render import load_cfn_yaml
from scheduler_stacks import render_stacks

GOLDEN = ROOT / "tests" / "golden" / "stacks"
BUNDLED = sorted(p.name for p in (ROOT / "inventories").iterdir() if (p / "group_vars").is_dir())


def rendered(org: str) -> dict[str, str]:
    """File name → text: each stack's template and its parameters."""
    files = {}
    for stack in render_stacks(load_tenant(org, ROOT)):
        files[f"{stack.key}.yaml"] = stack.body
        files[f"{stack.key}.parameters.json"] = json.dumps(stack.parameters, indent=1, sort_keys=True, default=str) + "\n"
    return files


@pytest.mark.parametrize("org", BUNDLED)
def test_the_rendered_stacks_are_the_recorded_ones(org: str) -> None:
    files, folder = rendered(org), GOLDEN / org
    if os.environ.get("FMCLUSTER_UPDATE_GOLDEN") == "1":
        folder.mkdir(parents=True, exist_ok=True)
        for stale in set(p.name for p in folder.iterdir()) - set(files):
            (folder / stale).unlink()
        for name, text in files.items():
            (folder / name).write_text(text)
    recorded = {p.name: p.read_text() for p in folder.iterdir()} if folder.is_dir() else {}
    assert sorted(recorded) == sorted(files), f"{org}: stacks rendered vs recorded (regenerate: see the module doc)"
    changed = [name for name in files if files[name] != recorded[name]]
    assert not changed, (f"{org}: {changed} differ from tests/golden/stacks/{org}/: if the change is meant, regenerate "
                         "them (see the module doc) and review the diff")


def test_every_bundled_tenant_is_recorded() -> None:
    assert {p.name for p in GOLDEN.iterdir()} == set(BUNDLED) and len(BUNDLED) >= 5


@pytest.mark.parametrize("org", BUNDLED)
def test_a_tenant_s_templates_are_the_same_on_either_provider(org: str) -> None:
    """What differs locally is the substrate, not the template (issue 27): no provider parameter or condition.
    Only a stack a service makes on AWS (ParallelCluster's cluster, PCS's node groups) has a stand-in's in its place
    locally."""
    tenant = load_tenant(org, ROOT)
    other = dataclasses.replace(tenant, provider="aws" if tenant.provider == "local" else "local")
    assert other.capabilities.provider != tenant.capabilities.provider
    here, there = ({s.key: s.body for s in render_stacks(t)} for t in (tenant, other))
    shared = set(here) & set(there)
    if tenant.capabilities.stand_in or other.capabilities.stand_in:
        shared -= {"cluster"}
    assert {"network", "storage"} <= shared
    assert {key: here[key] for key in shared} == {key: there[key] for key in shared}
    assert all("Provider" not in load_cfn_yaml(body).get("Parameters", {}) for body in here.values())
