"""Print the scenario's prometheus_scrape_configs (JSON), computed as a node computes them with its inventory
(fmcluster.manifest.scrape_configs, inventory discovery): this host is one compute node of queue `efa`."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from fmcluster.manifest import scrape_configs  # noqa: E402
from fmcluster.nodes import Node  # noqa: E402

NODE = Node("fmo-mol", "127.0.0.1", "compute", "efa", "fmo-mol", "fixture.efa")
JOBS = [{"job": "node", "port": 19191, "instance_types": []},
        {"job": "dcgm", "port": 19193, "instance_types": ["p5.48xlarge"]},  # no GPU instance type here: no target
        {"job": "efa", "port": 19192, "instance_types": ["fixture.efa"]}]
print(json.dumps(scrape_configs({"prometheus_node_discovery": {"kind": "inventory"}, "prometheus_scrape_jobs": JOBS}, [NODE])))
