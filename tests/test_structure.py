"""Values are data; names are not switches.

Only fmcluster.providers and fmcluster.schedulers may compare a provider or scheduler name; everything else
(stacks, validation, health, doctor, fleet, roles, playbooks, templates) reads a capability
(fmcluster.capabilities, the manifest's fmcluster_capabilities). These tests read the source (Python by its
syntax tree, Ansible by its Jinja) and list every comparison they find as file:line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from fmcluster.capabilities import PROVIDERS, SCHEDULERS, UnknownName, capabilities

NAMES = frozenset(PROVIDERS) | frozenset(SCHEDULERS)
#: Fields that hold a provider or scheduler name (tenant.provider, doc["scheduler"], tenant.get("provider")).
NAME_FIELDS = frozenset({"provider", "scheduler"})
#: Where names may be compared: the modules that *are* the providers and schedulers.
OWNERS = (ROOT / "src" / "fmcluster" / "providers", ROOT / "src" / "fmcluster" / "schedulers")
#: Comparisons that look like a name but are not one: (file, source text) → why.
NOT_A_NAME = {
    ("src/fmcluster/parallelcluster/rules.py", '"parallelcluster" in tenant'):
        "the tenant's `parallelcluster:` section is present (a key), not the scheduler's name",
}


def _names_a_name(node: ast.expr) -> bool:
    """Whether an operand of a comparison is a provider/scheduler name or a field that holds one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_name(element) for element in node.elts)
    if isinstance(node, ast.Attribute):
        return node.attr in NAME_FIELDS
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in NAME_FIELDS
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        first = node.args[0]
        return isinstance(first, ast.Constant) and first.value in NAME_FIELDS
    return False


def name_comparisons(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, source text) of every comparison in `source` that involves a provider or scheduler name."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare) and any(_names_a_name(op) for op in [node.left, *node.comparators]):
            text = ast.get_source_segment(source, node) or ""
            if (filename, text) not in NOT_A_NAME:
                found.append((node.lineno, text))
    return found


def python_files() -> list[Path]:
    roots = [ROOT / "src", ROOT / "scripts", ROOT / "roles"]
    files = [ROOT / "tasks.py", *(p for root in roots for p in root.rglob("*.py"))]
    return sorted(p for p in files if p.is_file() and not any(p.is_relative_to(owner) for owner in OWNERS))


#: A Jinja comparison (==, !=, in, is) next to a variable that holds a provider or scheduler name, or any read of
#: the names the manifest once carried (fmcluster_provider, fmcluster_scheduler) or of the old scheduler switch.
_NAME_VAR = r"\b(?:fmcluster_provider|fmcluster_scheduler|\w*_slurm_from|\w+_provider|\w+_scheduler)\b"
_COMPARE = re.compile(rf"{_NAME_VAR}[^\n]*?(?:==|!=|\bnot in\b|\bin\b|\bis\b)|(?:==|!=)\s*{_NAME_VAR}")
_READS_NAME = re.compile(r"\b(?:fmcluster_provider|fmcluster_scheduler|fmcluster_slurm_from)\b")


def jinja_name_comparisons(text: str) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if line.lstrip().startswith("#") or " #" in line else line
        code = re.sub(r"\{#.*?#\}", "", code)
        if _COMPARE.search(code) or _READS_NAME.search(code):
            found.append((number, line.strip()))
    return found


def ansible_files() -> list[Path]:
    files = [*(ROOT / "roles").rglob("*.yml"), *(ROOT / "roles").rglob("*.j2"), *(ROOT / "playbooks").rglob("*.yml")]
    return sorted(p for p in files if p.is_file())


def test_no_python_outside_providers_and_schedulers_compares_a_provider_or_scheduler_name() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for path in python_files()
             for line, text in name_comparisons(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, ("compare a capability (fmcluster.capabilities), not a provider or scheduler name:\n"
                       + "\n".join(found))


def test_no_role_playbook_or_template_compares_a_provider_or_scheduler_name() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for path in ansible_files() for line, text in jinja_name_comparisons(path.read_text(encoding="utf-8"))]
    assert not found, ("read fmcluster_capabilities (or the inventory group fmcluster_slurm), not a provider or "
                       "scheduler name:\n" + "\n".join(found))


@pytest.mark.parametrize(("source", "comparison"), [
    ('if tenant.provider == "local": pass', 'tenant.provider == "local"'),
    ('x = doc["scheduler"] != other', 'doc["scheduler"] != other'),
    ('y = tenant.get("scheduler") in ("slurm-ec2", "hyperpod")', 'tenant.get("scheduler") in ("slurm-ec2", "hyperpod")'),
    ('ok = "aws" == where', '"aws" == where'),
    ('ok = self.scheduler is None', 'self.scheduler is None'),
])
def test_the_python_check_finds_a_name_comparison(source: str, comparison: str) -> None:
    assert name_comparisons(source, "example.py") == [(1, comparison)]


