"""Scheduler `hyperpod`: SageMaker HyperPod with Slurm (README.md). Nothing is imported here."""
