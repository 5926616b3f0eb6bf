"""The Slurm PCS runs and the image every PCS node boots: one place, read by the template, the scheduler and the rules
(it imports nothing of fmcluster's, so validation may read it before any model exists)."""

from __future__ import annotations

#: The Slurm major version the cluster runs: the newest AWS::PCS::Cluster Scheduler.Version PCS accepts, the one its
#: current sample AMI is built for (README.md, "Sources").
SLURM_VERSION = "25.11"
#: The image every PCS node boots (data/images.yml): PCS's sample AMI for that Slurm.
IMAGE = f"pcs-sample-al2023-x86_64-slurm-{SLURM_VERSION}"
#: How the deploy finds that image's AMI in the tenant's region (it has no public SSM parameter): the newest available
#: image of this owner whose name matches (PCS's naming: aws-pcs-sample_ami-<os>-<arch>-slurm-<version>). The owner is
#: the alias of AWS-owned images; were PCS to publish them under another account, the deploy would find none and stop
#: naming the image, never take a same-named image of someone else.
AMI_OWNER = "amazon"
AMI_NAME = f"aws-pcs-sample_ami-al2023-x86_64-slurm-{SLURM_VERSION}*"
