"""TLS for a public swarm: the SSL contexts of `sapo bootstrap` (serving) and of nodes (verifying).

A bootstrap given a certificate and its key serves `wss://` for the rendezvous and TLS on its board's
ports; nodes check the server's certificate against the system's CAs, or only against one CA file an
operator hands out with the swarm (a private CA). Every file problem is a `TlsError` whose message
names the file and says what to do, raised before anything listens or dials.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from urllib.parse import urlsplit

from engine.swarm.errors import SwarmError

TLS_SCHEMES = ("tls", "wss", "https")


class TlsError(SwarmError):
    """A certificate, key or CA file cannot be used (missing, unreadable, not PEM, key not matching)."""


def is_tls_url(url: str) -> bool:
    """Does this URL ask for TLS (tls://, wss://, https://)?"""
    return urlsplit(url).scheme in TLS_SCHEMES


def _readable(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise TlsError(f"the {what} {p} does not exist (or is not a file)")
    try:
        with p.open("rb") as fh:
            head = fh.read(1 << 16)
    except OSError as exc:
        raise TlsError(f"cannot read the {what} {p}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in head:
        raise TlsError(f"the {what} {p} is not a PEM file (it should start with -----BEGIN ...)")
    return p


def _no_passphrase() -> str:
    # Without a callback, OpenSSL would prompt on the terminal; nats-server cannot read such keys anyway.
    raise TlsError("the TLS key is protected by a passphrase: give an unencrypted key file "
                   "(e.g. `openssl pkey -in key.pem -out plain.pem`), readable only by this user")


def server_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """The context a bootstrap serves wss:// with: its certificate (chain) and the matching key."""
    cert = _readable(cert_file, "TLS certificate file")
    key = _readable(key_file, "TLS key file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key, password=_no_passphrase)
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if "KEY_VALUES_MISMATCH" in reason:
            raise TlsError(f"the TLS key {key} does not belong to the certificate {cert}: give the key "
                           "the certificate was issued for") from exc
        raise TlsError(f"cannot use the TLS certificate {cert} with the key {key} ({reason}): both must be "
                       "PEM files, the certificate first in its file") from exc
    return ctx


def client_context(ca_file: str | Path | None = None) -> ssl.SSLContext:
    """The context a node dials wss:// and the board's TLS ports with: certificates and host names are
    checked against the system's CAs, or, given `ca_file`, against the CAs in that file only."""
    cafile = str(_readable(ca_file, "CA file")) if ca_file else None
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except ssl.SSLError as exc:
        raise TlsError(f"the CA file {cafile} holds no usable certificate ({exc.reason or exc})") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def own_server_context(cert_file: str | Path) -> ssl.SSLContext:
    """The bootstrap's own connection to the nats-server it started, over loopback: it trusts exactly
    the certificate it gave that server (whoever issued it), under whatever name it was issued for."""
    cert = _readable(cert_file, "TLS certificate file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # it dials 127.0.0.1 / 0.0.0.0; the certificate names the public host
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf itself is the trust anchor
    try:
        ctx.load_verify_locations(cafile=str(cert))
    except ssl.SSLError as exc:
        raise TlsError(f"the TLS certificate file {cert} holds no usable certificate ({exc.reason or exc})") from exc
    return ctx
