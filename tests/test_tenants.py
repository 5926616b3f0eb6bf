"""Bundled tenants validate, and `invoke new-tenant` renders tenants that validate."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fmcluster.catalog import load_catalog
from fmcluster.model import load_spec, load_tenant
from fmcluster.scaffold import TenantExists, new_tenant

from conftest import venv_tool

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("org", ["demo", "stockmark", "neuronlab"])
def test_bundled_tenant_is_valid(org: str) -> None:
    tenant = load_tenant(org, ROOT)
    assert tenant.org == org


def test_demo_is_local_with_three_compute_nodes() -> None:
    demo = load_tenant("demo", ROOT)
    assert demo.provider == "local" and demo.compute_nodes == 3


def test_stockmark_is_p5_slurm_in_tokyo() -> None:
    tenant = load_tenant("stockmark", ROOT)
    assert (tenant.scheduler, tenant.region, tenant.queues[0].instance.name) == ("slurm-ec2", "ap-northeast-1", "p5.48xlarge")
    assert tenant.queues[0].instance.efa_interfaces == 32


def test_neuronlab_is_trainium_on_hyperpod() -> None:
    tenant = load_tenant("neuronlab", ROOT)
    assert tenant.scheduler == "hyperpod" and tenant.queues[0].accelerator == "neuron"


def test_new_tenant_renders_a_valid_tenant(tmp_path: Path) -> None:
    tenant = new_tenant("acme", {"instance_type": "p4d.24xlarge", "count": "4", "region": "us-east-1",
                                 "availability_zone": "us-east-1a"}, output_dir=tmp_path)
    assert tenant.queues[0].instance.name == "p4d.24xlarge" and tenant.queues[0].count == 4
    assert (tmp_path / "acme" / "group_vars" / "all" / "tenant.yml").is_file()
    assert load_spec(tenant.spec_path).org == "acme"


def test_new_tenant_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    new_tenant("acme", {}, output_dir=tmp_path)
    spec = tmp_path / "acme" / "group_vars" / "all" / "tenant.yml"
    spec.write_text(spec.read_text() + "# my edit\n")
    with pytest.raises(TenantExists):
        new_tenant("acme", {"count": "9"}, output_dir=tmp_path)
    assert "# my edit" in spec.read_text()
    assert new_tenant("acme", {"count": "9"}, output_dir=tmp_path, force=True).queues[0].count == 9


def test_new_tenant_rejects_an_unsafe_org_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a safe name"):
        new_tenant("Bad_Name", {}, output_dir=tmp_path)


def test_invoke_new_tenant_non_interactive(tmp_path: Path) -> None:
    result = subprocess.run(
        [venv_tool("invoke"), "new-tenant", "--org=trn-lab", "--instance-type=trn1.32xlarge", "--count=2",
         "--scheduler=hyperpod", "--region=us-east-2", f"--output-dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tenant 'trn-lab' is valid" in result.stdout and "hyperpod" in result.stdout
    again = subprocess.run([venv_tool("invoke"), "new-tenant", "--org=trn-lab", f"--output-dir={tmp_path}"],
                           cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert again.returncode == 2 and "--force" in again.stdout + again.stderr


def test_catalog_has_the_instance_types_the_programme_uses() -> None:
    catalog = load_catalog()
    for name in ("p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p4de.24xlarge",
                 "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge"):
        assert name in catalog
    assert catalog["p5.48xlarge"].accelerators_per_node == 8 and catalog["p4d.24xlarge"].efa_interfaces == 4
    assert catalog["trn1.32xlarge"].accelerator == "neuron" and catalog["c5.2xlarge"].accelerator == "none"
    assert catalog["p5.48xlarge"].acceptance.min_busbw_gbps(2) == 250
    assert catalog["p5.48xlarge"].acceptance.min_busbw_gbps(16) == 250
