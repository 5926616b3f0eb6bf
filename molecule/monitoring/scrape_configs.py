"""Print the scenario's prometheus_scrape_configs (JSON), computed as a node computes them with its inventory
(fmcluster.manifest.scrape_configs, inventory discovery): this host is one compute node of queue `efa`, its
exporters on the roles' default ports, reached on its loopback."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from fmcluster.manifest import scrape_configs  # noqa: E402
from fmcluster.nodes import Node  # noqa: E402

NODE = Node("ip-10-79-6-132", "127.0.0.1", "compute", "efa", "ip-10-79-6-132", "fixture.efa")
JOBS = [{"job": "node", "port": 9100, "instance_types": []},
        {"job": "dcgm", "port": 9400, "instance_types": ["p5.48xlarge"]},  # no GPU instance type here: no target
        {"job": "efa", "port": 9109, "instance_types": ["fixture.efa"]}]
print(json.dumps(scrape_configs({"prometheus_node_discovery": {"kind": "inventory"}, "prometheus_scrape_jobs": JOBS}, [NODE])))
