"""A fourth scheduler is one folder plus one registry line (issue 41's proof): a copy of the package in which
src/fmcluster/schedulers/slurm_ec2 is copied as `phantom` (its name written in its own files only) and the registry
gets its line validates, plans and builds the manifest of a tenant naming `scheduler: phantom`, and the scaffold
writes one (`invoke new-tenant --scheduler=phantom`), no other file changed.
The phantom also brings its own entries of core data files (an image in its images.yml, an account in its
reserved_accounts.yml, read through capabilities.scheduler_data) and a tenant section of its own, as ParallelCluster's
`parallelcluster:` does, in its folder only: its schema fragment (section.schema.json, with a `$defs` entry), its
row's own_section and section_parser, and the parser (settings.py); the section is validated (unknown keys and values
refused with their key, and refused under another scheduler), parsed into Tenant.scheduler_settings, and listed in
the schema reference.

What the phantom still cannot do (the remaining gap, for the rest of issue 41):
- only validate → plan (offline) → manifest run here: no deploy;
What a scheduler adds to the storage stack is its own (`storage_parts`, StorageParts: ParallelCluster's node
policies and accounting database in its folder), and the stacks layer is handed the scheduler by the commands layer
(render_stacks, stacks.api) rather than importing the registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import ROOT

SRC = ROOT / "src" / "fmcluster"

RUN = r"""
import sys
from fmcluster import commands
from fmcluster.capabilities import SCHEDULERS
from fmcluster.model import load_tenant
from fmcluster.images import booted_image
from fmcluster.providers.registry import provider_for
from fmcluster.publish import build_manifest
from fmcluster.schedulers.registry import scheduler_for

assert "phantom" in SCHEDULERS and SCHEDULERS["phantom"].summary
lines = []
assert commands.validate("acme", out=lines.append) == 0, lines
assert commands.plan("acme") == 0
tenant = load_tenant("acme")
provider, scheduler = provider_for(tenant), scheduler_for(tenant)
assert tenant.scheduler == "phantom" and scheduler.name == "phantom"
assert type(scheduler).__module__ == "fmcluster.schedulers.phantom.scheduler"
manifest = build_manifest(tenant, "ref", {}, provider.queue_resources, scheduler.manifest_vars(),
                          provider.manifest_vars(), scheduler.discovery({}),
                          booted_image(scheduler.image, provider.node_image), [], provider.container_registry({}))
assert manifest["discovery"]["kind"] == "ec2" and manifest["vars"]["fmcluster_capabilities"]["slurm_owner"] == "fmcluster"

# Its own section: parsed by its folder's parser (the schema's default filled in), placed in the schema and its doc.
from fmcluster.schemadoc import render_reference
from fmcluster.validation import load_schema

settings = tenant.scheduler_settings
assert type(settings).__module__ == "fmcluster.schedulers.phantom.settings", settings
assert (settings.flavour, settings.spares) == ("fancy", 1), settings
schema = load_schema()
assert "phantom" in schema["properties"]["tenant"]["properties"] and "phantom_flavour" in schema["$defs"]
assert "| `tenant.phantom.spares` | integer | `1` |" in render_reference()
lines = []
assert commands.validate("bad", out=lines.append) != 0
text = "\n".join(lines)
assert "tenant.phantom.flavour" in text and "tenant.phantom.extra" in text and "unknown key 'extra'" in text, text
lines = []
assert commands.validate("other", out=lines.append) != 0
assert "only scheduler phantom reads this section" in "\n".join(lines), lines
assert load_tenant("plain").scheduler_settings is None

# Its own entries of core data files, in its folder only (capabilities.scheduler_data): an image and an account.
from fmcluster.images import load_images
from fmcluster.validation import reserved_accounts

assert load_images()["phantom-ubuntu2204"].contract.default_user == "ubuntu"
assert reserved_accounts()[0]["phantom-admin"] == "gpu_and_aws_images"

# The scaffold offers it: `invoke new-tenant --scheduler=phantom` (the choices come from the registry).
from fmcluster.scaffold import new_tenant

