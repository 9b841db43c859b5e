"""The OpenAI-compatible HTTP service around one engine (the only part of `inference` that
imports Flask)."""
