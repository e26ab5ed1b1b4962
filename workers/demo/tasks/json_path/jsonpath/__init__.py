from .lookup import exists, get, parse_path

__all__ = ["exists", "get", "parse_path"]
