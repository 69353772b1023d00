"""attnscope core: the Transformer of "Attention Is All You Need" with faithful attention capture."""

from core.config import TransformerConfig
from core.model import Transformer
from core.trace import KINDS, AttentionTrace

__all__ = ["KINDS", "AttentionTrace", "Transformer", "TransformerConfig"]
