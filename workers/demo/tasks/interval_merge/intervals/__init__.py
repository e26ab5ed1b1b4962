from .merge import insert, merge, total_length

__all__ = ["insert", "merge", "total_length"]
