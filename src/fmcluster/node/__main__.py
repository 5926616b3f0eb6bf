"""`python -m fmcluster.node converge|watch|image-inventory`: the node agent's entry points (see fmcluster.node.agent;
image-inventory: fmcluster.node.image, an image builder's)."""

from __future__ import annotations

import argparse
import sys

from fmcluster.node.agent import converge_main, watch_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fmcluster.node")
    sub = parser.add_subparsers(dest="command", required=True)
    converge = sub.add_parser("converge", help="converge this node once and report")
    converge.add_argument("--trigger", default="operator", help="why (recorded in the report)")
    watch = sub.add_parser("watch", help="re-converge when the commit, the manifest or the membership changes")
    watch.add_argument("--interval", type=float, default=60.0, help="seconds between checks")
    inventory = sub.add_parser("image-inventory", help="an image builder's inventory from the published manifest")
    inventory.add_argument("--kind", required=True, help="cpu | gpu | trainium")
    inventory.add_argument("--out", required=True, help="where the inventory is written (root only)")
    args = parser.parse_args(argv)
    if args.command == "image-inventory":
        from pathlib import Path

        from fmcluster.node.image import image_inventory_main

        return image_inventory_main(args.kind, Path(args.out))
    if args.command == "converge":
        return converge_main(args.trigger)
    return watch_main(args.interval)


if __name__ == "__main__":
    sys.exit(main())
