"""Built-in torch implementations of the specs."""

from .golden import GOLDEN_FORMS, golden_attention

__all__ = ["GOLDEN_FORMS", "golden_attention"]
