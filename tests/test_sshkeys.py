"""Users' ssh public keys (fmcluster.sshkeys): keys made by the real ssh-keygen are accepted whole; anything that
would put options, a second line or a key of another type into authorized_keys is refused with a reason and a fix.
ssh-keygen is the oracle: every mutation of a real key the validator accepts, ssh-keygen reads as a key too."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmcluster.sshkeys import CURVES, KEY_TYPES, MIN_RSA_BITS, key_problem

needs_ssh_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed")
KINDS = {"ed25519": ["-t", "ed25519"], "ecdsa256": ["-t", "ecdsa", "-b", "256"], "ecdsa384": ["-t", "ecdsa", "-b", "384"],
         "ecdsa521": ["-t", "ecdsa", "-b", "521"], "rsa2048": ["-t", "rsa", "-b", "2048"], "rsa1024": ["-t", "rsa", "-b", "1024"]}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One public key line per kind, from the real ssh-keygen."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    folder = tmp_path_factory.mktemp("keys")
    made = {}
    for name, args in KINDS.items():
        subprocess.run(["ssh-keygen", "-q", *args, "-N", "", "-C", "alice@laptop", "-f", str(folder / name)], check=True)
        made[name] = (folder / f"{name}.pub").read_text().strip()
    return made


def ssh_keygen_reads(line: str, tmp: Path) -> bool:
    path = tmp / "probe.pub"
    path.write_text(line + "\n")
    return subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True).returncode == 0


def wire(*parts: bytes) -> str:
    return base64.b64encode(b"".join(len(p).to_bytes(4, "big") + p for p in parts)).decode()


SK_ED25519 = "sk-ssh-ed25519@openssh.com " + wire(b"sk-ssh-ed25519@openssh.com", bytes(range(32)), b"ssh:") + " yubi"


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "rsa1024"])
def test_a_key_made_by_ssh_keygen_is_accepted(keys: dict[str, str], kind: str) -> None:
    assert key_problem(keys[kind]) is None
    assert key_problem(keys[kind].rsplit(" ", 1)[0]) is None  # without its comment
    assert key_problem(keys[kind] + " work laptop") is None  # a comment of several words


@needs_ssh_keygen
def test_a_security_key_is_accepted_as_ssh_keygen_reads_it(tmp_path: Path) -> None:
    assert key_problem(SK_ED25519) is None and ssh_keygen_reads(SK_ED25519, tmp_path)


def test_an_rsa_key_under_2048_bits_is_refused_with_its_size(keys: dict[str, str]) -> None:
    assert key_problem(keys["rsa1024"]) == (f"the RSA key has 1024 bits; at least {MIN_RSA_BITS} are needed",
                                            "make a new key: ssh-keygen -t ed25519 (or -t rsa -b 4096)")


@pytest.mark.parametrize("case, reason", [
    ("command=\"/bin/sh\" {ed25519}", "authorized_keys options"),
    ("from=\"*\",no-pty {ed25519}", "authorized_keys options"),
    ("{ed25519}\nssh-ed25519 AAAA attacker", "control character (U+000A)"),
    ("{ed25519}\r", "control character (U+000D)"),
    ("{ed25519}\x00", "control character (U+0000)"),
    ("{ed25519}\u2028x", "control character (U+2028)"),
    ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "DSA keys are refused"),
    ("ssh-ed25519-cert-v01@openssh.com AAAA", "certificates are not accepted"),
    ("ssh-foo AAAA", "the key type is not one of"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "this is a private key"),
    ("ssh-ed25519", "no key data"),
    ("", "the key is empty"),
    ("ssh-ed25519 AAAA$%", "not valid base64"),
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI", "not valid base64"),
    ("ssh-rsa {ed25519_blob}", "its data is a key of another type (ssh-ed25519)"),
    ("ecdsa-sha2-nistp384 {ecdsa256_blob}", "its data is a key of another type (ecdsa-sha2-nistp256)"),
    ("ssh-ed25519 {ed25519_cut}", "cut short"),
    ("ssh-ed25519 {ed25519_long}", "bytes after the key"),
    ("ecdsa-sha2-nistp256 {ecdsa_off_curve}", "not on curve nistp256"),
    ("ecdsa-sha2-nistp256 {ecdsa_wrong_curve}", "names curve nistp384"),
    ("ssh-ed25519 {ed25519_short_key}", "is 31 bytes, not 32"),
])
def test_what_is_not_one_plain_key_is_refused_with_the_reason(keys: dict[str, str], case: str, reason: str) -> None:
    blob = base64.b64decode(keys["ed25519"].split()[1])
    ecdsa = base64.b64decode(keys["ecdsa256"].split()[1])
    point = ecdsa[-65:]
    values = {
        "ed25519": keys["ed25519"], "ed25519_blob": keys["ed25519"].split()[1],
        "ecdsa256_blob": keys["ecdsa256"].split()[1],
        "ed25519_cut": base64.b64encode(blob[:-3]).decode(),
        "ed25519_long": base64.b64encode(blob + b"\0\0\0\0").decode(),
        "ecdsa_off_curve": wire(b"ecdsa-sha2-nistp256", b"nistp256", point[:-1] + bytes([point[-1] ^ 1])),
        "ecdsa_wrong_curve": wire(b"ecdsa-sha2-nistp256", b"nistp384", point),
        "ed25519_short_key": wire(b"ssh-ed25519", bytes(31)),
    }
    problem = key_problem(case.format(**values))
    assert problem is not None and reason in problem[0], problem
    assert problem[1], "a fix"


@needs_ssh_keygen
def test_the_curve_constants_are_openssl_s() -> None:
    names = {"nistp256": "prime256v1", "nistp384": "secp384r1", "nistp521": "secp521r1"}
    for curve, (p, b, size) in CURVES.items():
        if shutil.which("openssl") is None:
            pytest.skip("openssl is not installed")
        text = subprocess.run(["openssl", "ecparam", "-name", names[curve], "-param_enc", "explicit", "-text", "-noout"],
                              capture_output=True, text=True, check=True).stdout

        def number(label: str) -> int:
            found = re.search(label + r":\s*((?:\s*[0-9a-f]{2}:?)+)", text)
            assert found, label
            return int(re.sub(r"[^0-9a-f]", "", found.group(1)), 16)

        assert (number("Prime"), number("B"), (p.bit_length() + 7) // 8) == (p, b, size)


def test_every_accepted_type_is_one_openssh_names() -> None:
    assert set(KEY_TYPES) == {"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                              "ssh-rsa", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"}


# --- properties -----------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=80))
def test_any_text_gets_an_answer_never_an_exception(text: str) -> None:
    problem = key_problem(text)
    assert problem is None or (problem[0] and problem[1])


@needs_ssh_keygen
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["ed25519", "rsa2048", "ecdsa256", "ecdsa521"]), at=st.integers(0, 2000),
       insert=st.sampled_from(["", "A", "/", "=", " ", "\n", "\t", "\"", "ssh-ed25519 ", ",", "x"]),
       cut=st.integers(0, 2))
def test_a_mutated_key_the_validator_accepts_ssh_keygen_reads_as_a_key(keys: dict[str, str], tmp_path: Path, kind: str,
                                                                       at: int, insert: str, cut: int) -> None:
    line = keys[kind]
    at = at % (len(line) + 1)
    mutated = line[:at] + insert + line[at + cut:]
    if key_problem(mutated) is None:
        assert "\n" not in mutated and "\t" not in mutated
        assert ssh_keygen_reads(mutated, tmp_path), mutated
