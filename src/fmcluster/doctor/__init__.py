"""Shared troubleshooting knowledge as checks: the knowledge base (data/knowledge.yml), `invoke doctor` (its
detections over one cluster's evidence or one job log) and `invoke fleet` (every tenant in one table)."""
