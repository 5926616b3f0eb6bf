"""Every node boots systemd as PID 1, so every role takes its systemd path and keeps no other (issue 35).

Every catalogued image's contract says `init: systemd` (src/fmcluster/data/images.yml: AWS's images from their
owners' pages, the local substrate's from docs/local-nodes.md), and the local hosts boot it too
(fmcluster.providers.local.hosts). A branch for hosts without systemd (a `service_mgr` fact test, a start-stop-daemon
supervisor, a policy-rc.d that keeps packaged daemons from starting) would be a path no node ever takes: untested
where it runs, and a second way to get a daemon wrong. Should an image without systemd ever be catalogued, the test
names it, and the branch it needs comes back only together with its entry in NON_SYSTEMD_IMAGES saying why.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from conftest import ROOT
from fmcluster.images import ImageCatalog, load_images

#: Where roles and what runs them live: every file there is read.
SCANNED = ("roles", "playbooks", "molecule")
#: What only a host without systemd needs: the service manager fact that tells them apart, the plain-process
#: supervisor, and Debian's way to keep packaged daemons from starting where no init runs them.
WORDS = ("service_mgr", "start-stop-daemon", "policy-rc.d")
#: Catalogued images that lack systemd, each with why a role keeps a branch for it. None today.
NON_SYSTEMD_IMAGES: dict[str, str] = {}


def scanned_files() -> list[Path]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if path.is_file() and not parts & {"__pycache__", "generated"}:
                found.append(path)
    return found


def test_the_scan_reads_the_roles_playbooks_and_scenarios() -> None:
    names = {str(p.relative_to(ROOT)) for p in scanned_files()}
    assert {"roles/supervised_service/tasks/main.yml", "roles/supervised_service/files/wait-ready.py",
            "playbooks/site.yml", "molecule/monitoring/molecule.yml"} <= names


def test_no_role_playbook_or_scenario_keeps_a_path_for_hosts_without_systemd() -> None:
    hits = []
    for path in scanned_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            hits += [f"{path.relative_to(ROOT)}:{number}: {word}: {line.strip()}" for word in WORDS if word in line]
    assert not hits, ("a path for hosts without systemd, which no catalogued image boots (every role takes its "
                      "systemd path; a daemon is a systemd unit through roles/supervised_service):\n" + "\n".join(hits))


def images_without_systemd(catalog: ImageCatalog) -> list[str]:
    """The catalogued images that boot another init than systemd and NON_SYSTEMD_IMAGES does not justify, each
    named with its contract's value and source."""
    return [f"{key} (init: {image.contract.init}, source {image.contract.sources['init']})"
            for key, image in sorted(catalog.images.items())
            if image.contract.init != "systemd" and key not in NON_SYSTEMD_IMAGES]


def test_every_catalogued_image_boots_systemd() -> None:
    catalog = load_images()
    unjustified = images_without_systemd(catalog)
    assert not unjustified, (
        "catalogued image(s) whose contract says another init than systemd: " + ", ".join(unjustified)
        + ". Every role assumes systemd. Either the contract is wrong, or the roles need a branch for it: add it "
        "with the image in NON_SYSTEMD_IMAGES saying why, and let the test above allow that branch.")
    stale = [key for key in NON_SYSTEMD_IMAGES if catalog[key].contract.init == "systemd"]
    assert not stale, f"NON_SYSTEMD_IMAGES lists images that boot systemd now: {stale}"


def test_an_image_without_systemd_is_named_with_its_source() -> None:
    catalog = load_images()
    image = catalog["debian-12-local"]
    odd = dataclasses.replace(image, contract=dataclasses.replace(image.contract, init="none"))
    changed = dataclasses.replace(catalog, images={**catalog.images, "debian-12-local": odd})
    assert images_without_systemd(changed) == ["debian-12-local (init: none, source docs/local-nodes.md)"]
