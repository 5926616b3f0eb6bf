"""The Lustre client on AWS: the FSx repository builds lustre-client-modules per Ubuntu kernel, some days after the
kernel ships, so a node whose image has a newer kernel stops with the kernel and the fix, not with apt's "no
package". The check is Ansible's own templating of the role's condition on apt-cache's two answers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import HOST_PYTHON, ROOT, venv_tool

pytestmark = pytest.mark.slow

NO_BUILD = "lustre-client-modules-6.17.0-1012-aws:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n"
BUILD = "lustre-client-modules-6.8.0-1040-aws:\n  Installed: (none)\n  Candidate: 2.15.6-1fsx1\n"


def the_check() -> str:
    tasks = yaml.safe_load((ROOT / "roles/shared_storage/tasks/main.yml").read_text())
    block = next(t for t in tasks if t["name"].startswith("Check the FSx Lustre client repository has modules"))
    assert block["block"][0]["ansible.builtin.command"]["argv"][:2] == ["apt-cache", "policy"]
    return str(block["block"][1]["ansible.builtin.assert"]["that"])


@pytest.mark.parametrize(("answer", "passes"), [(NO_BUILD, False), (BUILD, True)])
def test_a_kernel_without_a_lustre_client_build_is_refused_by_name(tmp_path: Path, answer: str, passes: bool) -> None:
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "check", "ansible.builtin.assert": {"that": the_check(), "quiet": True}}]}]))
    done = subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", str(play),
                           "-e", json.dumps({"shared_storage_lustre_policy": {"stdout": answer},
                                             "ansible_python_interpreter": HOST_PYTHON})],
                          capture_output=True, text=True, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    assert (done.returncode == 0) is passes, done.stdout


def run_lustre_repository(tmp_path: Path, apt: Path, key: Path) -> dict[str, dict[str, object]]:
    """The role's repository tasks (tasks/lustre_repository.yml) against `apt` in --check --diff: {task: result}."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": True, "tasks": [
        {"ansible.builtin.import_role": {"name": "shared_storage", "tasks_from": "lustre_repository"}}]}]))
    extra = {"shared_storage_apt_dir": str(apt), "shared_storage_lustre_key_url": key.as_uri(),
             "ansible_python_interpreter": HOST_PYTHON}
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_CACHE_PLUGIN": "memory"}
    done = subprocess.run([venv_tool("ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", json.dumps(extra),
                           str(play), "--check", "--diff"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    run = json.loads(done.stdout)
    return {t["task"]["name"]: t["hosts"]["localhost"] for p in run["plays"] for t in p["tasks"]
            if "localhost" in t["hosts"]}


def test_an_image_that_lists_the_fsx_repository_keeps_its_entry_and_gets_no_second_one(tmp_path: Path) -> None:
    """AWS's guide lists the FSx Lustre client repository as fsxlustreclientrepo.list, signed-by its own keyring; a
    second entry of ours with another Signed-By makes apt refuse every source list ("Conflicting values set for option
    Signed-By"), and with it every apt task of the converge. The role uses the image's entry, writes no second one,
    fetches no key and removes one of ours left from before; an image without one (or only a commented-out one) gets
    ours."""
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "keyrings").mkdir()
    key = tmp_path / "fsx-ubuntu-public-key.asc"
    key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n(test key)\n", encoding="ascii")
    image_entry = apt / "sources.list.d" / "fsxlustreclientrepo.list"
    image_entry.write_text("deb [signed-by=/usr/share/keyrings/fsx-ubuntu-public-key.gpg] "
                           "https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu noble main\n", encoding="ascii")
    ours = apt / "sources.list.d" / "fmcluster-fsx-lustre.sources"
    ours.write_text("Types: deb\nURIs: https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu\nSuites: noble\n"
                    f"Components: main\nSigned-By: {apt}/keyrings/fmcluster-fsx-lustre.asc\n", encoding="ascii")
    by_name = run_lustre_repository(tmp_path, apt, key)
    said = by_name["shared_storage : Say that the image lists the FSx Lustre client repository itself"]["msg"]
    assert str(image_entry) in str(said) and str(ours) not in str(said), said
    assert by_name["shared_storage : Remove an entry of ours for the repository the image lists itself"]["changed"]
    assert by_name["shared_storage : Add the FSx Lustre client repository"].get("skipped")
    assert by_name["shared_storage : Fetch the FSx Lustre client repository key"].get("skipped")

    # Commented out, or in a file apt does not read: the image lists nothing, and ours is written.
    ours.unlink()
    image_entry.rename(image_entry.with_suffix(".list.save"))
    (apt / "sources.list.d" / "old.list").write_text(
        "# deb https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu noble main\n", encoding="ascii")
    by_name = run_lustre_repository(tmp_path, apt, key)
    assert by_name["shared_storage : Say that the image lists the FSx Lustre client repository itself"].get("skipped")
    added = by_name["shared_storage : Add the FSx Lustre client repository"]
    assert added["changed"] and "Signed-By: " + str(apt) + "/keyrings/fmcluster-fsx-lustre.asc" in str(added["diff"])
