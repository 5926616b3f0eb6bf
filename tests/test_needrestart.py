"""needrestart restarts nothing on a node: the bootstrap tells it so before the node's first apt transaction.

Ubuntu's server images run needrestart after every apt transaction (unattended-upgrade's too), and since Ubuntu 24.04
it restarts every service that maps a replaced library, in noninteractive runs as well
(https://discourse.ubuntu.com/t/needrestart-changes-in-ubuntu-24-04-service-restarts/44671). A node's first boot runs
inside cloud-final.service, which needrestart then restarts too (https://github.com/canonical/cloud-init/issues/5109:
cloud-init's final stage gets SIGTERM mid-run), with the bootstrap, the agent and ansible-pull running under it.
slurm-ec2's nodes boot the Ubuntu 24.04 DLAMIs (data/images.yml ec2_images).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fmcluster.paths import NODE_BOOT_DIR

BOOTSTRAP = NODE_BOOT_DIR / "node-bootstrap.sh"
CONF_DIR = "/etc/needrestart/conf.d"


def _lines() -> list[str]:
    return BOOTSTRAP.read_text(encoding="utf-8").splitlines()


def _first(pattern: str) -> int:
    return next(i for i, line in enumerate(_lines()) if re.search(pattern, line) and not line.lstrip().startswith("#"))


def test_the_bootstrap_writes_the_needrestart_policy_before_any_apt_transaction_in_every_mode() -> None:
    lines = _lines()
    written = _first(re.escape(CONF_DIR))
    assert written < _first(r"\bapt_get\b|\bapt-get\b"), "the policy must be in place before the first apt-get"
    # Top level, not inside a mode's branch: first boot, --fetch and --install (a baked image) all write it.
    assert not lines[written].startswith((" ", "\t")), lines[written]
    apt_get = next(line for line in lines if line.startswith("apt_get()"))
    assert "NEEDRESTART_MODE=l " in apt_get, apt_get


@pytest.mark.skipif(shutil.which("perl") is None, reason="needrestart's configuration is Perl")
def test_the_written_policy_turns_needrestart_s_automatic_restarts_into_a_list(tmp_path: Path) -> None:
    lines = _lines()
    start = _first(r"^install -d .*" + re.escape(CONF_DIR))
    end = next(i for i in range(start, len(lines)) if "50-fmcluster.conf" in lines[i])
    snippet = "\n".join(lines[start:end + 1]).replace("/etc/needrestart", str(tmp_path / "needrestart"))
    subprocess.run(["bash", "-euo", "pipefail", "-c", snippet], check=True, timeout=30)
    written = sorted((tmp_path / "needrestart" / "conf.d").glob("*.conf"))
    assert [p.name for p in written] == ["50-fmcluster.conf"]
    # As needrestart.conf reads its conf.d (each file eval'ed in order), from Ubuntu 24.04's automatic mode.
    program = ('our %nrconf = (restart => "a"); foreach my $fn (sort <$ARGV[0]/*.conf>) { my $c = do { local $/; '
               'open my $fh, "<", $fn or die "$fn: $!"; <$fh> }; eval $c; die "$fn: $@" if $@; } print $nrconf{restart};')
    done = subprocess.run(["perl", "-e", program, str(tmp_path / "needrestart" / "conf.d")], capture_output=True,
                          text=True, check=True, timeout=30)
    assert done.stdout == "l"
