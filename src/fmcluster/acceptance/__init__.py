"""Acceptance: collective-bandwidth runs through Slurm that gate the deploy and drain bad nodes.

parser (nccl-tests log → ParsedLog) · verdict (ParsedLog + catalog thresholds → Verdict) · bench (the CPU
stand-in for nccl-tests) · slurm (sbatch, wait, drain) · bisect (pair tests → bad nodes) · results (per-run
JSON + summary) · runner (`run_acceptance(tenant)`, what the deploy flow calls).
"""
