"""Hostile `monitoring.smtp` sections and email receivers without one (issue 36 review): on AWS an email receiver
needs a relay (EC2 blocks outbound port 25 and nothing on the controller relays mail); the relay's port, the SES
endpoint's region and ports, the sender, and the credentials' secrets are checked before any stack is touched. Each
is refused with the file, the line, the key and a fix; never a traceback. The credentials reach the controller only
(manifest, IAM), and the rendered Alertmanager configuration names the relay and no password."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from fmcluster.model import load_tenant
from hostile_helpers import ROOT, HOSTILE, assert_refused, spec_text, validate, write_tenant

AMTOOL = "/usr/bin/amtool"
Change = Callable[[dict[str, Any]], Any]
S = "tenant.monitoring.smtp"
SES = "email-smtp.ap-northeast-1.amazonaws.com"
GOOD = {"smarthost": f"{SES}:587", "from": "alerts@example.org", "username_secret": "smtp-username",
        "password_secret": "smtp-password"}


def smtp(**fields: Any) -> Change:
    """stockmark's spec (provider aws, an email receiver) with a valid relay, then `fields` (None removes a key)."""
    def change(t: dict[str, Any]) -> None:
        given = {**GOOD, **fields}
        t["monitoring"]["smtp"] = {k: v for k, v in given.items() if v is not None}
    return change


def no_smtp(t: dict[str, Any]) -> None:
    t["monitoring"].pop("smtp", None)


REFUSED: list[tuple[str, Change, str, tuple[str, ...]]] = [
    ("email-without-relay-on-aws", no_smtp, "tenant.monitoring.alert_receivers[0].type",
     ("an email receiver cannot deliver: EC2 blocks outbound port 25 and nothing on the controller relays mail",
      "set monitoring.smtp to Amazon SES's SMTP endpoint, e.g. smtp: {smarthost: "
      "email-smtp.ap-northeast-1.amazonaws.com:587, from: alerts@example.org, username_secret: smtp-username, "
      "password_secret: smtp-password}")),
    ("port-25-on-aws", smtp(smarthost="smtp.example.org:25"), f"{S}.smarthost",
     ("'smtp.example.org:25' uses port 25, which EC2 blocks outbound by default",
      "use the relay's submission port: 587 (STARTTLS) or 465 (TLS)")),
    ("ses-port-25", smtp(smarthost=f"{SES}:25"), f"{S}.smarthost", ("uses port 25",)),
    ("ses-odd-port", smtp(smarthost=f"{SES}:2525"), f"{S}.smarthost",
     ("Amazon SES's SMTP endpoint does not take submissions on port 2525 here",
      f"use {SES}:587 (STARTTLS), :2587 (STARTTLS) or :465 (TLS)")),
    ("ses-other-region", smtp(smarthost="email-smtp.us-east-1.amazonaws.com:587"), f"{S}.smarthost",
     ("the SES endpoint is in us-east-1, the tenant in ap-northeast-1",)),
    ("port-out-of-range", smtp(smarthost="smtp.example.org:70000"), f"{S}.smarthost", ("port 70000 is not a TCP port",)),
    ("no-port", smtp(smarthost="smtp.example.org"), f"{S}.smarthost", ()),
    ("url-not-host-port", smtp(smarthost="smtps://smtp.example.org:465"), f"{S}.smarthost", ()),
    ("newline-in-host", smtp(smarthost="smtp.example.org:587\nsmtp_require_tls: false"), f"{S}.smarthost", ()),
    ("from-not-an-address", smtp(**{"from": "Alerts <alerts@example.org>"}), f"{S}.from",
     ("'Alerts <alerts@example.org>' is not an e-mail address",)),
    ("no-from", smtp(**{"from": None}), S, ("from",)),
    ("no-smarthost", smtp(smarthost=None), S, ("smarthost",)),
    ("username-without-password", smtp(password_secret=None), f"{S}.username_secret",
     ("username_secret is given without password_secret",)),
    ("password-without-username", smtp(username_secret=None), f"{S}.password_secret",
     ("password_secret is given without username_secret (whose password is it?)",)),
    ("one-secret-for-both", smtp(password_secret="smtp-username"), f"{S}.password_secret",
     ("'smtp-username' is also username_secret: one secret cannot hold both",)),
    ("ses-without-login", smtp(username_secret=None, password_secret=None), S,
     ("Amazon SES's SMTP endpoint takes mail only from an authenticated sender",)),
    ("a-password-not-a-secret-name", smtp(password_secret="hunter 2!"), f"{S}.password_secret", ()),
    ("secret-path-escape", smtp(password_secret="../munge-key"), f"{S}.password_secret", ()),
    ("fmcluster-own-secret", smtp(password_secret="munge-key"), f"{S}.password_secret", ("fmcluster keeps for itself",)),
    ("a-password-in-the-spec", smtp(password="hunter2"), S, ("password",)),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_hostile_smtp_relay_is_refused_with_file_line_key_and_fix(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, case: tuple[str, Change, str, tuple[str, ...]]) -> None:
    _, change, key, fragments = case
    write_tenant(tmp_path, spec_text(change, base="stockmark"))
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, key, fragments)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_sender_or_smarthost_is_refused_never_rendered(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, hostile: str) -> None:
    cases = [("smarthost", f"smtp{hostile}.example.org:587")]
    if hostile != "%":  # '%' may stand in an address's local part (and the template writes JSON scalars anyway)
        cases.append(("from", f"alerts{hostile}@example.org"))
    for key, value in cases:
        write_tenant(tmp_path, spec_text(smtp(**{key: value}), base="stockmark"))
        code, output = validate(tmp_path, monkeypatch)
        assert code == 2 and "Traceback" not in output, output


