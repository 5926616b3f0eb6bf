"""The first-boot script every node runs, whatever made it: EC2 user data (fmcluster.stacks.render.node_user_data),
or the hook a scheduler's service runs on the nodes it makes (HyperPod's on_create.sh; each scheduler's folder
hands its own over), with the S3 client it needs packed inline.

A leaf module: the cluster templates and the schedulers both read it, and it reads only files of the checkout.
"""

from __future__ import annotations

import ast
import base64
import gzip
from typing import Any

from fmcluster.paths import NODE_BOOT_DIR, source_root

SOURCE_ROOT = source_root()

#: The rest of every node's first boot: fetch node-bootstrap.sh and run it. The same file is the tail of what a
#: scheduler's service runs on its nodes (HyperPod's on_create.sh runs it).
USER_DATA_SCRIPT = NODE_BOOT_DIR / "node-user-data.sh"
#: The first boot's S3 client (Python's standard library alone), written out by the first-boot script.
S3_CLIENT = NODE_BOOT_DIR / "fmcluster-s3"
S3_CLIENT_PLACEHOLDER = "@FMCLUSTER_S3_CLIENT_WRITER@"


def first_boot_script() -> str:
    """src/fmcluster/node/boot/node-user-data.sh with the S3 client inlined: what every node runs at first boot, whatever made
    it (EC2 user data, or the hook of the scheduler's service such as HyperPod's on_create.sh)."""
    script = USER_DATA_SCRIPT.read_text(encoding="utf-8")
    if script.count(S3_CLIENT_PLACEHOLDER) != 1:
        raise RuntimeError(f"{USER_DATA_SCRIPT} must hold {S3_CLIENT_PLACEHOLDER} exactly once")
    return script.replace(S3_CLIENT_PLACEHOLDER + "\n", s3_client_writer('"$bin_dir/fmcluster-s3"'))


def s3_client_writer(path: str) -> str:
    """Shell that writes the packed S3 client to `path` (a shell word): the first-boot script's own lines, and the
    stand-ins' on images that have no AWS CLI."""
    return ("python3 -c 'import base64, gzip, sys; sys.stdout.buffer.write(gzip.decompress(base64.b64decode("
            f"sys.stdin.read())))' \\\n  >{path}.new <<'FMCLUSTER_S3_CLIENT'\n{packed_s3_client()}\nFMCLUSTER_S3_CLIENT\n"
            f"chmod 0755 {path}.new && mv -f {path}.new {path}\n")


def packed_s3_client() -> str:
    """The S3 client as the first-boot script carries it: without docstrings and comments, gzipped (mtime 0, so
    byte-stable) and base64 in 76-character lines. EC2 takes 16 KB of user data and CloudFormation 51,200 bytes
    of template, and every launch template carries a copy."""
    tree = ast.parse(S3_CLIENT.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and isinstance(body, list) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    source = "#!/usr/bin/env python3\n" + ast.unparse(tree) + "\n"
    packed = base64.b64encode(gzip.compress(source.encode(), compresslevel=9, mtime=0)).decode()
    return "\n".join(packed[i:i + 76] for i in range(0, len(packed), 76))


# --- the node boot contract -------------------------------------------------------------------------

BOOT_VARIABLES = ("FMCLUSTER_BUCKET", "FMCLUSTER_REGION", "FMCLUSTER_ORG", "FMCLUSTER_STACK", "FMCLUSTER_ROLE",
                  "FMCLUSTER_QUEUE", "FMCLUSTER_SIGNAL_RESOURCE")


def boot_environment(*, org: str, bucket: Any, region: Any, stack: Any, role: str = "", queue: str = "",
                     signal_resource: str = "") -> dict[str, Any]:
    """The environment every node's bootstrap runs with (EC2 user data and HyperPod alike).
    bucket/region/stack are strings, or CloudFormation references in the user data."""
    return {"FMCLUSTER_BUCKET": bucket, "FMCLUSTER_REGION": region, "FMCLUSTER_ORG": org, "FMCLUSTER_STACK": stack,
            "FMCLUSTER_ROLE": role, "FMCLUSTER_QUEUE": queue, "FMCLUSTER_SIGNAL_RESOURCE": signal_resource}
