"""What a stacks operation did, as data: the deploy flow reads it, the display prints it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

#: What must go before the stacks are deleted: (what, delete it → whether it went). A scheduler whose service
#: makes the cluster hands one to `invoke destroy`.
DeleteFirst = tuple[str, Callable[[], bool]]

Action = Literal[
    "created", "updated", "unchanged", "failed", "not-attempted",  # deploy
    "would-create", "would-update", "would-change", "no-changes", "rendered",  # plan
    "deleted", "absent",  # destroy
]

# Resource types moto 5.1's CloudFormation silently skips (measured; see docs/stacks.md; AWS::SageMaker::Cluster
# is made by the emulator's HyperPod stand-in, fmcluster.providers.local.emulator_hyperpod). Used to
# predict, in `plan`, what the emulator will not create; deploy reports what it really did not create.
EMULATOR_SKIPPED_TYPES = frozenset({
    "AWS::EC2::SecurityGroupEgress",
    "AWS::EC2::PlacementGroup",
    "AWS::FSx::FileSystem",
    "AWS::FSx::DataRepositoryAssociation",
    "AWS::S3::BucketPolicy",
})
# What moto 5.1 accepts in a template but silently does not apply (measured; docs/stacks.md): the
# deploy on provider local lists them next to the resources it did not create.
EMULATOR_IGNORED_PROPERTIES: dict[str, set[str]] = {
    "AWS::S3::Bucket": {"LifecycleConfiguration"},
    "AWS::EC2::VPCEndpoint": {"Tags"},
}
# Resource attributes the emulator accepts but does not apply. CreationPolicy is honoured (emulator_server fix 8:
# signals, counts, timeouts, rollback); UpdatePolicy is not: the emulator replaces no instance on an update (fix 6),
# so a rolling update has nothing to replace or wait for.
EMULATOR_IGNORED_ATTRIBUTES = frozenset({"UpdatePolicy"})


@dataclass(frozen=True)
class ResourceChange:
    action: str  # Add | Modify | Remove | Import | Dynamic
    logical_id: str
    resource_type: str
    replacement: str = ""  # True | False | Conditional | "" (unknown, e.g. on the emulator)


@dataclass(frozen=True)
class Failure:
    logical_id: str
    resource_type: str
    status: str
    reason: str

    def render(self) -> str:
        return f"{self.logical_id} ({self.resource_type}) {self.status}: {self.reason}"


@dataclass
class StackOutcome:
    key: str  # network | storage | cluster
    name: str
    action: Action
    status: str = ""  # CloudFormation stack status after the operation
    changes: list[ResourceChange] = field(default_factory=list)
    not_created: list[tuple[str, str]] = field(default_factory=list)  # (logical id, type) the emulator skipped
    outputs: dict[str, str] = field(default_factory=dict)
    failure: Failure | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class StacksResult:
    org: str
    provider: str
    endpoint: str | None  # the emulator's URL on provider local; None on AWS
    stacks: list[StackOutcome] = field(default_factory=list)
    outputs_file: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.failure is None and s.action not in ("failed", "not-attempted") for s in self.stacks)

    @property
    def changed(self) -> list[str]:
        """Stacks created or updated by this run."""
        return [s.name for s in self.stacks if s.action in ("created", "updated")]

    @property
    def skipped(self) -> list[str]:
        """Stacks left alone because nothing changed."""
        return [s.name for s in self.stacks if s.action in ("unchanged", "no-changes")]

    @property
    def not_created(self) -> dict[str, list[tuple[str, str]]]:
        """Per stack, the resources the emulator did not create (empty on AWS)."""
        return {s.name: list(s.not_created) for s in self.stacks if s.not_created}

    @property
    def outputs(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for s in self.stacks:
            merged.update(s.outputs)
        return merged

    @property
    def failure(self) -> Failure | None:
        return next((s.failure for s in self.stacks if s.failure), None)
