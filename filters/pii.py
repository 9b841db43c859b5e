"""PII detection and redaction: emails, phone numbers, payment cards (Luhn), IBANs (mod 97),
national ids (US SSN, Chinese resident id with its check digit, UK National Insurance number)
and IPv4/IPv6 addresses.

Redaction replaces each finding with a typed placeholder ("[EMAIL]", "[CARD]", ...), so the model,
the logs and the stored history keep the shape of the message without the data. Candidates that
fail their checksum (a 16-digit order number is not a card) are left alone.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# The longest finding a stream must be able to see whole (an IBAN with spaces is 42 characters,
# an email address is rarely past 64): StreamGuard holds back at least this much.
MAX_PII_LEN = 80


@dataclass(frozen=True)
class PiiFinding:
    kind: str           # email | phone | card | iban | national_id | ip
    start: int
    end: int


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, d in enumerate(reversed(digits)):
        n = int(d)
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _card_len(s: str) -> int | None:
    """Length of the longest prefix of digit groups (13-19 digits) that passes Luhn: a card
    number followed by another number ("4111 1111 1111 1111 10 units") is still found."""
    groups = re.findall(r"\d+[ -]?", s)
    num_digits, limit = 0, 0            # only prefixes of at most 19 digits: linear in the run
    while limit < len(groups) and num_digits + len(groups[limit].rstrip(" -")) <= 19:
        num_digits += len(groups[limit].rstrip(" -"))
        limit += 1
    for n in range(limit, 0, -1):
        head = "".join(groups[:n]).rstrip(" -")
        digits = re.sub(r"\D", "", head)
        if 13 <= len(digits) <= 19 and _luhn_ok(digits):
            return len(head)
    return None


def _iban_ok(raw: str) -> bool:
    s = re.sub(r"\s", "", raw).upper()
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def _cn_id_ok(s: str) -> bool:
    total = sum(int(c) * w for c, w in zip(s[:17], _CN_ID_WEIGHTS))
    return "10X98765432"[total % 11] == s[17].upper()


_DATE = re.compile(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4}")


def _phone_ok(s: str) -> bool:
    """International (+, or an area code in parentheses) with 7-15 digits, else a national number
    of 10-15 digits written with separators, or a Chinese mobile number; never a date."""
    num_digits = sum(c.isdigit() for c in s)
    if _DATE.fullmatch(s) or not 7 <= num_digits <= 15:
        return False
    if s.startswith(("+", "(")):
        return True
    return (num_digits >= 10 and any(c in " .-" for c in s)) or re.fullmatch(r"1[3-9]\d{9}", s) is not None


def _ip_ok(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
    except ValueError:
        return False
    return True


# (kind, pattern, check): check(match) -> bool, or the accepted length of the match (a prefix of
# it), or None to reject. Order matters where spans overlap: earlier kinds win.
_PATTERNS = [
    ("email", re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])"), None),
    ("iban", re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,4})?(?![A-Za-z0-9])"),
     _iban_ok),
    ("card", re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,}(?![\d-])"), _card_len),
    ("national_id", re.compile(r"(?<![\dA-Za-z])\d{17}[\dXx](?![\dA-Za-z])"), _cn_id_ok),
    ("national_id", re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])"), None),
    ("national_id", re.compile(r"(?<![A-Za-z0-9])(?![DFIQUV])[A-Z](?![DFIQUVO])[A-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]"
                               r"(?![A-Za-z0-9])"), None),
    ("ip", re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])"), _ip_ok),
    ("ip", re.compile(r"(?<![\w:.])(?=[0-9A-Fa-f:]*:[0-9A-Fa-f:]*:)[0-9A-Fa-f:]{2,39}(?![\w:])"), _ip_ok),
    # phones: +country or a national number with separators; 7-15 digits (E.164's limit)
    ("phone", re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]?\d{2,4}){1,4}(?![\w])"),
     lambda s: _phone_ok(s)),
]

PLACEHOLDERS = {"email": "[EMAIL]", "phone": "[PHONE]", "card": "[CARD]", "iban": "[IBAN]",
                "national_id": "[ID]", "ip": "[IP]"}


_HINT = re.compile(r"[\d@:]")      # every kind above needs a digit, an '@' or a ':'


def find_pii(text: str) -> list[PiiFinding]:
    """Non-overlapping findings, left to right."""
    if not _HINT.search(text):
        return []
    found: list[PiiFinding] = []
    taken: list[tuple[int, int]] = []
    for kind, pattern, valid in _PATTERNS:
        for m in pattern.finditer(text):
            start, end = m.span()
            if valid is not None:
                ok = valid(m.group())
                if ok is None or ok is False:
                    continue
                if ok is not True:
                    end = start + ok
            if any(start < e and s < end for s, e in taken):
                continue
            taken.append((start, end))
            found.append(PiiFinding(kind, start, end))
    found.sort(key=lambda f: f.start)
    return found


def published_pii(texts: list[str]) -> frozenset[str]:
    """The PII the given texts state themselves (a help centre's support address or phone line):
    a reply quoting them is not leaking anyone's data."""
    return frozenset(t[f.start:f.end] for t in texts for f in find_pii(t))


def redact_pii(text: str) -> tuple[str, list[PiiFinding]]:
    """The text with each finding replaced by its placeholder, and the findings."""
    findings = find_pii(text)
    if not findings:
        return text, findings
    parts, at = [], 0
    for f in findings:
        parts.append(text[at:f.start])
        parts.append(PLACEHOLDERS[f.kind])
        at = f.end
    parts.append(text[at:])
    return "".join(parts), findings
