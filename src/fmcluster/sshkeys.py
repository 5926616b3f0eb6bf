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
            if field == "ed25519" and (why := ed25519_problem(value)) is not None:
                return f"the ed25519 key {why}", "make a new key: ssh-keygen -t ed25519"
        if at != len(blob):
            return "the key data has bytes after the key", "copy the key line again, whole: " + fix
    except _Short:
        return "the key data is cut short", "copy the key line again, whole: " + fix
    if kind == "ssh-rsa":
        if (why := rsa_problem(blob)) is not None:
            return f"the RSA key {why}", "make a new key: ssh-keygen -t ed25519 (or -t rsa -b 4096)"
        bits = rsa_bits(blob)
        if bits < MIN_RSA_BITS:
            return (f"the RSA key has {bits} bits; at least {MIN_RSA_BITS} are needed",
                    "make a new key: ssh-keygen -t ed25519 (or -t rsa -b 4096)")
    return None


def rsa_problem(blob: bytes) -> str | None:
    """Why the public exponent e and modulus n of an ssh-rsa blob cannot be an RSA key, or None. Both are mpints
    (RFC 4251 5: two's complement, no needless leading byte); e must be odd and at least 3 (e = 1 makes
    "encryption" the identity, an even e is never coprime to (p-1)(q-1)), n odd (a product of two odd primes),
    and e below n."""
    _, at = _string(blob, 0)
    e_bytes, at = _string(blob, at)
    n_bytes, _ = _string(blob, at)
    for name, raw in (("exponent", e_bytes), ("modulus", n_bytes)):
        if raw[:1] and raw[0] & 0x80:
            return f"has a negative {name}"
        if raw[:1] == b"\x00" and (len(raw) == 1 or not raw[1] & 0x80):
            return f"has a {name} with a needless leading zero byte (not an SSH mpint)"
    e, n = int.from_bytes(e_bytes, "big"), int.from_bytes(n_bytes, "big")
    if e < 3:
        return f"has public exponent {e} (at least 3 is needed; ssh-keygen uses 65537)"
    if e % 2 == 0:
        return f"has an even public exponent ({e if e < 1 << 64 else 'a huge number'}), which no RSA key has"
    if n % 2 == 0:
        return "has an even modulus, which no RSA key has (a product of two odd primes is odd)"
    if e >= n:
        return "has a public exponent as large as its modulus"
    return None


#: Edwards25519 (RFC 8032 5.1): -x² + y² = 1 + d·x²·y² mod p.
ED25519_P = (1 << 255) - 19
ED25519_D = (-121665 * pow(121666, -1, ED25519_P)) % ED25519_P


def ed25519_problem(encoded: bytes) -> str | None:
    """Why 32 bytes are not an ed25519 public key (RFC 8032 5.1.3 decoding), or None: y must be below p, the point
    on the curve, and not of small order (the all-zero key and the 7 other points of order 1, 2, 4 or 8 verify
    signatures no private key made)."""
    p = ED25519_P
    y = int.from_bytes(encoded, "little") & ((1 << 255) - 1)
    sign = encoded[31] >> 7
    if y >= p:
        return "is not a canonical point encoding (y is not below 2^255 - 19)"
    u, v = (y * y - 1) % p, (ED25519_D * y * y + 1) % p
    x2 = u * pow(v, -1, p) % p
    x = pow(x2, (p + 3) // 8, p)
    if (x * x - x2) % p:
        x = x * pow(2, (p - 1) // 4, p) % p
    if (x * x - x2) % p:
        return "is not a point of the curve"
    if x == 0 and sign:
        return "is not a canonical point encoding (x = 0 with the sign bit set)"
    if x & 1 != sign:
        x = p - x
    point = (x, y)
    for _ in range(3):
        point = _edwards_add(point, point)
    if point == (0, 1):
        return "is a point of small order (" + ("all zero" if not any(encoded) else "a known weak key") + \
            "), which no private key has"
    return None


def _edwards_add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    p, d = ED25519_P, ED25519_D
    (x1, y1), (x2, y2) = a, b
    t = d * x1 * x2 * y1 * y2 % p
    return ((x1 * y2 + x2 * y1) * pow(1 + t, -1, p) % p, (y1 * y2 + x1 * x2) * pow(1 - t, -1, p) % p)


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
