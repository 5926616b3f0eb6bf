"""Hostile `users:`, `teams:` and `qos:` entries (issue 28): duplicate ids, reserved names, bad keys, unknown
references, teams without Slurm accounting. Each is refused with the file, the line, the key and a fix; never a
traceback. Valid entries holding characters that matter to YAML or Jinja (an ssh key's comment) land as data in
every rendered artefact, the generated inventory included."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmcluster.model import TenantInvalid, load_tenant
from fmcluster.validation import reserved_accounts
from hostile_helpers import ROOT, assert_refused, assert_same_structure, spec_text, validate, write_tenant

Change = Callable[[dict[str, Any]], Any]
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII4mUbGX38GZN2g9pN0PQcLrApTW08GexA8Qz6zdAfqf alice@laptop"
ED25519_BLOB = ED25519.split()[1]


def wire(*parts: bytes) -> str:
    return base64.b64encode(b"".join(len(p).to_bytes(4, "big") + p for p in parts)).decode()


def people(qos: list[dict[str, Any]] | None = None, teams: list[dict[str, Any]] | None = None,
           users: list[dict[str, Any]] | None = None, **tenant: Any) -> Change:
    """The demo spec with a valid team `llm` (gid 30010, QoS normal) and user alice (20001), then the given
    sections (None keeps the valid one)."""
    def change(t: dict[str, Any]) -> None:
        t["qos"] = [{"name": "normal"}] if qos is None else qos
        t["teams"] = [{"name": "llm", "gid": 30010}] if teams is None else teams
        t["users"] = [{"name": "alice", "uid": 20001, "teams": ["llm"], "ssh_keys": [ED25519]}] if users is None else users
        t.update(tenant)
    return change


def user(**fields: Any) -> dict[str, Any]:
    return {"name": "bob", "uid": 20002, "teams": ["llm"], **fields}


def team(**fields: Any) -> dict[str, Any]:
    return {"name": "vision", "gid": 30011, **fields}


def with_key(key: str) -> Change:
    return people(users=[user(ssh_keys=[key])])


U = "tenant.users"
T = "tenant.teams"
REFUSED: list[tuple[str, Change, str, tuple[str, ...]]] = [
    # --- ids -----------------------------------------------------------------------------------------------
    ("uid-duplicate", people(users=[user(uid=20001), user(name="carol", uid=20001)]), f"{U}[1].uid",
     ("id 20001 is already the uid of users[0]",)),
    ("uid-equals-team-gid", people(users=[user(uid=30010)]), f"{U}[0].uid", ("already the gid of teams[0]",)),
    ("gid-duplicate", people(teams=[team(gid=30010), team(name="llm", gid=30010)]), f"{T}[1].gid", ("already",)),
    ("uid-root", people(users=[user(uid=0)]), f"{U}[0].uid", ("out of range", "1000 to 59999")),
    ("uid-slurm-daemon", people(users=[user(uid=401)]), f"{U}[0].uid", ("fixed id of the slurm daemon",)),
    ("gid-munge-daemon", people(teams=[team(gid=402), team(name="llm", gid=30010)]), f"{T}[0].gid",
     ("fixed id of the munge daemon",)),
    ("uid-nobody", people(users=[user(uid=65534)]), f"{U}[0].uid", ("out of range",)),
    ("uid-60000", people(users=[user(uid=60000)]), f"{U}[0].uid", ("out of range",)),
    ("uid-float", people(users=[user(uid=20002.0)]), f"{U}[0].uid", ("write 20002, without the decimal point",)),
    ("uid-string", people(users=[user(uid="20002")]), f"{U}[0].uid", ("expected a whole number",)),
    ("uid-missing", people(users=[{"name": "bob", "teams": ["llm"]}]), f"{U}[0]", ("missing required key 'uid'",)),
    # --- names ---------------------------------------------------------------------------------------------
    ("user-root", people(users=[user(name="root")]), f"{U}[0].name", ("'root' is reserved",)),
    ("user-slurm", people(users=[user(name="slurm")]), f"{U}[0].name", ("'slurm' is reserved", "daemon account")),
    ("user-ubuntu", people(users=[user(name="ubuntu")]), f"{U}[0].name", ("'ubuntu' is reserved",)),
    ("user-www-data", people(users=[user(name="www-data")]), f"{U}[0].name", ("reserved",)),
    ("user-fmcluster", people(users=[user(name="fmcluster")]), f"{U}[0].name", ("reserved",)),
    ("team-sudo", people(teams=[team(name="sudo"), team(name="llm", gid=30010)]), f"{T}[0].name",
     ("'sudo' is reserved",)),
    ("team-is-org-account", people(teams=[team(name="acme"), team(name="llm", gid=30010)]), f"{T}[0].name",
     ("the organization's own Slurm account",)),
    ("user-name-duplicate", people(users=[user(), user(uid=20003)]), f"{U}[1].name", ("used twice",)),
    ("team-name-duplicate", people(teams=[team(name="llm"), team(name="llm", gid=30010)]), f"{T}[1].name",
     ("used twice",)),
    ("qos-name-duplicate", people(qos=[{"name": "normal"}, {"name": "normal", "priority": 3}]), "tenant.qos[1].name",
     ("used twice",)),
    ("user-named-as-team", people(users=[user(name="llm")]), f"{U}[0].name", ("also the name of teams[0]",)),
    ("user-uppercase", people(users=[user(name="Bob")]), f"{U}[0].name", ("has the wrong form", "lower-case")),
    ("user-leading-dash", people(users=[user(name="-bob")]), f"{U}[0].name", ("has the wrong form",)),
    ("user-33-chars", people(users=[user(name="b" * 33)]), f"{U}[0].name", ("has the wrong form",)),
    ("user-colon", people(users=[user(name="bob:x")]), f"{U}[0].name", ("has the wrong form",)),
    ("team-dash", people(teams=[team(name="llm-a"), team(name="llm", gid=30010)]), f"{T}[0].name",
     ("has the wrong form",)),
    ("qos-space", people(qos=[{"name": "normal"}, {"name": "hero run"}]), "tenant.qos[1].name", ("has the wrong form",)),
    # --- references ----------------------------------------------------------------------------------------
    ("user-unknown-team", people(users=[user(teams=["lmm"])]), f"{U}[0].teams[0]",
     ("not a team of `teams:`", "did you mean 'llm'")),
    ("user-no-team", people(users=[user(teams=[])]), f"{U}[0].teams", ("the list is empty",)),
    ("user-team-twice", people(users=[user(teams=["llm", "llm"])]), f"{U}[0].teams", ("repeats an entry",)),
    ("team-unknown-qos", people(teams=[team(qos=["hero"]), team(name="llm", gid=30010)]), f"{T}[0].qos[0]",
     ("not a QoS of `qos:`", "use one of: normal")),
    ("team-qos-without-section", people(qos=[], teams=[team(qos=["normal"])], users=[user(teams=["vision"])]),
     f"{T}[0].qos[0]", ("declare it under `qos:` first",)),
    ("team-no-qos-no-normal", people(qos=[{"name": "hero"}]), f"{T}[0]", ("none named normal",)),
    ("users-without-teams-section", people(teams=[]), f"{U}[0].teams[0]", ("declare the team under `teams:` first",)),
    # --- limits ----------------------------------------------------------------------------------------------
    ("qos-negative-gpus", people(qos=[{"name": "normal", "max_gpus_per_user": -1}]), "tenant.qos[0].max_gpus_per_user",
     ("out of range",)),
    ("qos-zero-nodes", people(qos=[{"name": "normal", "max_nodes_per_user": 0}]), "tenant.qos[0].max_nodes_per_user",
     ("out of range",)),
    ("qos-unknown-limit", people(qos=[{"name": "normal", "max_gpu_per_user": 8}]), "tenant.qos[0].max_gpu_per_user",
     ("did you mean 'max_gpus_per_user'",)),
    ("team-fairshare-zero", people(teams=[team(name="llm", gid=30010, fairshare=0)]), f"{T}[0].fairshare",
     ("out of range",)),
    ("removed-as-text", people(users=[user(removed="yes")]), f"{U}[0].removed", ("expected true or false",)),
    # --- accounting ------------------------------------------------------------------------------------------
    ("teams-without-accounting", people(accounting={"enabled": False}), T, ("accounting.enabled is false", "slurmdbd")),
    # --- ssh keys --------------------------------------------------------------------------------------------
    ("key-options", with_key('command="/bin/sh" ' + ED25519), f"{U}[0].ssh_keys[0]", ("authorized_keys options",)),
    ("key-from-option", with_key('from="*" ' + ED25519), f"{U}[0].ssh_keys[0]", ("authorized_keys options",)),
    ("key-newline", with_key(ED25519 + "\nssh-ed25519 " + ED25519_BLOB + " mallory"), f"{U}[0].ssh_keys[0]",
     ("U+000A",)),
    ("key-dsa", with_key("ssh-dss AAAAB3NzaC1kc3MAAACBAP"), f"{U}[0].ssh_keys[0]", ("DSA keys are refused",)),
    ("key-unknown-type", with_key("ssh-ed448 " + ED25519_BLOB), f"{U}[0].ssh_keys[0]", ("the key type is not one of",)),
    ("key-not-base64", with_key("ssh-ed25519 AAAA!!!!"), f"{U}[0].ssh_keys[0]", ("not valid base64",)),
    ("key-type-mismatch", with_key("ssh-rsa " + ED25519_BLOB), f"{U}[0].ssh_keys[0]",
     ("its data is a key of another type (ssh-ed25519)",)),
    ("key-rsa-1024", with_key("ssh-rsa " + wire(b"ssh-rsa", b"\x01\x00\x01", b"\x00" + b"\xc3" * 128)),
     f"{U}[0].ssh_keys[0]", ("1024 bits",)),
    ("key-private", with_key("-----BEGIN OPENSSH PRIVATE KEY-----"), f"{U}[0].ssh_keys[0]", ("private key",)),
    ("key-cut", with_key("ssh-ed25519 " + wire(b"ssh-ed25519")), f"{U}[0].ssh_keys[0]", ("cut short",)),
    ("key-jinja-comment", with_key(ED25519 + " {{ lookup('pipe', 'id') }}"), f"{U}[0].ssh_keys[0]", ("templates",)),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_hostile_people_entry_is_refused_with_file_line_key_and_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, Change, str, tuple[str, ...]]) -> None:
    _, change, key, fragments = case
    write_tenant(tmp_path, spec_text(change))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, key, fragments)


def test_the_valid_people_spec_the_cases_start_from_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tenant(tmp_path, spec_text(people(users=[user(), user(name="carol", uid=20003, removed=True)])))
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output


def test_a_key_comment_with_structural_characters_lands_as_data(tmp_path: Path) -> None:
    """Quotes, `: `, `#`, `$(...)` in a key's comment are inert in authorized_keys: accepted, and every rendered
    artefact (the inventory with the users' variables included) has the structure the plain comment gives."""
    hostile = "alice@laptop: \"work\" #1 $(id) 'x' [a] {b} & *c"
    plain_text = spec_text(with_key(ED25519.replace("alice@laptop", "zzcommentzz")))
    hostile_text = spec_text(with_key(ED25519.replace("alice@laptop", hostile)))
    assert_same_structure(tmp_path, [("zzcommentzz", hostile)], plain_text, hostile_text)


# --- property: the names validator ---------------------------------------------------------------------------
RESERVED = sorted(reserved_accounts()[0])


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.text(max_size=40), st.from_regex(r"[a-z_][a-z0-9_-]{0,31}", fullmatch=True),
                      st.sampled_from(RESERVED)),
       uid=st.one_of(st.integers(-5, 70000), st.sampled_from([401, 402, 1000, 59999, 30010, 20001])))
