"""OpenSSH public keys as a tenant spec gives them: one line of `type base64-blob [comment]` (sshd(8),
AUTHORIZED_KEYS FILE FORMAT), read back down to the key itself so that what reaches authorized_keys on every
node is a key, never options, a second line, or a blob of another type than the one it declares.

The blob is the SSH wire encoding (RFC 4253 6.6, RFC 5656 3.1, RFC 8709 4, PROTOCOL.u2f): a length-prefixed
string naming the type, then the type's fields. Every field is read and nothing may follow the last one.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata

#: Key types accepted, with the fields their blob holds after the type name: `mpint`/`string` values, and for
#: ECDSA the curve name the blob must carry. Certificates and DSA (removed from OpenSSH 9.8) are not accepted.
KEY_TYPES: dict[str, tuple[str, ...]] = {
    "ssh-ed25519": ("ed25519",),
    "ecdsa-sha2-nistp256": ("curve:nistp256", "point"),
    "ecdsa-sha2-nistp384": ("curve:nistp384", "point"),
    "ecdsa-sha2-nistp521": ("curve:nistp521", "point"),
    "ssh-rsa": ("mpint", "mpint"),
    "sk-ssh-ed25519@openssh.com": ("ed25519", "string"),
    "sk-ecdsa-sha2-nistp256@openssh.com": ("curve:nistp256", "point", "string"),
}
#: NIST curves (FIPS 186-4 D.1.2; y² = x³ - 3x + b mod p): name → (p, b, bytes per coordinate).
#: tests/test_sshkeys.py compares them with `openssl ecparam -param_enc explicit`.
CURVES: dict[str, tuple[int, int, int]] = {
    "nistp256": (0xffffffff00000001000000000000000000000000ffffffffffffffffffffffff,
                 0x5ac635d8aa3a93e7b3ebbd55769886bc651d06b0cc53b0f63bce3c3e27d2604b, 32),
    "nistp384": (0xfffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffeffffffff0000000000000000ffffffff,
                 0xb3312fa7e23ee7e4988e056be3f82d19181d9c6efe8141120314088f5013875ac656398d8a2ed19d2a85c8edd3ec2aef, 48),
    "nistp521": ((1 << 521) - 1,
                 0x51953eb9618e1c9a1f929a21a0b68540eea2da725b99b315f3b8b489918ef109e156193951ec7e937b1652c0bd3bb1bf073573df883d2c34f1ef451fd46b503f00,
                 66),
}
#: ssh-keygen's default is 3072; OpenSSH refuses RSA keys under 1024 bits and NIST SP 800-131A under 2048.
MIN_RSA_BITS = 2048
ED25519_BYTES = 32
BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
EXAMPLE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA... alice@laptop (the whole line of ~/.ssh/id_ed25519.pub)"


class _Short(ValueError):
    """The blob ends inside a field."""


def _string(blob: bytes, at: int) -> tuple[bytes, int]:
    if at + 4 > len(blob):
        raise _Short()
    size = int.from_bytes(blob[at:at + 4], "big")
    end = at + 4 + size
    if end > len(blob):
        raise _Short()
    return blob[at + 4:end], end


def key_problem(line: str) -> tuple[str, str] | None:
    """(what is wrong, how to fix it) when `line` is not one acceptable OpenSSH public key, else None."""
    fix = f"paste the user's public key line, e.g. {EXAMPLE}"
    for char in line:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            return f"the key contains a control character (U+{ord(char):04X})", "write the key on one line: " + fix
    words = line.split(" ")
    words = [w for w in words if w]
    if not words:
        return "the key is empty", fix
    kind = words[0]
    if "PRIVATE KEY" in line:
        return ("this is a private key: it must never leave its owner's machine",
                "give the public key (the .pub file) instead, and make a new key pair: this one is no longer secret")
    if kind not in KEY_TYPES:
        if any(w in KEY_TYPES for w in words[1:]):
            return ("the key starts with authorized_keys options (command=, from=, ...), which are not accepted",
                    "remove everything before the key type: " + fix)
        if kind.endswith("-cert-v01@openssh.com"):
            return "certificates are not accepted", "give the user's plain public key: " + fix
        if kind == "ssh-dss":
            return "DSA keys are refused (OpenSSH removed them)", "make an ed25519 key: ssh-keygen -t ed25519"
        return f"the key type is not one of {', '.join(KEY_TYPES)}", fix
    if len(words) < 2:
        return "the key has a type but no key data", fix
    encoded = words[1]
    if not BASE64.fullmatch(encoded) or len(encoded) % 4:
        return "the key data is not valid base64", "copy the key line again, whole: " + fix
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return "the key data is not valid base64", "copy the key line again, whole: " + fix
    return _blob_problem(kind, blob, fix)


def _blob_problem(kind: str, blob: bytes, fix: str) -> tuple[str, str] | None:
    try:
        inner, at = _string(blob, 0)
        if inner != kind.encode():
            return (f"the key says {kind} but its data is a key of another type "
                    f"({_printable(inner.decode('ascii', 'replace'))})",
                    "keep the type word the key was made with: " + fix)
        curve = ""
        for field in KEY_TYPES[kind]:
            value, at = _string(blob, at)
            if field.startswith("curve:"):
                curve = field.removeprefix("curve:")
            if field == "point" and not on_curve(curve, value):
                return f"the key's point is not on curve {curve}", "copy the key line again, whole: " + fix
            if field.startswith("curve:") and value != curve.encode():
                return (f"the key says {kind} but its data names curve {_printable(value.decode('ascii', 'replace'))}",
                        "keep the type word the key was made with: " + fix)
            if field == "ed25519" and len(value) != ED25519_BYTES:
                return f"the ed25519 key is {len(value)} bytes, not {ED25519_BYTES}", "copy the key line again, whole: " + fix
        if at != len(blob):
            return "the key data has bytes after the key", "copy the key line again, whole: " + fix
    except _Short:
        return "the key data is cut short", "copy the key line again, whole: " + fix
    if kind == "ssh-rsa":
        bits = rsa_bits(blob)
        if bits < MIN_RSA_BITS:
            return (f"the RSA key has {bits} bits; at least {MIN_RSA_BITS} are needed",
                    "make a new key: ssh-keygen -t ed25519 (or -t rsa -b 4096)")
    return None


def on_curve(curve: str, point: bytes) -> bool:
    """`point` is an uncompressed point (0x04 || x || y, SEC 1 2.3.3) of the NIST `curve`."""
    p, b, size = CURVES[curve]
    if len(point) != 1 + 2 * size or point[0] != 4:
        return False
    x, y = int.from_bytes(point[1:1 + size], "big"), int.from_bytes(point[1 + size:], "big")
    return x < p and y < p and (y * y - (x * x * x - 3 * x + b)) % p == 0


def rsa_bits(blob: bytes) -> int:
    """The modulus size of an ssh-rsa blob (type, e, n), in bits."""
    _, at = _string(blob, 0)
    _, at = _string(blob, at)
    modulus, _ = _string(blob, at)
    return int.from_bytes(modulus, "big").bit_length()


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)[:40]
