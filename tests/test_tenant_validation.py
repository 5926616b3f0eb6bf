"""The tenant spec is validated before anything touches AWS: every bad input gets its own clear message
naming the file, the line, the key and the fix, and a non-zero exit code."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from fmcluster import commands
from fmcluster.model import load_tenant

ROOT = Path(__file__).resolve().parent.parent
DEMO_SPEC = yaml.safe_load((ROOT / "inventories/demo/group_vars/all/tenant.yml").read_text())
SPEC_REL = "inventories/acme/group_vars/all/tenant.yml"


def write_tenant(root: Path, text: str, org: str = "acme") -> Path:
    spec = root / "inventories" / org / "group_vars" / "all" / "tenant.yml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(text)
    return spec


def spec_with(change: Callable[[dict[str, Any]], None]) -> str:
    doc = copy.deepcopy(DEMO_SPEC)
    doc["tenant"]["org"] = "acme"
    change(doc["tenant"])
    return yaml.safe_dump(doc, sort_keys=False)


def run_validate(root: Path, monkeypatch: pytest.MonkeyPatch, org: str = "acme") -> tuple[int, str]:
    monkeypatch.setenv("FMCLUSTER_ROOT", str(root))
    lines: list[str] = []
    code = commands.validate(org, out=lines.append)
    return code, "\n".join(lines)


def set_in(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(t: dict[str, Any]) -> None:
        node: Any = t
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        last = parts[-1]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value
    return change


def drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(t: dict[str, Any]) -> None:
        node: Any = t
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[parts[-1]]
    return change


def add_queue(**queue: Any) -> Callable[[dict[str, Any]], None]:
    return lambda t: t["queues"].append(queue)


# (case id, spec text or a change to the demo spec, substrings the message must contain)
BAD_SPECS: list[tuple[str, str | Callable[[dict[str, Any]], None], list[str]]] = [
    ("typo-in-queue-key", set_in("queues.0", {"name": "cpu", "instnce_type": "c5.2xlarge", "count": 3}),
     ["tenant.queues[0].instnce_type", "unknown key 'instnce_type'", "did you mean 'instance_type'"]),
    ("typo-in-top-key", lambda t: t.update(regoin="ap-northeast-1"),
     ["tenant.regoin", "unknown key 'regoin'", "did you mean 'region'"]),
    ("unknown-instance-type", set_in("queues.0.instance_type", "p5.48xlarg"),
     ["tenant.queues[0].instance_type", "not in the instance catalog", "did you mean 'p5.48xlarge'"]),
    ("sagemaker-instance-name", set_in("queues.0.instance_type", "ml.p5.48xlarge"),
     ["SageMaker name", "write the EC2 name 'p5.48xlarge'"]),
    ("count-as-string", set_in("queues.0.count", "three"),
     ["tenant.queues[0].count", "'three' is text, expected a whole number"]),
    ("count-zero", set_in("queues.0.count", 0), ["tenant.queues[0].count", "at least 1 node"]),
    ("duplicate-queue", add_queue(name="cpu", instance_type="c5.2xlarge", count=1),
     ["tenant.queues[1].name", "queue name 'cpu' is used twice"]),
    ("bad-queue-name", set_in("queues.0.name", "GPU_Queue"), ["not a valid partition name"]),
    ("no-queues", set_in("queues", []), ["tenant.queues", "should be non-empty"]),
    ("missing-provider", drop("provider"), ["missing required key 'provider'", "add `provider:`"]),
    ("wrong-provider", set_in("provider", "azure"), ["tenant.provider", "'azure' is not allowed", "use one of: aws, local"]),
    ("scheduler-typo", set_in("scheduler", "slurm-ec"), ["did you mean 'slurm-ec2'"]),
    ("parallelcluster-section-on-slurm-ec2", lambda t: t.update(parallelcluster={"os": "ubuntu2204"}),
     ["tenant.parallelcluster", "only scheduler parallelcluster reads this section"]),
    ("unknown-region", set_in("region", "ap-northeast-9"), ["not a known AWS region"]),
    ("az-outside-region", set_in("availability_zone", "us-east-1a"),
     ["tenant.availability_zone", "not an availability zone of region 'ap-northeast-1'", "ap-northeast-1a"]),
    ("org-unsafe", set_in("org", "Acme_Corp"), ["tenant.org", "not safe for stack"]),
    ("org-differs-from-folder", set_in("org", "other"), ["differs from the tenant folder 'inventories/acme'"]),
    ("schema-version", set_in("schema_version", 2), ["tenant.schema_version", "set it to 1"]),
    ("lustre-too-small", set_in("storage.lustre.storage_capacity_gib", 1000), ["below the FSx for Lustre minimum"]),
    ("lustre-off-step", set_in("storage.lustre.storage_capacity_gib", 3000),
     ["3000 GiB is not a valid PERSISTENT_2 size", "use 2400 or 4800"]),
    ("lustre-throughput", set_in("storage.lustre.throughput_per_unit", 300),
     ["300 MB/s/TiB is not offered for PERSISTENT_2", "125, 250, 500, 1000"]),
    ("lustre-bad-deployment", set_in("storage.lustre.deployment_type", "PERSISTENT_3"),
     ["tenant.storage.lustre.deployment_type", "'PERSISTENT_3' is not allowed"]),
    ("dra-on-scratch1", lambda t: t["storage"]["lustre"].update(deployment_type="SCRATCH_1", storage_capacity_gib=1200,
                                                                 throughput_per_unit=None) or
     t["storage"]["lustre"].pop("throughput_per_unit"),
     ["needs PERSISTENT_2 or SCRATCH_2, not SCRATCH_1"]),
    ("trainium-with-cuda", lambda t: t["queues"][0].update(instance_type="trn1.32xlarge", accelerator="cuda"),
     ["'cuda' does not match trn1.32xlarge, which is neuron", "Trainium"]),
    ("ssh-world-open", set_in("network", {"ssh_ingress_cidr": "0.0.0.0/0"}), ["opens ssh to the whole internet"]),
    ("bad-cidr", set_in("network", {"vpc_cidr": "10.0.0.1/16"}), ["not a CIDR block"]),
    ("openzfs-too-small", lambda t: t["storage"].update(openzfs={"storage_capacity_gib": 10}), ["outside FSx for OpenZFS limits"]),
    ("mount-collision", lambda t: t["storage"].update(openzfs={"storage_capacity_gib": 128, "mount_point": "/fsx"}),
     ["already the Lustre mount point"]),
    ("bad-email-receiver", set_in("monitoring.alert_receivers", [{"name": "a", "type": "email", "target": "nobody"}]),
     ["not an e-mail address"]),
    ("two-defaults", lambda t: t["queues"].extend([{"name": "a", "instance_type": "c5.2xlarge", "count": 1, "default": True},
                                                  {"name": "b", "instance_type": "c5.2xlarge", "count": 1, "default": True}]),
     ["more than one queue is marked default"]),
    ("retention-negative", set_in("monitoring.prometheus_retention_days", 0), ["prometheus_retention_days"]),
    ("controller-missing-type", set_in("controller", {}), ["tenant.controller", "missing required key 'instance_type'"]),
    ("yaml-syntax-error", "tenant:\n  org: acme\n  queues: [\n", ["YAML syntax error"]),
    ("yaml-duplicate-key", "tenant:\n  org: acme\n  org: acme2\n", ["duplicate key 'org'"]),
    ("empty-file", "", ["the file is empty", "invoke new-tenant"]),
    ("not-a-mapping", "- just\n- a list\n", ["not a mapping", "start the file with `tenant:`"]),
    ("missing-tenant-key", "org: acme\n", ["missing required key 'tenant'"]),
]


@pytest.mark.parametrize("case_id,bad,expected", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_gets_a_clear_message_and_nonzero_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case_id: str, bad: Any, expected: list[str]
) -> None:
    write_tenant(tmp_path, bad if isinstance(bad, str) else spec_with(bad))
    code, output = run_validate(tmp_path, monkeypatch)
    assert code != 0, output
    assert SPEC_REL in output, output
    assert "fix:" in output, output
    assert "nothing was deployed" in output
    for fragment in expected:
        assert fragment in output, f"{case_id}: {fragment!r} not in\n{output}"


def test_there_are_at_least_25_distinct_bad_inputs() -> None:
    assert len({c[0] for c in BAD_SPECS}) >= 25


def test_messages_name_the_line_of_the_offending_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = spec_with(set_in("queues.0.instance_type", "p9.huge"))
    write_tenant(tmp_path, text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "p9.huge" in l)
    code, output = run_validate(tmp_path, monkeypatch)
    assert f"{SPEC_REL}:{line}: tenant.queues[0].instance_type:" in output


def test_all_problems_are_reported_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def many(t: dict[str, Any]) -> None:
        t["provider"] = "gcp"
        t["queues"][0]["instance_type"] = "p5.48xlarg"
        t["storage"]["lustre"]["storage_capacity_gib"] = 100
        t["colour"] = "blue"
    write_tenant(tmp_path, spec_with(many))
    code, output = run_validate(tmp_path, monkeypatch)
    assert code == 2
    assert "4 problems" in output
    for key in ("tenant.provider", "tenant.queues[0].instance_type", "storage_capacity_gib", "tenant.colour"):
        assert key in output


def test_missing_tenant_lists_the_known_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tenant(tmp_path, spec_with(lambda t: None))
    code, output = run_validate(tmp_path, monkeypatch, org="nosuch")
    assert code == 2
    assert "there is no tenant 'nosuch'" in output and "use one of: acme" in output


def test_missing_spec_file_in_existing_tenant_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "inventories" / "acme" / "group_vars" / "all").mkdir(parents=True)
    code, output = run_validate(tmp_path, monkeypatch)
    assert code == 2 and "the tenant spec file does not exist" in output


def test_defaults_come_from_the_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tenant(tmp_path, spec_with(lambda t: [t.pop("monitoring"), t.pop("acceptance"), t.pop("network")]))
    tenant = load_tenant("acme", tmp_path)
    assert tenant.monitoring.prometheus_retention_days == 15
    assert tenant.acceptance.tests == ("all_reduce",)
    assert tenant.network.vpc_cidr == "10.0.0.0/16"
    assert tenant.storage.s3_versioning is True


def test_invoke_validate_exits_nonzero_on_bad_input(tmp_path: Path) -> None:
    write_tenant(tmp_path, spec_with(set_in("queues.0.count", -1)))
    invoke = ROOT / ".venv" / "bin" / "invoke"
    result = subprocess.run(
        [str(invoke) if invoke.exists() else "invoke", "validate", "--org=acme"],
        cwd=ROOT, capture_output=True, text=True, env={"FMCLUSTER_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tenant.queues[0].count" in result.stdout


def test_cli_module_exit_code(tmp_path: Path) -> None:
    write_tenant(tmp_path, "tenant: {}\n")
    result = subprocess.run([sys.executable, "-m", "fmcluster.cli", "validate", "acme"], cwd=ROOT,
                            capture_output=True, text=True,
                            env={"FMCLUSTER_ROOT": str(tmp_path), "PYTHONPATH": str(ROOT / "src")})
    assert result.returncode == 2 and "missing required key" in result.stdout


def _schema_leaves(node: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    from fmcluster.validation import _resolve, load_schema

    schema = load_schema()
    if "$ref" in node:
        node = {**_resolve(schema, node["$ref"]), **node}
    found = [(path, node)] if path else []
    for key, sub in node.get("properties", {}).items():
        found += _schema_leaves(sub, (*path, key))
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        found += _schema_leaves(node["items"], (*path, "0"))
    return found


def _full_spec(t: dict[str, Any]) -> None:
    t["storage"]["openzfs"] = {"storage_capacity_gib": 128, "throughput_mbps": 128}
    t["monitoring"]["alert_receivers"] = [{"name": "a", "type": "email", "target": "a@example.org"}]
    t["queues"][0]["accelerator"] = "none"
    t["storage"]["lustre"]["data_repository"].update(import_policy=["NEW"], export_policy=["NEW"])
    t["acceptance"]["min_busbw_gbps"] = 1.0


def _leaves_where(test: Callable[[dict[str, Any]], bool]) -> list[tuple[str, ...]]:
    """Schema leaves matching `test` that the demo spec (with _full_spec's additions) holds."""
    from fmcluster.validation import load_schema

    full = copy.deepcopy(DEMO_SPEC)
    _full_spec(full["tenant"])

    def present(path: tuple[str, ...]) -> bool:
        node: Any = full["tenant"]
        for part in path:
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return False
        return True

    return [p[1:] for p, node in _schema_leaves(load_schema()) if p[:1] == ("tenant",) and test(node) and present(p[1:])]


@pytest.mark.parametrize("path", _leaves_where(lambda n: "enum" in n), ids=".".join)
def test_a_wrong_choice_is_fixed_by_listing_every_allowed_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               path: tuple[str, ...]) -> None:
    from fmcluster.validation import _subschema, load_schema

    allowed = _subschema(load_schema(), ("tenant", *[int(p) if p.isdigit() else p for p in path]))["enum"]
    write_tenant(tmp_path, spec_with(lambda t: [_full_spec(t), set_in(".".join(path), "nonsense")(t)]))
    code, output = run_validate(tmp_path, monkeypatch)
    assert code == 2 and f"fix: use one of: {', '.join(map(str, allowed))}" in output, output


@pytest.mark.parametrize("path", _leaves_where(lambda n: "maximum" in n), ids=".".join)
def test_an_out_of_range_number_is_fixed_by_stating_the_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              path: tuple[str, ...]) -> None:
    from fmcluster.validation import _subschema, load_schema

    node = _subschema(load_schema(), ("tenant", *[int(p) if p.isdigit() else p for p in path]))
    write_tenant(tmp_path, spec_with(lambda t: [_full_spec(t), set_in(".".join(path), node["maximum"] + 1)(t)]))
    code, output = run_validate(tmp_path, monkeypatch)
    assert code == 2 and f"{node['maximum']}" in output.split("fix:", 1)[1], output
