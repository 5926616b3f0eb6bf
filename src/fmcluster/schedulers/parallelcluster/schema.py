"""ParallelCluster's own schema, run offline in its own tool environment, its findings mapped to the tenant file.

aws-parallelcluster pins its own boto3 and aws-cdk 1.x, so it lives in `.tools/pcluster-venv` (installed by
scripts/bootstrap.sh), never in `.venv`; this module calls it in a subprocess (pcluster_check.py) with
several configs per call. The subprocess gets no AWS credentials and no instance metadata: loading a
config makes ParallelCluster try a few EC2 look-ups (capacity reservations), which then fail quietly
instead of reaching AWS. Validation never calls AWS.

A missing tool environment is a failure with its fix, never a pass (fail closed).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fmcluster.schedulers.parallelcluster.rendered import ClusterConfig
from fmcluster.paths import source_root
from fmcluster.validation import Problem, dotted
from fmcluster.yamlpos import load

CHECK_SCRIPT = Path(__file__).with_name("pcluster_check.py")
TOOL_VENV = ".tools/pcluster-venv"
TIMEOUT_S = 120.0


class ToolMissing(Exception):
    """The aws-parallelcluster tool environment is not installed."""


@dataclass(frozen=True)
class Finding:
    path: tuple[str | int, ...]  # in the cluster config
    message: str
    level: str  # ERROR | WARNING | INFO
    validator: str | None  # None: the schema itself

    @property
    def where(self) -> str:
        """Scheduling/SlurmQueues[0]/ComputeResources[0]/MinCount (ParallelCluster's docs write paths so)."""
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f"/{part}" if out else str(part))
        return out or "(the config)"


@dataclass(frozen=True)
class NeedsAws:
    """A ParallelCluster validator that asked AWS something fmcluster cannot answer offline: it runs on AWS only."""

    validator: str
    call: str  # service.Operation


@dataclass(frozen=True)
class SchemaReport:
    pcluster_version: str
    loaded_as: str | None  # SlurmClusterConfig when the schema accepted the config
    findings: tuple[Finding, ...]
    needs_aws: tuple[NeedsAws, ...] = ()

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "ERROR"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level != "ERROR"]

    @property
    def ok(self) -> bool:
        """Positive evidence only: the schema loaded the config and no offline validator found an error."""
        return self.loaded_as is not None and not self.errors


def tool_python() -> Path:
    """The tool environment's python ($FMCLUSTER_PCLUSTER_VENV overrides .tools/pcluster-venv of this checkout)."""
    venv = Path(os.environ.get("FMCLUSTER_PCLUSTER_VENV") or source_root() / TOOL_VENV)
    python = venv / "bin" / "python"
    if not python.is_file():
        raise ToolMissing(f"the aws-parallelcluster tool environment is missing ({venv}); "
                          "install it with `bash scripts/bootstrap.sh`")
    return python


def _offline_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull,
               PYTHONDONTWRITEBYTECODE="1")
    return env


def check_configs(configs: list[ClusterConfig]) -> list[SchemaReport]:
    """Load every config through ParallelCluster's ClusterSchema (one subprocess for all of them)."""
    if not configs:
        return []
    python = tool_python()
    payload = [{"cluster_name": c.cluster_name, "region": c.region, "config": c.data, "answers": c.offline_answers}
               for c in configs]
    run = subprocess.run([str(python), str(CHECK_SCRIPT)], input=json.dumps(payload), capture_output=True, text=True,
                         env=_offline_env(), timeout=TIMEOUT_S, check=False)
    try:
        raw: list[dict[str, Any]] = json.loads(run.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"ParallelCluster's schema check did not answer (exit {run.returncode}): "
                           f"{run.stderr.strip()[-2000:]}") from None
    if run.returncode != 0 or len(raw) != len(configs):
        raise RuntimeError(f"ParallelCluster's schema check failed (exit {run.returncode}): {run.stderr.strip()[-2000:]}")
    return [_report(r) for r in raw]


def _report(raw: dict[str, Any]) -> SchemaReport:
    findings = [Finding(tuple(e["path"]), str(e["message"]), "ERROR", None) for e in raw["errors"]]
    findings += [Finding(tuple(f["path"]), str(f["message"]), str(f["level"]), str(f["validator"]))
                 for f in raw["findings"]]
    needs = tuple(NeedsAws(str(n["validator"]), str(n["call"])) for n in raw.get("needs_aws", []))
    return SchemaReport(str(raw["pcluster_version"]), raw["loaded_as"], tuple(findings), needs)


def _normalized(path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    # marshmallow reports list indices as ints, but JSON object keys arrive as strings ("0").
    return tuple(int(p) if isinstance(p, str) and p.isdigit() else p for p in path)


def tenant_problems(cfg: ClusterConfig, report: SchemaReport) -> list[Problem]:
    """Every ERROR of the report as a Problem naming the tenant file, line and key behind the config value."""
    loaded = load(cfg.spec_path)
    problems = []
    for finding in report.errors:
        key, output = cfg.tenant_key(_normalized(finding.path))
        refusal = f"ParallelCluster {report.pcluster_version} ({finding.validator or 'schema'}) refuses {finding.where}"
        if key is not None:
            problems.append(Problem(cfg.spec_path, loaded.line_of(key), dotted(key), f"{refusal}: {finding.message}",
                                    f"change {dotted(key)} (rendered into {finding.where}); see docs/parallelcluster.md"))
        elif output is not None:
            problems.append(Problem(cfg.spec_path, None, "", f"{refusal}: {finding.message} (from stack output {output})",
                                    f"the stacks' outputs are not what the cluster config needs: `invoke status --org={cfg.org}`"))
        else:
            problems.append(Problem(cfg.spec_path, None, "", f"{refusal}: {finding.message}",
                                    "fmcluster rendered this value itself: report it with the generated cluster-config.yaml"))
    return problems
