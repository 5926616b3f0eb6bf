"""Scheduler `slurm-ec2`: self-managed Slurm on EC2 (README.md). Nothing is imported here."""
