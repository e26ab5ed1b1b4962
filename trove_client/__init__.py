"""A small client for Trove's REST API, standard library only (no Django, no requests). See client.py."""

from trove_client.client import TroveAPIError, TroveClient

__all__ = ["TroveAPIError", "TroveClient"]
