"""kvgate: acceptance gates for KV-cache storage tiers in LLM serving."""

__version__ = "0.1.0"
