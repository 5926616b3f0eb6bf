"""Property: whatever text is written into any string field of the schema, validation answers without a
traceback; it either refuses the value naming that field with a fix, or accepts it, and then every template
the value reaches parses to the structure a plain value gives, with the value landing whole, as data."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmcluster.model import TenantInvalid, load_tenant
from fmcluster.validation import _resolve, dotted, load_schema
from hostile_helpers import HOSTILE, base_doc, occurrences, render_all, set_path, shape, write_tenant


def string_fields(node: dict[str, Any] | None = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path of the schema whose value is a string, free or from an enum (list items as index 0)."""
    schema = load_schema()
    node = schema if node is None else node
    if "$ref" in node:
        node = {**_resolve(schema, node["$ref"]), **node}
    if node.get("type") == "string" or all(isinstance(v, str) for v in node.get("enum", [0])):
        yield path
    for key, sub in node.get("properties", {}).items():
        yield from string_fields(sub, (*path, key))
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        yield from string_fields(node["items"], (*path, "0"))


# A spec where every optional string field is present, so each can be replaced.
FULL = base_doc("demo")
FULL["tenant"]["network"].update(vpc_cidr="10.0.0.0/16", ssh_ingress_cidr="203.0.113.0/24")
FULL["tenant"]["queues"][0].update(capacity_reservation_id="cr-0123456789abcdef0", accelerator="none")
FULL["tenant"]["storage"]["lustre"]["mount_point"] = "/fsx"
FULL["tenant"]["storage"]["lustre"]["data_repository"].update(s3_prefix="data/", import_policy=["NEW"],
                                                              export_policy=["NEW"])
FULL["tenant"]["storage"]["openzfs"] = {"storage_capacity_gib": 128, "throughput_mbps": 128, "mount_point": "/home"}
FULL["tenant"]["monitoring"]["remote_write_url"] = \
    "https://aps-workspaces.ap-northeast-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"
FULL["tenant"]["monitoring"]["alert_receivers"] = [{"name": "hook", "type": "webhook", "target": "https://h.example.org/x"}]
FULL["tenant"]["qos"] = [{"name": "normal", "priority": 1, "max_gpus_per_user": 8, "max_cpus_per_user": 64,
                         "max_nodes_per_user": 4}]
