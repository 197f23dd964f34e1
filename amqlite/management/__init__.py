"""The management HTTP API, Prometheus metrics and web console of a node (issue 14)."""

from amqlite.management.app import ManagementServer

__all__ = ["ManagementServer"]
