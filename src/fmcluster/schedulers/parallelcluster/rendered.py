"""A rendered ParallelCluster 3 cluster config, as data: what fmcluster.schedulers.parallelcluster.config produces and the
schema check, the offline AWS answers, the commands and the operations read.

A leaf module, so that the renderer may compute the offline answers (fmcluster.schedulers.parallelcluster.offline_aws)
without the answers' module importing the renderer back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ConfigPath = tuple[str | int, ...]
KeyPath = tuple[str | int, ...]


@dataclass
class ClusterConfig:
    """A rendered ParallelCluster 3 cluster config and where each of its values came from."""

    org: str
    cluster_name: str
    region: str
    spec_path: Path
    data: dict[str, Any]
    provenance: dict[ConfigPath, KeyPath] = field(default_factory=dict)  # config path → tenant key
    sources: dict[ConfigPath, str] = field(default_factory=dict)  # config path → stack output
    placeholders: dict[str, str] = field(default_factory=dict)  # stack output → placeholder rendered
    #: What ParallelCluster's validators get for their AWS calls offline (fmcluster.schedulers.parallelcluster.offline_aws).
    offline_answers: dict[str, Any] = field(default_factory=dict)

    def tenant_key(self, path: ConfigPath) -> tuple[KeyPath | None, str | None]:
        """What the value at a config path was rendered from: (tenant key, None) or (None, stack output),
        from the deepest recorded prefix of the path; (None, None) when nothing is recorded."""
        for end in range(len(path), -1, -1):
            prefix = path[:end]
            if prefix in self.provenance:
                return self.provenance[prefix], None
            if prefix in self.sources:
                return None, self.sources[prefix]
        return None, None
