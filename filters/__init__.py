"""Compliance filters for the support chat: banned words, PII redaction, prompt-injection
heuristics, and a streaming guard that applies them to a reply token by token.

No Flask, no torch here: the web tier imports this package directly.
"""
from filters.banned_words import BannedWordFilter, BannedWordMatch
from filters.injection import InjectionVerdict, detect_injection
from filters.pii import PiiFinding, find_pii, redact_pii
from filters.stream_guard import StreamGuard

__all__ = ["BannedWordFilter", "BannedWordMatch", "InjectionVerdict", "PiiFinding", "StreamGuard",
           "detect_injection", "find_pii", "redact_pii"]
