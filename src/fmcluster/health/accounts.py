"""Slurm's associations from the tenant's teams and users, converged with `sacctmgr` (no change on a second run).

The slurm_associations role runs `fmcluster-health slurm-associations --config=-` on the controller with the
desired state (a JSON document of role variables the manifest assembled from the tenant) on its standard input. This module
reads what slurmdbd holds (`sacctmgr show qos / assoc / user`, parsable), works out the commands that make it
match, runs them (`sacctmgr --immediate`) and prints what it did as JSON, so Ansible reports `changed` only
when a command ran. Only what the tenant owns is touched: its QoS, the org's account and the accounts under
it, and the associations of users in them; root's account and anything else in the database are left alone.

Order matters to slurmdbd: QoS before the accounts that name them, accounts before users, a user's default
account moved before the association it replaces is deleted, associations before accounts are deleted.

Desired state (every key required):

    {"cluster": "demo", "org_account": "demo",
     "qos": [{"name": "standard", "priority": 0, "max_tres_per_user": "cpu=4,gres/gpu=8"}],
     "accounts": [{"name": "llm", "fairshare": 60, "qos": ["standard", "hero"], "default_qos": "standard"}],
     "users": [{"name": "alice", "accounts": ["llm"], "default_account": "llm"}],
     "removed_users": ["carol"]}
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Mapping, NamedTuple, Set

from fmcluster.health.probe import Probe

Command = List[str]
#: Every tenant QoS refuses a job over its limits at submission (else the job would pend forever).
QOS_FLAGS = "DenyOnLimit"


class Qos(NamedTuple):
    priority: int
    max_tres_per_user: Dict[str, str]
    flags: Set[str]


class AccountAssoc(NamedTuple):
    parent: str
    fairshare: str
    qos: Set[str]
    default_qos: str


class Current(NamedTuple):
    qos: Dict[str, Qos]
    accounts: Dict[str, AccountAssoc]  # account associations (no user) of the cluster
    users: Dict[str, Set[str]]  # user → accounts they have an association in (this cluster)
    default_accounts: Dict[str, str]  # user → default account


class AccountsError(Exception):
    pass


def tres(text: str) -> Dict[str, str]:
    """`cpu=4,gres/gpu=8` → {"cpu": "4", "gres/gpu": "8"} (sacctmgr prints TRES in its own order)."""
    out: Dict[str, str] = {}
    for item in text.split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise AccountsError(f"unreadable TRES {text!r} (expected name=count,...)")
        out[key] = value
    return out


def _rows(text: str, columns: int, what: str) -> List[List[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        # --parsable2 prints exactly `columns` fields; anything else means the output is not what we asked for.
        if len(fields) != columns:
            raise AccountsError(f"sacctmgr show {what}: expected {columns} fields, got {len(fields)} in {line!r}")
        rows.append(fields)
    return rows


def parse_current(qos_text: str, assoc_text: str, user_text: str) -> Current:
    """Parse `sacctmgr -n -P show qos format=Name,Priority,MaxTRESPU,Flags`, `show assoc format=Account,User,
    ParentName,Fairshare,QOS,DefaultQOS` (one cluster) and `show user format=User,DefaultAccount`."""
    qos = {name: Qos(int(priority or 0), tres(max_tres), {f for f in flags.split(",") if f})
           for name, priority, max_tres, flags in _rows(qos_text, 4, "qos")}
    accounts: Dict[str, AccountAssoc] = {}
    users: Dict[str, Set[str]] = {}
    for account, user, parent, fairshare, assoc_qos, default_qos in _rows(assoc_text, 6, "assoc"):
        if user:
            users.setdefault(user, set()).add(account)
        else:
            accounts[account] = AccountAssoc(parent, fairshare, {q for q in assoc_qos.split(",") if q}, default_qos)
    defaults = {user: account for user, account in _rows(user_text, 2, "user")}
    return Current(qos, accounts, users, defaults)


def _tres_setting(wanted: Mapping[str, str], have: Mapping[str, str]) -> str:
    # A limit set before and no longer wanted is cleared with -1.
    items = [f"{k}={v}" for k, v in wanted.items()] + [f"{k}=-1" for k in have if k not in wanted]
    return ",".join(items)


def plan(desired: Mapping[str, Any], current: Current) -> List[Command]:
    """The sacctmgr commands (without `sacctmgr --immediate`) that make `current` what `desired` asks for."""
    cluster = str(desired["cluster"])
    org = str(desired["org_account"])
    where_cluster = f"cluster={cluster}"
    commands: List[Command] = []

    for spec in desired["qos"]:
        name = str(spec["name"])
        wanted_tres = tres(str(spec["max_tres_per_user"]))
        have = current.qos.get(name)
        if have is None:
            commands.append(["add", "qos", name])
            have = Qos(0, {}, set())
        settings = []
        if have.priority != int(spec["priority"]):
            settings.append(f"Priority={int(spec['priority'])}")
        if have.max_tres_per_user != wanted_tres:
            settings.append(f"MaxTRESPerUser={_tres_setting(wanted_tres, have.max_tres_per_user)}")
        if QOS_FLAGS not in have.flags:
            settings.append(f"Flags+={QOS_FLAGS}")
        if settings:
            commands.append(["modify", "qos", "where", f"name={name}", "set", *settings])

    teams = {str(a["name"]): a for a in desired["accounts"]}
    # The org's accounts: the teams asked for and any account under the org's (a team the tenant dropped).
    ours = {org} | set(teams) | {name for name, a in current.accounts.items() if a.parent == org}
    if org not in current.accounts:
        commands.append(["add", "account", org, where_cluster, "parent=root", f"description={org}",
                         f"organization={org}"])
    for name, spec in teams.items():
        wanted_qos = {str(q) for q in spec["qos"]}
        have_account = current.accounts.get(name)
        qos_list = ",".join(str(q) for q in spec["qos"])
        # A team naming no QoS keeps what its account inherits from the org's (Slurm's `normal`).
        qos_settings = [f"qos={qos_list}", f"defaultqos={spec['default_qos']}"] if wanted_qos else []
        if have_account is None:
            commands.append(["add", "account", name, where_cluster, f"parent={org}", f"fairshare={spec['fairshare']}",
                             *qos_settings, f"description={name}", f"organization={org}"])
            continue
        if have_account.parent != org:
            raise AccountsError(f"account {name} exists under {have_account.parent!r}, not the org's account {org!r}; "
                                f"rename the team or move the account (sacctmgr modify account {name} set parent={org})")
        settings = []
        if have_account.fairshare != str(spec["fairshare"]):
            settings.append(f"fairshare={spec['fairshare']}")
        if wanted_qos and have_account.qos != wanted_qos:
            settings.append(f"qos={qos_list}")
        if wanted_qos and have_account.default_qos != str(spec["default_qos"]):
            settings.append(f"defaultqos={spec['default_qos']}")
        if settings:
            commands.append(["modify", "account", "where", f"name={name}", where_cluster, "set", *settings])

    wanted_users = {str(u["name"]): u for u in desired["users"]}
    deletions: List[Command] = []
    for name, spec in wanted_users.items():
        wanted_accounts = [str(a) for a in spec["accounts"]]
        have_accounts = current.users.get(name, set())
        default = str(spec["default_account"])
        for account in wanted_accounts:
            if account not in have_accounts:
                extra = [f"defaultaccount={default}"] if not have_accounts and account == default else []
                commands.append(["add", "user", name, f"account={account}", where_cluster, *extra])
        if have_accounts and current.default_accounts.get(name) != default:
            commands.append(["modify", "user", "where", f"name={name}", where_cluster, "set", f"defaultaccount={default}"])
        for account in sorted(have_accounts & ours - set(wanted_accounts)):
            deletions.append(["delete", "user", "where", f"name={name}", f"account={account}", where_cluster])
    # Users of the org's accounts the tenant no longer lists or marks removed (`removed_users`, for readers):
    # their associations go; their jobs stay in the accounting history, their files on the shared home.
    for name, have_accounts in sorted(current.users.items()):
        if name in wanted_users:
            continue
        for account in sorted(have_accounts & ours):
            deletions.append(["delete", "user", "where", f"name={name}", f"account={account}", where_cluster])
    commands.extend(deletions)
    for name, have_account in sorted(current.accounts.items()):
        if have_account.parent == org and name not in teams:
            commands.append(["delete", "account", "where", f"name={name}", where_cluster])
    return commands


class Sacctmgr:
    def __init__(self, probe: Probe, binary: str = "sacctmgr", timeout: float = 60.0) -> None:
        self.probe, self.binary, self.timeout = probe, binary, timeout

    def show(self, *args: str) -> str:
        done = self.probe.run([self.binary, "--noheader", "--parsable2", "show", *args], timeout=self.timeout)
        if not done.ok:
            raise AccountsError(f"sacctmgr show {args[0]}: {done.why()}")
        return done.stdout

    def current(self, cluster: str) -> Current:
        return parse_current(self.show("qos", "format=Name,Priority,MaxTRESPU,Flags"),
                             self.show("assoc", f"cluster={cluster}",
                                       "format=Account,User,ParentName,Fairshare,QOS,DefaultQOS"),
                             self.show("user", "format=User,DefaultAccount"))

    def apply(self, command: Command) -> None:
        done = self.probe.run([self.binary, "--immediate", *command], timeout=self.timeout)
        if not done.ok:
            raise AccountsError(f"sacctmgr {' '.join(command)}: {done.why()}")


def converge(config_path: str, check: bool, slurm_conf: str = "") -> int:
    """Run (or with `check`, only list) the commands; print {"changed", "commands"} as JSON. Exit 0, or 2 with
    the failing command on stderr (nothing after it runs: the next converge picks up from what slurmdbd has)."""
    if config_path == "-":
        desired = json.load(sys.stdin)
    else:
        with open(config_path, encoding="utf-8") as handle:
            desired = json.load(handle)
    sacctmgr = Sacctmgr(Probe({"SLURM_CONF": slurm_conf} if slurm_conf else None))
    done: List[Command] = []
    try:
        commands = plan(desired, sacctmgr.current(str(desired["cluster"])))
        for command in commands:
            if not check:
                sacctmgr.apply(command)
            done.append(command)
    except (AccountsError, KeyError, ValueError) as err:
        print(json.dumps({"changed": bool(done), "commands": [" ".join(c) for c in done]}))
        print(f"fmcluster-health slurm-associations: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"changed": bool(done), "commands": [" ".join(c) for c in done]}))
    return 0
