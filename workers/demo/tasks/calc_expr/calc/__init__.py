from .parser import evaluate

__all__ = ["evaluate"]