@pytest.mark.parametrize("source", [
    'if tenant.capabilities.provider.apis.emulated: pass',
    'interval = PROVIDERS[name].health_interval_s',
    'if kind == "ec2": pass',
    'if slurm_accounting_database == "local_db": pass',
])
def test_the_python_check_lets_a_capability_through(source: str) -> None:
    assert name_comparisons(source, "example.py") == []


@pytest.mark.parametrize("line", [
    "      when: fmcluster_slurm_from | default('fmcluster') == 'fmcluster'",
    "    - efa_provider == 'aws'",
    "node_health_provider: \"{{ fmcluster_provider | default('aws') }}\"",
    "  when: fmcluster_scheduler in ['hyperpod']",
])
def test_the_ansible_check_finds_a_name_comparison(line: str) -> None:
    assert jinja_name_comparisons(line) == [(1, line.strip())]


@pytest.mark.parametrize("line", [
    "    - efa_require_devices | bool",
    "      when: slurm_accounting_database == 'local'",
    "# fmcluster_provider used to decide this",
    "  hosts: controller:&fmcluster_slurm",
])
def test_the_ansible_check_lets_a_capability_through(line: str) -> None:
    assert jinja_name_comparisons(line) == []


def test_every_provider_and_scheduler_class_publishes_its_row_of_capabilities() -> None:
    from fmcluster.providers.aws import AwsProvider
    from fmcluster.providers.local import LocalProvider
    from fmcluster.schedulers.hyperpod.scheduler import HyperPod
    from fmcluster.schedulers.parallelcluster.scheduler import ParallelCluster
    from fmcluster.schedulers.pcs.scheduler import Pcs
    from fmcluster.schedulers.slurm_ec2.scheduler import SlurmEc2

    for cls in (AwsProvider, LocalProvider):
        assert cls.capabilities is PROVIDERS[cls.name]
    for sched in (HyperPod, ParallelCluster, Pcs, SlurmEc2):
        assert sched.capabilities is SCHEDULERS[sched.name]
    assert set(PROVIDERS) == {AwsProvider.name, LocalProvider.name}
    assert set(SCHEDULERS) == {HyperPod.name, ParallelCluster.name, Pcs.name, SlurmEc2.name}


def test_every_scheduler_hands_over_the_cluster_stack_its_capabilities_promise() -> None:
    from fmcluster.schedulers.registry import SCHEDULER_CLASSES

    for name, cls in SCHEDULER_CLASSES.items():
        template = getattr(cls, "cluster_template")
        assert (template is not None) == SCHEDULERS[name].renders_cluster_stack, name
        for made in (template, getattr(cls, "stand_in_template")):
            if made is not None:
                assert made.source.is_file(), (name, made.source)
        if not SCHEDULERS[name].renders_cluster_stack or SCHEDULERS[name].service_resources_stood_in:
            # Offline, a service-made cluster needs its stand-in (capabilities.Capabilities.stand_in).
            assert getattr(cls, "stand_in_template") is not None, name


SCHEDULERS_DIR = ROOT / "src" / "fmcluster" / "schedulers"