scaffolded = new_tenant("scaffolded", {"scheduler": "phantom", "provider": "local", "instance_type": "c5.2xlarge"})
assert scaffolded.scheduler == "phantom" and scaffolded.org == "scaffolded", scaffolded
print("PHANTOM OK")
"""

#: The phantom's own section, in its folder only: the row's lines, the schema fragment and the parser.
SECTION_ROW = "own_section: phantom\nsection_parser: settings:parse\n"
SECTION_SCHEMA = """{
  "type": "object",
  "additionalProperties": false,
  "description": "scheduler phantom only: its own settings.",
  "properties": {
    "flavour": {"$ref": "#/$defs/phantom_flavour"},
    "spares": {"type": "integer", "minimum": 0, "default": 1, "description": "Spare nodes."}
  },
  "$defs": {
    "phantom_flavour": {"enum": ["plain", "fancy"], "description": "How it is made."}
  }
}
"""
SETTINGS = '''from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PhantomSettings:
    flavour: str | None
    spares: int


def parse(section: dict[str, Any], written: dict[str, Any]) -> PhantomSettings:
    return PhantomSettings(section.get("flavour"), section["spares"])
'''


def _phantom_tree(tmp: Path) -> Path:
    """A copy of src/fmcluster with schedulers/phantom (slurm_ec2's files, its name rewritten) and one registry line."""
    package = tmp / "src" / "fmcluster"
    shutil.copytree(SRC, package, ignore=shutil.ignore_patterns("__pycache__"))
    folder = package / "schedulers" / "phantom"
    shutil.copytree(SRC / "schedulers" / "slurm_ec2", folder, ignore=shutil.ignore_patterns("__pycache__"))
    for path in folder.iterdir():
        path.write_text(path.read_text().replace("slurm_ec2", "phantom").replace("slurm-ec2", "phantom"))
    row = folder / "capabilities.yml"
    row.write_text(row.read_text().replace("own_section: null\n", SECTION_ROW))
    (folder / "section.schema.json").write_text(SECTION_SCHEMA)
    (folder / "settings.py").write_text(SETTINGS)
    images = yaml.safe_load((SRC / "schedulers" / "parallelcluster" / "images.yml").read_text())["images"]
    image = {"phantom-ubuntu2204": images["parallelcluster-ubuntu2204"]}
    (folder / "images.yml").write_text(yaml.safe_dump({"images": image}))
    accounts = {"gpu_and_aws_images": {"phantom-admin": "its cookbook"}}
    (folder / "reserved_accounts.yml").write_text(yaml.safe_dump(accounts))
    registry = package / "schedulers" / "registry.py"
    text = registry.read_text()
    line = "from fmcluster.schedulers.slurm_ec2.scheduler import SlurmEc2\n"
    text = text.replace(line, line + "from fmcluster.schedulers.phantom.scheduler import SlurmEc2 as Phantom\n")
    text = text.replace("(SlurmEc2, HyperPod, ParallelCluster, Pcs)", "(SlurmEc2, HyperPod, ParallelCluster, Pcs, Phantom)")
    registry.write_text(text)
    changed = [p.relative_to(package).as_posix() for p in package.rglob("*")
               if p.is_file() and not p.is_relative_to(folder) and p.read_bytes() != (SRC / p.relative_to(package)).read_bytes()]
    assert changed == ["schedulers/registry.py"], changed
    return tmp / "src"


def test_a_copied_scheduler_folder_and_one_registry_line_validate_plan_and_build_a_manifest_with_its_section(tmp_path: Path) -> None:
    root = tmp_path / "root"  # the checkout's files (docs/, roles/ ...), the copied package and a tenant of its own
    src = _phantom_tree(root)
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("inventories", "src"):
            (root / entry.name).symlink_to(entry)
    demo = yaml.safe_load((ROOT / "inventories/demo/group_vars/all/tenant.yml").read_text())["tenant"]
    tenants = {"acme": {"scheduler": "phantom", "phantom": {"flavour": "fancy"}},
               "bad": {"scheduler": "phantom", "phantom": {"flavour": "odd", "extra": 1}},
               "other": {"scheduler": "slurm-ec2", "phantom": {"spares": 2}},
               "plain": {"scheduler": "slurm-ec2"}}
    for org, changes in tenants.items():
        path = root / "inventories" / org / "group_vars" / "all" / "tenant.yml"
        path.parent.mkdir(parents=True)
        path.write_text(yaml.safe_dump({"tenant": {**demo, "org": org, "provider": "local", **changes}}, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(src), "FMCLUSTER_ROOT": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, "-c", RUN], cwd=root, env=env, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0 and "PHANTOM OK" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    assert "[cluster] fmc-acme-cluster  (from src/fmcluster/schedulers/phantom/template.py)" in run.stdout
