"""`python -m fmcluster.node image-inventory --kind K --out PATH`: an image builder's inventory (issue 40).

Run by the image stack's component (fmcluster.stacks.templates.image) after the first boot's fetch
(`node-bootstrap.sh --fetch`, which wrote /etc/fmcluster/node.env): the manifest the deploy published, read and checked
against its index as a node's agent reads it (Agent.manifest), with the builder as every node group of its kind
(fmcluster.baked.builder_nodes), so `ansible-pull --tags install` runs every role's install tasks a node of that kind
runs. The inventory holds the manifest's variables; nothing tagged install reads the tenant's (fmcluster.baked).
"""

from __future__ import annotations

from pathlib import Path

from fmcluster import baked
from fmcluster.manifest import assemble_inventory, inventory_yaml
from fmcluster.node.agent import Agent, Settings, my_address, write_private


def image_inventory_main(kind: str, out: Path) -> int:
    if kind not in baked.IMAGE_KINDS:
        raise SystemExit(f"--kind {kind!r}: one of {', '.join(baked.IMAGE_KINDS)}")
    agent = Agent(Settings.from_env())
    manifest = agent.manifest()
    nodes = baked.builder_nodes(manifest, kind, my_address() or "127.0.0.1")
    write_private(out, inventory_yaml(assemble_inventory(manifest, nodes),
                                      "# written by `python -m fmcluster.node image-inventory`: an image builder\n"))
    print(f"fmcluster-node: image builder inventory for {kind} nodes: {out}", flush=True)
    return 0
