from .version import Version, compare, max_version

__all__ = ["Version", "compare", "max_version"]
