"""The CloudFormation templates, one module per stack, each `build(tenant, ...) -> dict`.

They are Python data on purpose (see fmcluster.stacks.cfn): tenant values are leaves, never text a
parser reads again, so no value can add or change a resource. `fmcluster.stacks.render` dumps them;
`invoke plan` writes the dumped YAML to inventories/<org>/generated/cfn/ for review.

The network and storage stacks are here; a cluster stack belongs to its scheduler's folder
(fmcluster.schedulers.<name>.template) and reaches the renderer as a `ClusterTemplate` the scheduler hands it;
what a scheduler adds to the storage stack reaches it the same way, as `StorageParts` (`Scheduler.storage_parts`).
The renderer's caller hands the tenant's scheduler in (`SchedulerStacks`): nothing here looks one up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fmcluster.model import Tenant

#: The EC2 nodes' user data, written by the renderer (fmcluster.stacks.render.node_user_data).
UserData = Callable[..., Any]


def _none(tenant: Tenant) -> dict[str, str]:
    return {}


def _no_names(tenant: Tenant) -> dict[str, tuple[str, str]]:
    return {}


@dataclass(frozen=True)
class ClusterTemplate:
    """A scheduler's cluster stack, as the renderer needs it."""

    #: The module it is built by (shown by `invoke plan`, beside the rendered stack).
    source: Path
    #: tenant, the renderer's user data → the template.
    build: Callable[[Tenant, UserData], dict[str, Any]]
    #: AMI parameters the stack takes: parameter name → the public SSM parameter it is resolved from once.
    image_parameters: Callable[[Tenant], dict[str, str]] = field(default=_none)
    #: AMI parameters of images with no public SSM parameter: parameter name → (owner, image name), the newest
    #: available image of that name resolved once (fmcluster.stacks.render.NamedImageRef).
    image_names: Callable[[Tenant], dict[str, tuple[str, str]]] = field(default=_no_names)
    #: AMI parameters (of image_parameters or image_names) a baked image replaces where the tenant has one: parameter
    #: name → image kind (fmcluster.baked.IMAGE_KINDS), resolved by fmcluster.stacks.render.BakedImageRef.
    baked_images: Callable[[Tenant], dict[str, str]] = field(default=_none)
    #: Of those, the ones a resource created once reads (slurm-ec2's controller instance: a new ImageId replaces it):
    #: once the stack holds an AMI for one, a baked image does not change it.
    kept_images: Callable[[Tenant], frozenset[str]] = field(default=lambda tenant: frozenset())
    #: Capacity Block scale-in parameters: parameter name → the queue whose block end it is.
    capacity_parameters: Callable[[Tenant], dict[str, str]] = field(default=_none)
    #: Why its nodes can boot only a baked image (the base images lack what its service needs on a node, e.g. PCS's
    #: agent): then a kind with no current record is refused with the fix, never booted on its base. Empty: the
    #: base image serves where nothing is baked.
    baked_required: str = ""
    #: What the image stack's component runs for it before fmcluster's own install steps (bash, as root, under
    #: `set -euo pipefail` with FMCLUSTER_REGION set): software its service needs that no role installs. It is part
    #: of what a baked image is made of (fmcluster.stacks.templates.image.pristine).
    image_steps: Callable[[], str] = field(default=lambda: "")


@dataclass(frozen=True)
class StorageParts:
    """What a scheduler adds to the storage stack (fmcluster.stacks.templates.storage), after the stack's own: the
    managed policies of nodes its own service makes, a database it needs (its folder's storage_parts.py); empty for
    most. A part never replaces one of the stack's own resources or outputs (the storage template refuses)."""

    #: Logical id → resource.
    resources: Mapping[str, Any] = field(default_factory=dict)
    #: Output name → output.
    outputs: Mapping[str, Any] = field(default_factory=dict)
    #: Condition name → condition, which its resources use.
    conditions: Mapping[str, Any] = field(default_factory=dict)
    #: The cfn-lint checks its resources need ignored, each with its reason: (check id, reason).
    lint_exceptions: tuple[tuple[str, str], ...] = ()


class SchedulerStacks(Protocol):
    """What the renderer asks of the tenant's scheduler (fmcluster.schedulers.protocol.Scheduler has it): handed in by
    the renderer's caller, so that nothing in fmcluster.stacks looks a scheduler up."""

    @property
    def cluster_template(self) -> ClusterTemplate | None:
        """The cluster stack fmcluster renders for it; None: its own service makes the cluster."""

    @property
    def stand_in_template(self) -> ClusterTemplate | None:
        """The stack standing in for that service where the provider does not have it."""

    def storage_parts(self) -> StorageParts:
        """What it adds to the storage stack."""

    def image(self, accelerator: str) -> str:
        """The catalogued image (data/images.yml key) its nodes of that accelerator boot: the image stack's parent."""
