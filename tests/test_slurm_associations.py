"""The sacctmgr planner (fmcluster.health.accounts): from what slurmdbd prints to the commands that make it match
the tenant's teams, users and QoS, and nothing on a second run. The e2e tier runs it against a real slurmdbd."""

from __future__ import annotations

from typing import Any

import pytest

from fmcluster.health.accounts import AccountsError, Current, parse_current, plan, tres

DESIRED: dict[str, Any] = {
    "cluster": "demo", "org_account": "demo",
    "qos": [{"name": "standard", "priority": 0, "max_tres_per_user": "cpu=4"},
            {"name": "hero", "priority": 100, "max_tres_per_user": ""}],
    "accounts": [{"name": "llm", "fairshare": 60, "qos": ["standard", "hero"], "default_qos": "standard"},
                 {"name": "vision", "fairshare": 40, "qos": ["standard"], "default_qos": "standard"}],
    "users": [{"name": "alice", "accounts": ["llm"], "default_account": "llm"},
              {"name": "bob", "accounts": ["vision", "llm"], "default_account": "vision"}],
    "removed_users": [],
}

# What sacctmgr 22.05 prints (-n -P) on a cluster fmcluster has not touched yet.
FRESH_QOS = "normal|0||\n"
FRESH_ASSOC = "root||||normal|\nroot|root||1|normal|\n"
FRESH_USERS = "root|root\n"

# And once the plan for DESIRED ran (sacctmgr's own spelling: TRES in its order, QoS sorted, shares as numbers).
CONVERGED_QOS = "normal|0||\nstandard|0|cpu=4|DenyOnLimit\nhero|100||DenyOnLimit\n"
CONVERGED_ASSOC = """root||||normal|
root|root||1|normal|
demo||root|1|normal|
llm||demo|60|hero,standard|standard
llm|alice||1|hero,standard|standard
llm|bob||1|hero,standard|standard
vision||demo|40|standard|standard
vision|bob||1|standard|standard
"""
CONVERGED_USERS = "alice|llm\nbob|vision\nroot|root\n"


def converged() -> Current:
    return parse_current(CONVERGED_QOS, CONVERGED_ASSOC, CONVERGED_USERS)


def test_a_fresh_cluster_gets_qos_then_accounts_then_users() -> None:
    commands = [" ".join(c) for c in plan(DESIRED, parse_current(FRESH_QOS, FRESH_ASSOC, FRESH_USERS))]
    assert commands == [
        "add qos standard",
        "modify qos where name=standard set MaxTRESPerUser=cpu=4 Flags+=DenyOnLimit",
        "add qos hero",
        "modify qos where name=hero set Priority=100 Flags+=DenyOnLimit",
        "add account demo cluster=demo parent=root description=demo organization=demo",
        "add account llm cluster=demo parent=demo fairshare=60 qos=standard,hero defaultqos=standard "
        "description=llm organization=demo",
        "add account vision cluster=demo parent=demo fairshare=40 qos=standard defaultqos=standard "
        "description=vision organization=demo",
        "add user alice account=llm cluster=demo defaultaccount=llm",
        "add user bob account=vision cluster=demo defaultaccount=vision",
        "add user bob account=llm cluster=demo",
    ]


def test_a_converged_cluster_needs_nothing() -> None:
    assert plan(DESIRED, converged()) == []


def test_changes_touch_only_what_changed_and_default_moves_before_deletion() -> None:
    desired = {**DESIRED,
               "qos": [{"name": "standard", "priority": 0, "max_tres_per_user": "gres/gpu=8"},
                       {"name": "hero", "priority": 100, "max_tres_per_user": ""}],
               "accounts": [{"name": "llm", "fairshare": 70, "qos": ["standard", "hero"], "default_qos": "standard"}],
               "users": [{"name": "bob", "accounts": ["llm"], "default_account": "llm"}],
               "removed_users": ["alice"]}
    commands = [" ".join(c) for c in plan(desired, converged())]
    assert commands == [
        "modify qos where name=standard set MaxTRESPerUser=gres/gpu=8,cpu=-1",
        "modify account where name=llm cluster=demo set fairshare=70",
        "modify user where name=bob cluster=demo set defaultaccount=llm",
        "delete user where name=bob account=vision cluster=demo",
        "delete user where name=alice account=llm cluster=demo",
        "delete account where name=vision cluster=demo",
    ]


def test_an_account_of_another_parent_is_refused_not_moved() -> None:
    current = parse_current(FRESH_QOS, FRESH_ASSOC + "llm||physics|1|normal|\n", FRESH_USERS)
    with pytest.raises(AccountsError, match="llm exists under 'physics'"):
        plan(DESIRED, current)


def test_root_and_other_orgs_are_never_touched() -> None:
    current = parse_current(CONVERGED_QOS, CONVERGED_ASSOC + "other||root|1|normal|\nother|eve||1|normal|\n",
                            CONVERGED_USERS + "eve|other\n")
    assert plan(DESIRED, current) == []


@pytest.mark.parametrize("text", ["normal|0|\n", "normal|0|||x\n"])
def test_unexpected_sacctmgr_output_fails_closed(text: str) -> None:
    with pytest.raises(AccountsError, match="expected 4 fields"):
        parse_current(text, "", "")


def test_unreadable_tres_fails_closed() -> None:
    with pytest.raises(AccountsError, match="unreadable TRES"):
        tres("cpu")
