"""fmcluster-container (roles/slurm_containers/files): which image references it takes, and how it edits umoci's
rootless bundle config for Slurm's rootless runc. Its registry pulls and Slurm's runs are tested on a harness host
(tests/test_slurm_containers_role.py)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fmcluster.containers import ecr_registries

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "roles" / "slurm_containers" / "files" / "fmcluster-container"
LOCAL = "10.77.128.1:5000"
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
DIGEST = "sha256:" + "ab" * 32


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("fmcluster_container", str(TOOL))
    spec = importlib.util.spec_from_loader("fmcluster_container", loader)
    assert spec
    module = importlib.util.module_from_spec(spec)
    sys.modules["fmcluster_container"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


tool = _load()


@pytest.mark.parametrize(("text", "parts"), [
    (f"{LOCAL}/fmcluster/cpu-test:1", (LOCAL, "fmcluster/cpu-test", "1", None)),
    (f"{ECR}/team-a/megatron", (ECR, "team-a/megatron", "latest", None)),
    (f"{ECR}/nemo@{DIGEST}", (ECR, "nemo", None, DIGEST)),
    (f"{ECR}/nemo:24.07-py3@{DIGEST}", (ECR, "nemo", "24.07-py3", DIGEST)),
    (f"{ECR}/a__b/c.d_e:V1.2", (ECR, "a__b/c.d_e", "V1.2", None)),
])
def test_a_reference_to_the_tenant_s_registry_is_taken_apart(text: str, parts: tuple[str, str, str | None, str | None]) -> None:
    ref = tool.parse_reference(text, [LOCAL, ECR])
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == parts
    assert ref.transport == f"docker://{ref}"


@pytest.mark.parametrize(("text", "why"), [
    ("docker.io/library/busybox:latest", "registry docker.io is not the tenant's"),
    ("210987654321.dkr.ecr.us-east-1.amazonaws.com/nemo:1", "is not the tenant's"),
    (f"{ECR}.evil.example/nemo:1", "is not the tenant's"),
    ("busybox", "no default registry"),
    ("library/busybox:latest", "is not the tenant's"),  # 'library' read as a registry host: not the tenant's
    (f"{ECR}/nemo:1;id", "no shell characters"),
    (f"{ECR}/nemo:$(id)", "no shell characters"),
    (f"{ECR}/nemo:`id`", "no shell characters"),
    (f"{ECR}/nemo:1 && id", "no shell characters"),
    (f"{ECR}/nemo:1\nid", "no shell characters"),
    (f"{ECR}/Nemo:1", "lower-case path"),
    (f"{ECR}/../nemo:1", "lower-case path"),
    (f"{ECR}/nemo:-1", "tag of letters"),
    (f"{ECR}/nemo:" + "a" * 129, "tag of letters"),
    (f"{ECR}/nemo@sha512:" + "ab" * 64, "REGISTRY/REPOSITORY"),
    (f"{ECR}/nemo@sha256:" + "AB" * 32, "REGISTRY/REPOSITORY"),
    (f"{ECR}/" + "a" * 300, "longer than 255"),
])
def test_a_hostile_reference_is_refused_naming_it_the_rule_and_the_fix(text: str, why: str) -> None:
    with pytest.raises(tool.Refused) as refused:
        tool.parse_reference(text, [LOCAL, ECR], Path("/etc/fmcluster/containers.json"))
    message = str(refused.value)
    assert why in message, message
    assert f"fix: push the image to the tenant's registry ({LOCAL}, {ECR})" in message
    assert (text if len(text) <= 80 and text.isprintable() else repr(text[:80])) in message
    if "not the tenant's" in why:
        assert "/etc/fmcluster/containers.json, key registries" in message


def umoci_rootless_config() -> dict[str, Any]:
    """What umoci 0.4.7's `unpack --rootless` writes (the fields the edit touches), as on Debian 12."""
    return {
        "ociVersion": "1.0.2", "hostname": "umoci-default",
        "process": {"terminal": True, "user": {"uid": 0, "gid": 0}, "args": ["/usr/bin/python3"],
                    "env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "cwd": "/"},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "ro"]},
                   {"destination": "/fsx", "type": "tmpfs", "source": "tmpfs"}],
        "linux": {"uidMappings": [{"containerID": 0, "hostID": 1000, "size": 1}],
                  "gidMappings": [{"containerID": 0, "hostID": 1000, "size": 1}],
                  "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"},
                                 {"type": "mount"}, {"type": "user"}, {"type": "cgroup"}],
                  "resources": {"memory": {"limit": 1}}, "cgroupsPath": "/umoci"},
    }


