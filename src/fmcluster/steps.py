"""What a deploy step reports: its status, a one-line summary and the details a person reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Status = Literal["ok", "changed", "skipped", "failed"]


@dataclass
class StepOutcome:
    status: Status
    summary: str
    details: list[str] = field(default_factory=list)
    #: The step went on over a cluster below its declared shape (the operator allowed it): the run is not "done".
    degraded: bool = False


@dataclass
class StepReport:
    name: str
    outcome: StepOutcome
    seconds: float
