"""Print the group vars the generated inventory gives one queue (argv[1]) of a cluster whose queues have the
instance types argv[1:]: catalog facts, the accelerator roles and their expectations, the NCCL environment."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from fmcluster.catalog import load_catalog  # noqa: E402
from fmcluster.accelerators import queue_vars  # noqa: E402

instance_type = sys.argv[1]
print(json.dumps({"fmcluster_instance": load_catalog()[instance_type].as_vars(), **queue_vars(instance_type, sys.argv[1:])}))
