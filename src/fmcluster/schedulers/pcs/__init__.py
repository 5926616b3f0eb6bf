"""Scheduler `pcs`: AWS Parallel Computing Service, managed Slurm (README.md). Nothing is imported here."""
