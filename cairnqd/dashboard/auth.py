"""Logging in to the dashboard, and the CSRF value every action form carries.

The session cookie holds a nonce, the operator's name, the issue time, the role
(operator, or viewer for a login with `dashboard.viewer_token_file`) and an HMAC of them
under that role's token, so changing a token ends its sessions; the CSRF value is an
HMAC of the nonce. A one-shot flash message (what an action did) rides in a cookie of
its own, signed the same way. Nothing is kept on the server; comparisons are
constant-time (docs/dashboard.md, "Login and actions").
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
FLASH_COOKIE = "cairnqd_flash"
#: A flash message waits this long for the page it was meant for.
FLASH_S = 120
#: The most of a flash message kept (cookies hold about 4 KB).
FLASH_MAX = 600
OPERATOR = "operator"
VIEWER = "viewer"
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
    role: str = OPERATOR

    @property
    def may_act(self) -> bool:
        return self.role == OPERATOR


@dataclass(frozen=True)
class Flash:
    """A one-shot message for the next page: what an action did, or why it failed."""

    message: str
    ok: bool = True


class Auth:
    """Token checks, session cookies and CSRF values; with no token, none needed."""

    def __init__(self, token: str | None, viewer_token: str | None = None) -> None:
        self._key = token.encode() if token else None
        self._viewer_key = viewer_token.encode() if token and viewer_token else None

    @property
    def required(self) -> bool:
        return self._key is not None

    def token_ok(self, given: str) -> bool:
        return self.role_of(given) is not None

    def role_of(self, given: str) -> str | None:
        """The role a token logs in as: operator, viewer, or None for a wrong one.
        Both comparisons always run, so the time taken says nothing of which."""
        if self._key is None:
            return None
        operator = hmac.compare_digest(given.encode(), self._key)
        viewer = self._viewer_key is not None and hmac.compare_digest(
            given.encode(), self._viewer_key
        )
        return OPERATOR if operator else VIEWER if viewer else None

    def _mac(self, *parts: str, role: str = OPERATOR) -> str:
        key = self._viewer_key if role == VIEWER else self._key
        assert key is not None
        return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def clean_who(who: str) -> str | None:
        """The name an operator gave at login, if it is one the audit log can show."""
        who = who.strip()
        return who if _WHO.fullmatch(who) else None

    def new_cookie(self, who: str, now: float | None = None, role: str = OPERATOR) -> str:
        nonce = secrets.token_urlsafe(16)
        issued = str(int(time.time() if now is None else now))
        name = _b64(who)
        mac = self._mac("session", nonce, issued, who, role, role=role)
        return f"{nonce}.{issued}.{name}.{role}.{mac}"

    def session(self, cookie_header: str | None, now: float | None = None) -> Session | None:
        """The session a request's Cookie header proves, or None."""
        if self._key is None or not cookie_header:
            return None
        value = _cookie(cookie_header, COOKIE)
        if not value or len(value) > 512:
            return None
        pieces = value.split(".")
        if len(pieces) != 5:
            return None
        nonce, issued, name, role, mac = pieces
        who = _unb64(name)
        if who is None or role not in (OPERATOR, VIEWER):
            return None
        if role == VIEWER and self._viewer_key is None:
            return None  # viewer logins were turned off: their sessions end
        if not issued.isdigit() or not hmac.compare_digest(
            mac, self._mac("session", nonce, issued, who, role, role=role)
        ):
            return None
        age = (time.time() if now is None else now) - int(issued)
        if not 0 <= age <= SESSION_S:
            return None
        return Session(who=who, nonce=nonce, csrf=self._mac("csrf", nonce), role=role)

    def flash_cookie(self, flash: Flash) -> str:
        """The value of a cookie carrying `flash` to the next page."""
        text = _b64(flash.message[:FLASH_MAX])
        kind = "ok" if flash.ok else "error"
        return f"{kind}.{text}.{self._mac('flash', kind, text)}"

    def flash(self, cookie_header: str | None) -> Flash | None:
        """The flash message a request's cookies carry, if it is one this dashboard
        signed (a site that can set cookies for this host cannot forge one)."""
        if self._key is None:
            return None
        value = _cookie(cookie_header, FLASH_COOKIE)
        if not value or len(value) > 2 * FLASH_MAX + 100:
            return None
        pieces = value.split(".")
        if len(pieces) != 3 or pieces[0] not in ("ok", "error"):
            return None
        kind, text, mac = pieces
        message = _unb64(text)
        if message is None or not hmac.compare_digest(mac, self._mac("flash", kind, text)):
            return None
        return Flash(message, ok=kind == "ok")

    @staticmethod
    def csrf_ok(session: Session, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(session.csrf, given or "")


def _cookie(header: str | None, wanted: str) -> str | None:
    value = None
    for part in (header or "").split(";"):
        name, _, found = part.strip().partition("=")
        if name == wanted:
            value = found
    return value


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(text: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


__all__ = [
    "COOKIE",
    "FLASH_COOKIE",
    "FLASH_S",
    "OPERATOR",
    "SESSION_S",
    "VIEWER",
    "Auth",
    "Flash",
    "LoginThrottle",
    "Session",
]