def test_any_user_name_and_uid_is_refused_at_its_key_or_loads_as_written(tmp_path: Path, name: str, uid: int) -> None:
    write_tenant(tmp_path, spec_text(people(users=[user(name="alice", uid=20001), user(name=name, uid=uid)])))
    try:
        tenant = load_tenant("acme", tmp_path)
    except TenantInvalid as err:
        assert err.problems and all(p.fix for p in err.problems), err.render()
        assert all(p.key.startswith("tenant.users[1]") for p in err.problems), err.render()
        return
    loaded = tenant.users[1]
    assert (loaded.name, loaded.uid) == (name, uid)
    assert name not in RESERVED and name not in ("alice", "llm") and 1000 <= uid <= 59999
    assert uid not in (20001, 30010)


def test_teams_on_a_parallelcluster_tenant_need_its_slurm_accounting(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def pclab(accounting: bool) -> str:
        doc = yaml.safe_load((ROOT / "inventories/pclab/group_vars/all/tenant.yml").read_text())
        doc["tenant"]["org"] = "acme"
        people()(doc["tenant"])
        if not accounting:
            del doc["tenant"]["parallelcluster"]["accounting"]
        return yaml.safe_dump(doc, sort_keys=False)

    write_tenant(tmp_path, pclab(accounting=False))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, "tenant.teams", ("no Slurm accounting", "add `accounting: {}` under parallelcluster"))
    write_tenant(tmp_path, pclab(accounting=True))
    code, output = validate(tmp_path, monkeypatch)
    assert "tenant.teams" not in output and "tenant.users" not in output, output