def test_a_scheduler_is_one_folder_and_one_registry_line() -> None:
    """docs/stacks.md's promise: a new scheduler touches its folder and one line of the registry, nothing else."""
    from fmcluster.schedulers.registry import SCHEDULER_CLASSES

    folders = sorted(p for p in SCHEDULERS_DIR.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert {p.name for p in folders} == {name.replace("-", "_") for name in SCHEDULER_CLASSES}
    for folder in folders:
        for owned in ("__init__.py", "scheduler.py", "capabilities.yml", "README.md"):
            assert (folder / owned).is_file(), f"{folder.name}/{owned}"
        assert yaml.safe_load((folder / "capabilities.yml").read_text())["name"].replace("-", "_") == folder.name
    for name, cls in SCHEDULER_CLASSES.items():
        assert getattr(cls, "__module__") == f"fmcluster.schedulers.{name.replace('-', '_')}.scheduler"
    registry = (SCHEDULERS_DIR / "registry.py").read_text()
    assert len(re.findall(r"^from fmcluster\.schedulers\.\w+\.scheduler import \w+$", registry, re.M)) == len(folders)


@pytest.mark.parametrize(("provider", "scheduler", "stand_in", "slurm_owner"), [
    ("aws", "parallelcluster", False, "scheduler"),
    ("local", "parallelcluster", True, "fmcluster"),
    ("aws", "slurm-ec2", False, "fmcluster"),
    ("local", "hyperpod", False, "scheduler"),  # HyperPod's own Slurm, on either provider
    ("aws", "pcs", False, "scheduler"),  # PCS's Slurm, started by its agent on the node image
    ("local", "pcs", True, "fmcluster"),  # no PCS offline: its stand-in, with fmcluster's Slurm
])
def test_a_service_made_cluster_is_stood_in_where_the_provider_has_no_cluster_services(
        provider: str, scheduler: str, stand_in: bool, slurm_owner: str) -> None:
    caps = capabilities(provider, scheduler)
    assert (caps.stand_in, caps.slurm_owner) == (stand_in, slurm_owner)


def test_an_unknown_provider_or_scheduler_has_no_capabilities_and_says_which_exist() -> None:
    with pytest.raises(UnknownName, match=r"provider 'gcp' has no capabilities .*known: aws, local"):
        capabilities("gcp", "slurm-ec2")
    with pytest.raises(UnknownName, match=r"scheduler 'k8s'.*known: hyperpod, parallelcluster, pcs, slurm-ec2"):
        capabilities("aws", "k8s")


# --- "is this the emulator" is a capability, never a look at the endpoint -------------------------------------------
#: A value that says where the AWS APIs answer: a name or attribute `endpoint`.
def _is_endpoint(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "endpoint") or (
        isinstance(node, ast.Attribute) and node.attr == "endpoint")


def _tests_an_endpoint(test: ast.expr) -> bool:
    """Whether a condition asks whether an endpoint is set (`endpoint is None`, `not self.endpoint`, `endpoint and
    …`): how the APIs answer is the provider's capability (ApiCapabilities), handed in beside the endpoint."""
    if _is_endpoint(test):
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _tests_an_endpoint(test.operand)
    if isinstance(test, ast.BoolOp):
        return any(_tests_an_endpoint(value) for value in test.values)
    if isinstance(test, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops):
        operands = [test.left, *test.comparators]
        return any(_is_endpoint(o) for o in operands) and any(
            isinstance(o, ast.Constant) and o.value is None for o in operands)
    return False


def endpoint_switches(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, source text) of every condition in `source` that branches on whether an endpoint is set, and of every
    `endpoint is (not) None` anywhere (a flag made of it, an argument computed from it)."""
    found: dict[int, str] = {}  # by line: a condition, not again the comparison inside it (ast.walk goes outside in)
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)) and _tests_an_endpoint(node.test):
            text = ast.get_source_segment(source, node.test) or ""
        elif isinstance(node, ast.Compare) and _tests_an_endpoint(node):
            text = ast.get_source_segment(source, node) or ""
        else:
            continue
        if (filename, text) not in PASSES_AN_ENDPOINT_ON:
            found.setdefault(node.lineno, text)
    return sorted(found.items())


#: Conditions on an endpoint that hand the URL on as data, deciding nothing about how the APIs behave: (file,
#: condition) → why.
PASSES_AN_ENDPOINT_ON = {
    ("src/fmcluster/stacks/aws.py", "endpoint"):
        "an endpoint URL of our own takes fixed credentials with it: boto3's chain holds them for AWS's endpoints only",
    ("src/fmcluster/manifest.py", "endpoint"):
        "Prometheus's EC2 discovery is handed the endpoint URL the nodes use, where there is one",
    ("src/fmcluster/node/agent.py", "endpoint"):
        "the node routes toward the host of its AWS endpoint URL, or toward the instance metadata address",
}


def test_nothing_in_fmcluster_asks_whether_an_endpoint_is_set_to_decide_how_the_apis_behave() -> None:
    """Retries, polls, what an emulator leaves out or stands in are the provider's (fmcluster.capabilities.
    ApiCapabilities, `Provider.capabilities.apis`), handed in with the endpoint (issue 41)."""
    src = ROOT / "src" / "fmcluster"
    found = [f"{path.relative_to(ROOT)}:{line}: {text}" for path in sorted(src.rglob("*.py"))
             for line, text in endpoint_switches(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, ("read the provider's capabilities.apis (fmcluster.capabilities.ApiCapabilities), not whether an "
                       "endpoint is set:\n" + "\n".join(found))


@pytest.mark.parametrize(("source", "switch"), [
    ("emulator = endpoint is not None", "endpoint is not None"),
    ('why = "x" if endpoint is not None else "y"', "endpoint is not None"),
    ("if self.endpoint is None and not ok: pass", "self.endpoint is None and not ok"),
    ("poll = 0.2 if result.endpoint else 5.0", "result.endpoint"),
    ("apply(emulator=endpoint is not None)", "endpoint is not None"),
    ("if not endpoint: pass", "not endpoint"),
])
def test_the_endpoint_check_finds_a_switch(source: str, switch: str) -> None:
    assert endpoint_switches(source, "example.py") == [(1, switch)]


@pytest.mark.parametrize("source", [
    "client = aws.client(service, region, endpoint, apis)",
    "if apis.emulated: pass",
    "poll_s = apis.stack_poll_s",
    "if emulator is None or emulator.endpoint != self.endpoint: pass",
    "where = self.endpoint or 'AWS'",
])
def test_the_endpoint_check_lets_a_capability_or_a_url_through(source: str) -> None:
    assert endpoint_switches(source, "example.py") == []


def test_every_aws_client_fmcluster_makes_is_handed_its_provider_s_apis() -> None:
    """`aws.client(service, region, endpoint, apis)`: without `apis` botocore's own retries apply, which only tests
    and scripts may take."""
    missing = []
    for path in sorted((ROOT / "src" / "fmcluster").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "client"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "aws"
                    and len(node.args) < 4 and not any(k.arg == "apis" for k in node.keywords)):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, "hand the provider's capabilities.apis to aws.client:\n" + "\n".join(missing)
