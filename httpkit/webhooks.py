"""Outgoing webhooks: which URLs may be called, how a body is signed, and one delivery attempt.

A webhook URL is an address the server will call on a tenant's behalf, so it is checked against
server-side request forgery, when it is registered and again before every attempt (a name can
resolve elsewhere later):
  - http or https only, with a host, no user:password part, at most 2,000 characters;
  - every address the host resolves to must be public: loopback, private (RFC 1918, fc00::/7),
    link-local (169.254.0.0/16, the cloud metadata service), carrier-grade NAT, multicast,
    reserved and unspecified addresses are refused, unless the host or address is in `allow`
    (hostnames, IP addresses or CIDR ranges; WEBHOOK_ALLOW_HOSTS);
  - redirects are never followed;
  - the request goes to the address that was checked, not to a second lookup of the name, so a
    name that answers a public address to the check and a private one to the connection (DNS
    rebinding) cannot reach the inside; the Host header and the TLS server name stay the URL's.

The signature is Stripe's scheme: header `X-Webhook-Signature: t=<unix time>,v1=<hex>`, where
hex is HMAC-SHA256(secret, "<unix time>.<raw body>"). A receiver recomputes it and rejects a
timestamp older than a few minutes.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

MAX_URL_CHARS = 2000
USER_AGENT = "support-webhooks/1"
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class UnsafeURL(ValueError):
    """The URL may not be called (its message says why)."""


def _allowed(host: str, addresses: Iterable[ipaddress._BaseAddress], allow: Iterable[str]) -> bool:
    allow = [a.strip().lower() for a in allow if a.strip()]
    if host.lower() in allow:
        return True
    nets = []
    for a in allow:
        try:
            nets.append(ipaddress.ip_network(a, strict=False))
        except ValueError:
            continue
    return bool(nets) and all(any(addr in net for net in nets) for addr in addresses)


def _public(addr: ipaddress._BaseAddress) -> bool:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return not (addr.is_private or addr.is_loopback or addr.is_link_local or addr.is_multicast or addr.is_reserved
                or addr.is_unspecified or (isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT))


def resolve(host: str, port: int) -> list[ipaddress._BaseAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UnsafeURL(f"url: the host {host!r} does not resolve ({exc.strerror})") from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


@dataclass(frozen=True)
class Target:
    """A checked URL and the address its request goes to."""
    url: str
    address: ipaddress._BaseAddress

    def pinned(self) -> tuple[str, dict[str, str], dict[str, str]]:
        """(URL with the address for its host, headers, httpx request extensions): the connection
        goes to `address`, while the Host header and the TLS server name (SNI and the certificate
        check) are the URL's own host."""
        parts = urlsplit(self.url)
        literal = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        netloc = literal + (f":{parts.port}" if parts.port else "")
        extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
        return urlunsplit(parts._replace(netloc=netloc)), {"Host": parts.netloc}, extensions


def check(url: str, allow: Iterable[str] = ()) -> Target:
    """The URL and the address to call if it may be called; raises UnsafeURL saying why not."""
    if not isinstance(url, str) or not url.strip():
        raise UnsafeURL("url: required, an http or https URL")
    if len(url) > MAX_URL_CHARS:
        raise UnsafeURL(f"url: at most {MAX_URL_CHARS} characters")
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeURL(f"url: the scheme must be http or https, not {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise UnsafeURL("url: has no host")
    if parts.username or parts.password:
        raise UnsafeURL("url: must not carry a user name or password")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UnsafeURL("url: the port is not a number from 0 to 65535") from None
    allow = list(allow)
    addresses = resolve(parts.hostname, port)
    if not addresses:
        raise UnsafeURL(f"url: the host {parts.hostname!r} resolves to no address")
    if not _allowed(parts.hostname, addresses, allow):
        blocked = [str(a) for a in addresses if not _public(a)]
        if blocked:
            raise UnsafeURL(f"url: {parts.hostname} resolves to a private or reserved address ({blocked[0]}); "
                            "only public addresses, or hosts in WEBHOOK_ALLOW_HOSTS, may be called")
    return Target(url, addresses[0])


def check_url(url: str, allow: Iterable[str] = ()) -> str:
    """The URL if it may be called; raises UnsafeURL saying why not."""
    return check(url, allow).url


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, tolerance_s: float = 300.0, now: float | None = None) -> bool:
    """A receiver's check of `X-Webhook-Signature` (what our tests, and a tenant's code, run)."""
    fields = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((now or time.time()) - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), f"t={timestamp},v1={fields.get('v1', '')}")


@dataclass(frozen=True)
class Attempt:
    ok: bool
    status_code: int | None
    error: str
    elapsed_ms: float


def deliver(url: str, secret: str, event: str, delivery_id: str, body: bytes, allow: Iterable[str] = (),
            timeout_s: float = 5.0) -> Attempt:
    """One signed POST; 2xx is success. Never raises for the receiver's faults."""
    started = time.perf_counter()
    try:
        target = check(url, allow)
    except UnsafeURL as exc:
        return Attempt(False, None, str(exc), 0.0)
    pinned_url, host, extensions = target.pinned()
    timestamp = int(time.time())
    headers = {**host, "Content-Type": "application/json", "User-Agent": USER_AGENT, "X-Webhook-Event": event,
               "X-Webhook-Delivery": delivery_id, "X-Webhook-Signature": signature(secret, timestamp, body)}
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client:
            resp = client.post(pinned_url, content=body, headers=headers, extensions=extensions)
    except httpx.HTTPError as exc:
        return Attempt(False, None, f"{type(exc).__name__}: {exc}"[:300], (time.perf_counter() - started) * 1000)
    elapsed = (time.perf_counter() - started) * 1000
    if 200 <= resp.status_code < 300:
        return Attempt(True, resp.status_code, "", elapsed)
    return Attempt(False, resp.status_code, f"HTTP {resp.status_code}", elapsed)
