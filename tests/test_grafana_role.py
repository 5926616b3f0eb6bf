"""roles/grafana on this host (a local connection, every path under a temporary directory): grafana.ini listens on
the controller's loopback, takes the admin password from the generated secret's file (never the package's
admin/admin, never the value in a readable file), with anonymous access and sign-up off; a Grafana to install
without the generated password is refused before anything is installed (issue 42). Grafana itself is not
packaged by Debian, so its login with that password is checked by the role on AWS (tasks/admin.yml)."""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import Any

import pytest

from role_helpers import converge_role

pytestmark = pytest.mark.slow


def converge(tmp: Path, variables: dict[str, Any], *extra: str) -> tuple[int, int, str]:
    return converge_role("grafana", tmp, variables, *extra)


def paths(tmp: Path) -> dict[str, Any]:
    return {"grafana_provisioning_dir": str(tmp / "grafana" / "provisioning"),
            "grafana_dashboards_dir": str(tmp / "lib" / "dashboards"),
            "grafana_config_file": str(tmp / "grafana" / "grafana.ini"),
            "grafana_admin_password_file": str(tmp / "secrets" / "grafana-admin-password"),
            "grafana_admin_password_copy": str(tmp / "grafana" / "fmcluster-admin-password")}


def test_grafana_ini_binds_loopback_with_the_generated_password_and_no_anonymous_access(tmp_path: Path) -> None:
    code, changed, out = converge(tmp_path, paths(tmp_path))
    assert code == 0 and changed > 0, out[-4000:]
    ini = tmp_path / "grafana" / "grafana.ini"
    config = configparser.ConfigParser(interpolation=None)
    config.read_string(ini.read_text())
    assert (config["server"]["http_addr"], config["server"]["http_port"]) == ("127.0.0.1", "3000")
    assert config["security"]["admin_password"] == f"$__file{{{tmp_path / 'grafana' / 'fmcluster-admin-password'}}}"
    assert config["auth.anonymous"]["enabled"] == "false"
    assert config["users"]["allow_sign_up"] == "false"
    assert "admin_password = admin" not in ini.read_text()

    code, changed, out = converge(tmp_path, paths(tmp_path))
    assert (code, changed) == (0, 0), out[-4000:]
    code, changed, out = converge(tmp_path, paths(tmp_path), "--check", "--diff")
    assert (code, changed) == (0, 0), out[-4000:]


def test_grafana_to_install_without_the_generated_password_is_refused_before_anything_is_installed(
        tmp_path: Path) -> None:
    code, _, out = converge(tmp_path, {**paths(tmp_path), "grafana_install": True})
    assert code != 0
    assert (f"{tmp_path / 'secrets' / 'grafana-admin-password'} is missing or empty on localhost: Grafana would keep "
            "the package's admin/admin") in " ".join(out.split()), out[-3000:]
    assert "Install Grafana" not in out and not (tmp_path / "grafana").exists()
