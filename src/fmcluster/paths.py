"""Where things live in an fmcluster checkout. One function per location, so no path is typed twice."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"
SCHEMA_PATH = DATA_DIR / "tenant.schema.json"
CATALOG_PATH = DATA_DIR / "instances.yml"


def repo_root() -> Path:
    """The checkout fmcluster works in: $FMCLUSTER_ROOT, else the source tree this package sits in."""
    override = os.environ.get("FMCLUSTER_ROOT")
    if override:
        return Path(override).resolve()
    return PACKAGE_DIR.parent.parent


def source_root() -> Path:
    """The checkout this package's code ships in (roles, cfn, playbooks), whatever $FMCLUSTER_ROOT says:
    tests and Molecule scenarios point $FMCLUSTER_ROOT at throwaway tenant trees, not at code."""
    return PACKAGE_DIR.parent.parent


def inventories_dir(root: Path | None = None) -> Path:
    return (root or repo_root()) / "inventories"


def tenant_dir(org: str, root: Path | None = None) -> Path:
    return inventories_dir(root) / org


def tenant_spec_path(org: str, root: Path | None = None) -> Path:
    """The one declarative source of a tenant."""
    return tenant_dir(org, root) / "group_vars" / "all" / "tenant.yml"


def generated_dir(org: str, root: Path | None = None) -> Path:
    """Files derived from the spec and from stack outputs; git-ignored, never edited by hand."""
    return tenant_dir(org, root) / "generated"


def secrets_dir(org: str, root: Path | None = None) -> Path:
    """Generated secrets (munge key, Grafana admin password); git-ignored, mode 0700."""
    return (root or repo_root()) / ".secrets" / org
