"""The Slurm PCS runs and the image every PCS node boots: one place, read by the template, the scheduler and the rules
(it imports nothing of fmcluster's, so validation may read it before any model exists)."""

from __future__ import annotations

#: The Slurm major version the cluster runs: the newest AWS::PCS::Cluster Scheduler.Version PCS accepts, the one its
#: current sample AMI is built for (README.md, "Sources").
SLURM_VERSION = "25.11"
#: The image every PCS node boots (data/images.yml): PCS's sample AMI for that Slurm.
IMAGE = f"pcs-sample-al2023-x86_64-slurm-{SLURM_VERSION}"
