"""A second deploy uploads nothing that has not changed, on AWS too: the tenant bucket encrypts with SSE-KMS, where
an object's ETag is not the MD5 of its bytes, so publish compares the SHA-256 it recorded in the object's metadata.

The client is a stand-in for S3 that answers as S3 does under SSE-KMS (an ETag that is no MD5): the emulator
computes MD5 ETags, so it cannot show the case."""

from __future__ import annotations

import hashlib
from typing import Any

from fmcluster.publish import IDENTITY_METADATA, Published, _put_if_changed


class KmsBucket:
    """put_object/head_object as S3 answers them for an SSE-KMS bucket: metadata kept, ETag not an MD5."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.puts = 0

    def put_object(self, Bucket: str, Key: str, Body: bytes, Metadata: dict[str, str] | None = None) -> None:
        self.objects[Key] = (Body, dict(Metadata or {}))
        self.puts += 1

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        if Key not in self.objects:
            raise KeyError(Key)
        body, metadata = self.objects[Key]
        return {"ETag": f'"{hashlib.sha1(body).hexdigest()[:32]}"', "Metadata": metadata}


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