ACCEPTED: list[tuple[str, Change]] = [
    ("ses-587", smtp()), ("ses-465", smtp(smarthost=f"{SES}:465")), ("ses-2587", smtp(smarthost=f"{SES}:2587")),
    ("own-relay-on-submission-port", smtp(smarthost="smtp.example.org:587", username_secret=None,
                                          password_secret=None)),
    ("own-relay-odd-port", smtp(smarthost="smtp.example.org:2525")),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_a_relay_on_a_submission_port_is_accepted(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, case: tuple[str, Change]) -> None:
    write_tenant(tmp_path, spec_text(case[1], base="stockmark"))
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output


def test_the_local_provider_keeps_an_email_receiver_without_a_relay_and_says_nothing_is_delivered(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def email(t: dict[str, Any]) -> None:
        t["monitoring"]["alert_receivers"] = [{"name": "oncall", "type": "email", "target": "ops@example.org"}]
    write_tenant(tmp_path, spec_text(email))
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output
    from fmcluster.providers.local import LocalProvider  # noqa: PLC0415

    notes = LocalProvider.substrate_notes.__code__.co_consts
    assert any(isinstance(c, str) and "no mail is delivered locally" in c for c in notes)


# --- what the relay's credentials reach ----------------------------------------------------------------------

def stockmark() -> Any:
    return load_tenant("stockmark", ROOT)


def test_stockmark_relays_through_ses_with_credentials_only_the_controller_reads() -> None:
    from fmcluster.accounting import secret_roles
    from fmcluster.stacks.templates.common import secrets_of

    tenant = stockmark()
    assert tenant.monitoring.smtp is not None
    assert tenant.monitoring.smtp.smarthost == "email-smtp.ap-northeast-1.amazonaws.com:587"
    roles = secret_roles(tenant)
    assert roles["smtp-username"] == roles["smtp-password"] == ("controller",)
    assert {"smtp-username", "smtp-password"} <= set(secrets_of(tenant, ["controller"]))
    assert not {"smtp-username", "smtp-password"} & set(secrets_of(tenant, ["login", "compute"]))


def _render_stockmark(**facts: Any) -> str:
    from fmcluster.monitoring import inventory_vars

    defaults = yaml.safe_load((ROOT / "roles/alertmanager/defaults/main.yml").read_text())
    values = {**defaults, **inventory_vars(stockmark(), lambda accelerator: "dlami-base-gpu-ubuntu-24.04"), **facts}
    values["alertmanager_smtp_password_file"] = "/etc/prometheus/fmcluster/alertmanager/smtp-password"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "roles/alertmanager/templates")),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    return env.get_template("alertmanager.yml.j2").render(**values)


def test_stockmark_alertmanager_config_names_the_relay_and_no_password_in_clear() -> None:
    from fmcluster.monitoring import inventory_vars

    variables = inventory_vars(stockmark(), lambda accelerator: "dlami-base-gpu-ubuntu-24.04")
    assert variables["alertmanager_smtp_auth_password_file"] == "/etc/fmcluster/secrets/smtp-password"
    assert "hunter2" not in json.dumps(variables)
    text = _render_stockmark(alertmanager_smtp_auth_username="AKIAEXAMPLE")  # the role's slurp of the user name
    config = yaml.safe_load(text)["global"]
    assert config["smtp_smarthost"] == "email-smtp.ap-northeast-1.amazonaws.com:587"
    assert config["smtp_from"] == "fmcluster-alerts@example.org"
    assert config["smtp_require_tls"] is True
    assert config["smtp_auth_username"] == "AKIAEXAMPLE"
    assert config["smtp_auth_password_file"] == "/etc/prometheus/fmcluster/alertmanager/smtp-password"
    assert "smtp_auth_password" not in config


def test_the_role_gives_alertmanager_a_password_file_only_its_user_reads() -> None:
    tasks = (ROOT / "roles/alertmanager/tasks/main.yml").read_text()
    block = next(t for t in yaml.safe_load(tasks)[1]["block"] if "block" in t)["block"]
    copy = next(t for t in block if "ansible.builtin.copy" in t)["ansible.builtin.copy"]
    assert (copy["owner"], copy["group"], copy["mode"]) == ("root", "{{ alertmanager_user }}", "0640")
    assert all(t.get("no_log") for t in block if "ansible.builtin.slurp" in t or "ansible.builtin.set_fact" in t)


@pytest.mark.skipif(not Path(AMTOOL).exists(), reason="amtool (Debian's prometheus-alertmanager) is not installed")
@pytest.mark.parametrize("inline", [False, True], ids=["password-file", "before-0.25-inline"])
def test_stockmark_alertmanager_config_passes_amtool(tmp_path: Path, inline: bool) -> None:
    facts = {"alertmanager_smtp_auth_username": "AKIAEXAMPLE"}
    if inline:  # what the role writes for Alertmanager before 0.25 (no smtp_auth_password_file): 0640 root:prometheus
        facts["alertmanager_smtp_auth_password"] = "not-a-real-password"
    out = tmp_path / "alertmanager.yml"
    out.write_text(_render_stockmark(**facts))
    done = subprocess.run([AMTOOL, "check-config", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