def test_the_bundle_config_maps_the_user_to_root_inside_with_host_networking_and_the_shared_mounts() -> None:
    original = umoci_rootless_config()
    config = tool.edit_config(original, 2001, 2002, "/home/alice", ["/fsx"], ["/etc/hosts", "/etc/resolv.conf"])
    assert original == umoci_rootless_config()  # a copy is edited
    linux = config["linux"]
    # Only her own ids, to the container's 0: nothing inside is root outside.
    assert linux["uidMappings"] == [{"containerID": 0, "hostID": 2001, "size": 1}]
    assert linux["gidMappings"] == [{"containerID": 0, "hostID": 2002, "size": 1}]
    assert config["process"]["user"] == {"uid": 0, "gid": 0}
    assert [ns["type"] for ns in linux["namespaces"]] == ["pid", "ipc", "mount", "user"]  # the node's network, name
    assert "hostname" not in config and "resources" not in linux and "cgroupsPath" not in linux
    assert config["process"]["cwd"] == "/home/alice" and config["process"]["terminal"] is False
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert mounts["/sys"] == {"destination": "/sys", "type": "none", "source": "/sys",
                              "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]}
    for path in ("/home/alice", "/fsx"):  # the image's own /fsx gives way to the node's
        assert mounts[path]["source"] == path and "rw" in mounts[path]["options"] and "rbind" in mounts[path]["options"]
    for path in ("/etc/hosts", "/etc/resolv.conf"):
        assert mounts[path]["source"] == path and "ro" in mounts[path]["options"]
    assert [m["destination"] for m in config["mounts"]].count("/fsx") == 1
    assert mounts["/proc"] == {"destination": "/proc", "type": "proc", "source": "proc"}
    json.dumps(config)


def test_the_settings_file_missing_or_wrong_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(tool.Refused, match="converge the node"):
        tool.load_settings(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text('{"registries": "x"}')
    with pytest.raises(tool.Refused, match="key registries must be a list"):
        tool.load_settings(tmp_path / "bad.json")


def test_usage_and_refusals_exit_as_documented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "containers.json"
    settings.write_text(json.dumps({"registries": [LOCAL], "cache_dir": str(tmp_path)}))
    monkeypatch.setattr(tool, "CONF", settings)
    assert tool.main(["nonsense"]) == 64
    assert tool.main(["check", "docker.io/x:1"]) == 2
    assert "registry docker.io is not the tenant's" in capsys.readouterr().err
    assert tool.main(["check", f"{LOCAL}/x:1"]) == 0
    assert capsys.readouterr().out == f"{LOCAL}/x:1\n"


def _skopeo_calls(settings: dict[str, Any], text: str, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The skopeo command lines a pull of `text` runs (inspect for the digest, copy into the cache); skopeo itself
    is stood in for: it answers a manifest and writes the layout's index."""
    calls: list[list[str]] = []
    manifest = '{"schemaVersion": 2}'
    digest = "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()

    def fake(argv: list[str], what: str) -> str:
        calls.append(argv)
        if argv[1] == "copy":
            layout = Path(argv[-1].split(":")[1])
            (layout / "index.json").write_text(json.dumps({"manifests": [{"digest": digest}]}))
        return manifest

    monkeypatch.setattr(tool, "_run", fake)
    ref = tool.parse_reference(text, [LOCAL, ECR])
    tool._pull(settings, ref, tool.resolve_digest(settings, ref), tmp_path / "images", lambda _: None)
    return [argv for argv in calls if argv[0] == "skopeo"]


def test_skopeo_pulls_from_ecr_with_the_refreshers_auth_file_and_from_the_local_registry_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = tmp_path / "ecr-auth.json"
    auth.write_text(json.dumps({"auths": {ECR: {"auth": "QVdTOnNlY3JldA=="}}}))
    settings = {"registries": [LOCAL, ECR], "insecure_registries": [LOCAL], "skopeo": "skopeo", "authfile": str(auth),
                "ecr_registries": ecr_registries([LOCAL, ECR])}
    inspect, copy = _skopeo_calls(settings, f"{ECR}/team-a/megatron:1", tmp_path / "a", monkeypatch)
    assert inspect == ["skopeo", "inspect", "--raw", "--authfile", str(auth), f"docker://{ECR}/team-a/megatron:1"]
    assert copy[:5] == ["skopeo", "copy", "--quiet", "--src-authfile", str(auth)]
    assert copy[5].startswith(f"docker://{ECR}/team-a/megatron@sha256:")
    # The local substrate's registry: no token, no auth file (even where one exists), plain HTTP as before.
    inspect, copy = _skopeo_calls(settings, f"{LOCAL}/fmcluster/cpu-test:1", tmp_path / "b", monkeypatch)
    assert inspect == ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{LOCAL}/fmcluster/cpu-test:1"]
    assert "--src-authfile" not in copy and "--authfile" not in copy
    settings["authfile"] = str(tmp_path / "absent.json")
    inspect, _ = _skopeo_calls(settings, f"{LOCAL}/fmcluster/cpu-test:1", tmp_path / "c", monkeypatch)
    assert "--authfile" not in inspect


@pytest.mark.parametrize("content", [None, "{", json.dumps({"auths": {"210987654321.dkr.ecr.us-east-1.amazonaws.com": {
    "auth": "QVdTOnNlY3JldA=="}}})])
def test_an_ecr_pull_without_a_token_for_its_registry_is_refused_naming_the_refresher(
        content: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = tmp_path / "ecr-auth.json"
    if content is not None:
        auth.write_text(content)
    settings = {"registries": [ECR], "skopeo": "skopeo", "authfile": str(auth), "ecr_registries": ecr_registries([ECR])}
    with pytest.raises(tool.Refused, match=rf"no ECR token for {ECR} in {auth}: the node's fmcluster-ecr-login\.service"
                                           r".*systemctl start fmcluster-ecr-login\.service"):
        _skopeo_calls(settings, f"{ECR}/nemo:1", tmp_path, monkeypatch)


def test_the_local_registry_listens_on_the_router_address_only_and_keeps_what_is_pushed(tmp_path: Path) -> None:
    from fmcluster.providers.local import registry

    config = json.loads(registry.config_text("10.77.128.1", tmp_path / "storage"))
    assert config["http"] == {"addr": f"10.77.128.1:{registry.PORT}"}
    assert config["storage"]["filesystem"] == {"rootdirectory": str(tmp_path / "storage")}
    assert config["storage"]["delete"] == {"enabled": False}
    assert registry.Registry("10.77.128.1", registry.PORT, 1, True).host == "10.77.128.1:5000"


def test_validation_refuses_what_the_tool_refuses_by_the_same_grammar() -> None:
    """`acceptance.image` is checked by `invoke validate` with the tool's own grammar (the tool runs on nodes without
    fmcluster's package, so the pattern is written twice and held equal here)."""
    from fmcluster.validation import IMAGE_REFERENCE, IMAGE_REFERENCE_MAX

    assert IMAGE_REFERENCE.pattern == tool._REFERENCE.pattern
    assert IMAGE_REFERENCE_MAX == tool._MAX_REFERENCE
