"""Logging in to the dashboard, and the CSRF value every action form carries.

The session cookie holds a nonce, the operator's name, the issue time and an HMAC of
them under the token (`dashboard.token_file`); the CSRF value is an HMAC of the nonce.
Nothing is kept on the server; comparisons are constant-time (docs/dashboard.md, "Login
and actions").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass

COOKIE = "cairnqd_dashboard"
#: A session lasts this long after login.
SESSION_S = 12 * 3600
_WHO = re.compile(r"[A-Za-z0-9 ._@+-]{1,64}")


#: Wrong tokens an address may send per window before its logins are refused for a window.
LOGIN_FAILURES = 5
LOGIN_WINDOW_S = 60.0


class LoginThrottle:
    """Refuses logins from an address that sent `LOGIN_FAILURES` wrong tokens within
    `LOGIN_WINDOW_S`, until the window has passed: guessing a token takes forever."""

    def __init__(self, failures: int = LOGIN_FAILURES, window_s: float = LOGIN_WINDOW_S) -> None:
        self.failures = failures
        self.window_s = window_s
        self._lock = threading.Lock()
        self._seen: dict[str, list[float]] = {}

    def _recent(self, address: str, now: float) -> list[float]:
        times = [t for t in self._seen.get(address, []) if now - t < self.window_s]
        if times:
            self._seen[address] = times
        else:
            self._seen.pop(address, None)
        return times

    def blocked(self, address: str, now: float | None = None) -> bool:
        with self._lock:
            return len(self._recent(address, time.monotonic() if now is None else now)) >= (
                self.failures
            )

    def failed(self, address: str, now: float | None = None) -> None:
        moment = time.monotonic() if now is None else now
        with self._lock:
            if len(self._seen) > 10_000:  # a flood of addresses: forget the oldest half
                for stale in list(self._seen)[:5_000]:
                    del self._seen[stale]
            self._seen[address] = [*self._recent(address, moment), moment]


@dataclass(frozen=True)
class Session:
    who: str
    nonce: str
    csrf: str


class Auth:
    """Token checks, session cookies and CSRF values; with no token, none needed."""

    def __init__(self, token: str | None) -> None:
        self._key = token.encode() if token else None

    @property
    def required(self) -> bool:
        return self._key is not None

    def token_ok(self, given: str) -> bool:
        if self._key is None:
            return False
        return hmac.compare_digest(given.encode(), self._key)

    def _mac(self, *parts: str) -> str:
        assert self._key is not None
        return hmac.new(self._key, "|".join(parts).encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def clean_who(who: str) -> str | None:
        """The name an operator gave at login, if it is one the audit log can show."""
        who = who.strip()
        return who if _WHO.fullmatch(who) else None

    def new_cookie(self, who: str, now: float | None = None) -> str:
        nonce = secrets.token_urlsafe(16)
        issued = str(int(time.time() if now is None else now))
        name = base64.urlsafe_b64encode(who.encode()).decode().rstrip("=")
        return f"{nonce}.{issued}.{name}.{self._mac('session', nonce, issued, who)}"

    def session(self, cookie_header: str | None, now: float | None = None) -> Session | None:
        """The session a request's Cookie header proves, or None."""
        if self._key is None or not cookie_header:
            return None
        value = None
        for part in cookie_header.split(";"):
            name, _, found = part.strip().partition("=")
            if name == COOKIE:
                value = found
        if not value or len(value) > 512:
            return None
        pieces = value.split(".")
        if len(pieces) != 4:
            return None
        nonce, issued, name, mac = pieces
        try:
            who = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        if not issued.isdigit() or not hmac.compare_digest(
            mac, self._mac("session", nonce, issued, who)
        ):
            return None
        age = (time.time() if now is None else now) - int(issued)
        if not 0 <= age <= SESSION_S:
            return None
        return Session(who=who, nonce=nonce, csrf=self._mac("csrf", nonce))

    @staticmethod
    def csrf_ok(session: Session, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(session.csrf, given or "")


__all__ = ["COOKIE", "SESSION_S", "Auth", "LoginThrottle", "Session"]
