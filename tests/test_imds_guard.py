"""roles/imds_guard: the script that keeps IMDS for root (and named daemons) builds the rule once and then
leaves it alone. This machine has no iptables (and must not have its own firewall changed by a test), so the
script runs against a stand-in that keeps iptables's chains the way `iptables -S` prints them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import jinja2
import yaml

from conftest import ROOT

ROLE = ROOT / "roles" / "imds_guard"

FAKE = f"#!{sys.executable} -IS\n" + textwrap.dedent('''\
    """iptables as far as the guard uses it: -w -S/-N/-F/-A/-C/-I, state in $FAKE_IPTABLES_STATE."""
    import json, os, sys
    tool = os.path.basename(sys.argv[0])
    path = os.environ["FAKE_IPTABLES_STATE"]
    state = json.load(open(path)) if os.path.exists(path) else {}
    chains = state.setdefault(tool, {"OUTPUT": []})
    args = [a for a in sys.argv[1:] if a != "-w"]
    op, chain, rule = args[0], args[1], " ".join(args[2:])
    code = 0
    if op == "-S":
        if chain not in chains:
            code = 1
        else:
            print("\\n".join([f"-N {chain}"] + [f"-A {chain} {r}" for r in chains[chain]]))
    elif op == "-N":
        code = 1 if chain in chains else 0
        chains.setdefault(chain, [])
    elif op == "-F":
        chains[chain] = []
    elif op == "-A":
        chains[chain].append(rule)
    elif op == "-C":
        code = 0 if rule in chains.get(chain, []) else 1
    elif op == "-I":
        chains[chain].insert(int(args[2]) - 1, " ".join(args[3:]))
    json.dump(state, open(path, "w"))
    sys.exit(code)
''')


def render(users: list[str]) -> str:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    return env.from_string((ROLE / "templates" / "fmcluster-imds-guard.sh.j2").read_text()).render(
        **{**defaults, "imds_guard_allowed_users": users})


def run_guard(tmp_path: Path, users: list[str]) -> tuple[str, dict[str, dict[str, list[str]]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("iptables", "ip6tables"):
        (bin_dir / tool).write_text(FAKE)
        (bin_dir / tool).chmod(0o755)
    script = tmp_path / "guard.sh"
    script.write_text(render(users))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_IPTABLES_STATE": str(tmp_path / "state.json")}
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip(), json.loads((tmp_path / "state.json").read_text())


def test_only_root_and_the_named_accounts_pass_then_everything_else_is_rejected(tmp_path: Path) -> None:
    out, state = run_guard(tmp_path, ["nobody"])
    assert out == "changed"
    nobody = subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True, check=True).stdout.strip()
    assert state["iptables"]["FMCLUSTER-IMDS"] == [
        "-m owner --uid-owner 0 -j RETURN", f"-m owner --uid-owner {nobody} -j RETURN",
        "-j REJECT --reject-with icmp-port-unreachable"]
    assert state["iptables"]["OUTPUT"] == ["-d 169.254.169.254/32 -j FMCLUSTER-IMDS"]
    assert state["ip6tables"]["OUTPUT"] == ["-d fd00:ec2::254/128 -j FMCLUSTER-IMDS"]
    assert state["ip6tables"]["FMCLUSTER-IMDS"][-1] == "-j REJECT --reject-with icmp6-port-unreachable"


def test_a_second_run_changes_nothing_and_a_changed_list_is_rewritten_once(tmp_path: Path) -> None:
    run_guard(tmp_path, [])
    out, state = run_guard(tmp_path, [])
    assert out == "unchanged"
    assert state["iptables"]["OUTPUT"] == ["-d 169.254.169.254/32 -j FMCLUSTER-IMDS"], "the jump is not repeated"
    out, state = run_guard(tmp_path, ["nobody"])
    assert out == "changed" and len(state["iptables"]["FMCLUSTER-IMDS"]) == 3
    assert run_guard(tmp_path, ["nobody"])[0] == "unchanged"