FULL["tenant"]["teams"] = [{"name": "llm", "gid": 30010, "fairshare": 2, "qos": ["normal"]}]
FULL["tenant"]["users"] = [{"name": "alice", "uid": 20001, "teams": ["llm"], "removed": False, "ssh_keys": [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII4mUbGX38GZN2g9pN0PQcLrApTW08GexA8Qz6zdAfqf alice@laptop"]}]
#: Entries that refer to another's name (a team's QoS, a user's team): renaming the one referred to is refused at
#: the reference, whose message quotes the old name.
REFERRING = ("tenant.teams[0].qos", "tenant.users[0].teams")


def _get(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = doc
    for part in path:
        node = node[int(part)] if part.isdigit() else node[part]
    return node


def _present(doc: dict[str, Any], path: tuple[str, ...]) -> bool:
    try:
        _get(doc, path)
    except (KeyError, IndexError):
        return False
    return True


# Fields of sections FULL does not hold (a scheduler-specific section, say) need FULL extended to be covered.
FIELDS = [path for path in string_fields() if path[:1] == ("tenant",) and _present(FULL, path)]


def test_the_full_spec_is_valid_and_holds_every_string_field(tmp_path: Path) -> None:
    assert len(FIELDS) >= 25
    for path in FIELDS:
        assert isinstance(_get(FULL, path), str), path
    write_tenant(tmp_path, yaml.safe_dump(FULL))
    load_tenant("acme", tmp_path)


# Values of the form each field accepts, so the accepted branch (render and compare) is exercised too.
NAME = r"[a-z][a-z0-9]{0,6}(-[a-z0-9]{1,4})?"
VALID_FORMS = {
    "programme": r"[A-Za-z0-9][A-Za-z0-9 _.:/=+@-]{0,20}",
    "availability_zone": r"ap-northeast-1[a-d]",
    "name": NAME,
    "capacity_reservation_id": r"cr-[0-9a-f]{8,17}",
    "ssh_ingress_cidr": r"203\.0\.113\.(0/24|128/25|64/26)|10\.0\.0\.0/(8|16)",
    "mount_point": r"/(fsx|scratch|shared)[a-z0-9._-]{0,8}",
    "file_system_path": r"/[a-z0-9._-]{1,8}(/[a-z0-9._-]{1,8})?",
    "s3_prefix": r"([a-z0-9._-]{1,6}/){0,3}",
    "target": r"https://hooks\.example\.org/[A-Za-z0-9._~:/?#@!$&'()*+,;=-]{0,20}",
}


def _values(path: tuple[str, ...]) -> st.SearchStrategy[str]:
    valid = _get(FULL, path)
    strategies = [
        # Arbitrary text, and the field's valid value with a structural fragment spliced in somewhere.
        st.text(max_size=30),
        st.builds(lambda cut, h, tail: valid[:cut] + h + tail, st.integers(0, len(valid)), st.sampled_from(HOSTILE),
                  st.text(alphabet="abc-_./: #'\"{}$", max_size=4)),
    ]
    form = VALID_FORMS.get(path[-1] if path[-1] != "name" or path[-3] != "queues" else "name")
    if path[-2:] == ("0", "name") and path[-3] == "queues":
        form = NAME
    if form:
        strategies.append(st.from_regex(form, fullmatch=True))
    return st.one_of(*strategies)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("properties")


@pytest.fixture(scope="module")
def plain_render(workdir: Path) -> dict[str, Any]:
    write_tenant(workdir, yaml.safe_dump(FULL))
    return render_all(load_tenant("acme", workdir))


@pytest.mark.parametrize("path", FIELDS, ids=lambda p: ".".join(p))
def test_any_text_in_a_string_field_is_refused_clearly_or_stays_data(path: tuple[str, ...], workdir: Path,
                                                                     plain_render: dict[str, Any]) -> None:
    key = dotted(int(p) if p.isdigit() else p for p in path)
    section = dotted(int(p) if p.isdigit() else p for p in path[:-2] or path[:1])
    valid = _get(FULL, path)

    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(_values(path))
    def check(value: str) -> None:
        doc = copy.deepcopy(FULL)
        set_path(doc["tenant"], ".".join(path[1:]), value)
        write_tenant(workdir, yaml.safe_dump(doc, allow_unicode=False))
        try:
            tenant = load_tenant("acme", workdir)
        except TenantInvalid as err:
            rendered = err.render()
            assert err.problems and all(p.fix for p in err.problems), rendered
            # Named at the field, or at the sibling it clashes with (a Lustre mount equal to OpenZFS's is reported
            # at openzfs.mount_point): within the same section either way.
            assert any(p.key == key or p.key.startswith(section)
                       or (p.key.startswith(REFERRING) and f"'{valid}'" in p.message) for p in err.problems), \
                f"{key} not named in\n{rendered}"
            return
        if value == valid or path[-1] == "org":
            return
        hostile_render = render_all(tenant)
        for artefact, plain in plain_render.items():
            assert shape(hostile_render[artefact]) == shape(plain), f"{artefact}: {value!r} changed the structure"
        reached = [a for a, plain in plain_render.items() if occurrences(plain, valid)]
        assert not reached or any(occurrences(hostile_render[a], value) for a in reached), \
            f"{value!r} is found whole in none of {reached}"

    check()


def number_fields(node: dict[str, Any] | None = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path of the schema whose value is a number, free or from an enum."""
    schema = load_schema()
    node = schema if node is None else node
    if "$ref" in node:
        node = {**_resolve(schema, node["$ref"]), **node}
    if node.get("type") in ("integer", "number"):
        yield path
    for key, sub in node.get("properties", {}).items():
        yield from number_fields(sub, (*path, key))
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        yield from number_fields(node["items"], (*path, "0"))


FULL["tenant"]["acceptance"]["min_busbw_gbps"] = 10.0
NUMBER_FIELDS = [path for path in number_fields() if path[:1] == ("tenant",) and _present(FULL, path)]


@pytest.mark.parametrize("path", NUMBER_FIELDS, ids=lambda p: ".".join(p))
def test_any_value_in_a_number_field_is_refused_clearly_or_builds_a_tenant(path: tuple[str, ...],
                                                                           workdir: Path) -> None:
    key = dotted(int(p) if p.isdigit() else p for p in path)

    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.one_of(st.integers(), st.integers(-3, 5000), st.floats(), st.booleans(), st.none(),
                     st.text(max_size=6), st.lists(st.integers(), max_size=2)))
    def check(value: Any) -> None:
        doc = copy.deepcopy(FULL)
        set_path(doc["tenant"], ".".join(path[1:]), value)
        write_tenant(workdir, yaml.safe_dump(doc, allow_unicode=False))
        try:
            load_tenant("acme", workdir)
        except TenantInvalid as err:
            assert all(p.fix for p in err.problems), err.render()
            assert any(p.key.startswith(key) or key.startswith(p.key.split("[")[0]) for p in err.problems), \
                f"{key} not named in\n{err.render()}"

    check()
