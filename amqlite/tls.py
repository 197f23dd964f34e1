"""TLS contexts for the broker's listeners (STOMP and HTTP) and for clients.

One place builds every ``ssl.SSLContext`` so the rules are the same everywhere: TLS 1.2
at least (what RFC 8996 and ActiveMQ's/RabbitMQ's current defaults leave), the system's
cipher defaults, hostname verification on for clients unless switched off. A bad
certificate setting is found at start, not at the first handshake: ``TlsError`` says in
one line which file and what is wrong (unreadable, expired, not matching its key).
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass

#: RFC 8996 deprecates TLS 1.0 and 1.1; 1.2 is the floor every current broker keeps.
MINIMUM_TLS_VERSION = ssl.TLSVersion.TLSv1_2
#: URI scheme of a TLS STOMP listener (ActiveMQ's ``ssl://`` connector).
SSL_SCHEME = "ssl"


class TlsError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the file."""


def _check_validity(cert_file: str) -> None:
    """Refuse a certificate that is expired or not yet valid: a broker that starts with
    one would fail every handshake with an error only the client sees."""
    try:
        # CPython's own certificate decoder (used by its test suite): the ssl module has
        # no public way to read a file's dates, and this keeps cryptography optional.
        info = ssl._ssl._test_decode_cert(cert_file)  # type: ignore[attr-defined]
    except (ssl.SSLError, OSError, AttributeError):
        return  # load_cert_chain has already accepted the file; the dates are a bonus
    now = time.time()
    not_after = ssl.cert_time_to_seconds(info["notAfter"])
    not_before = ssl.cert_time_to_seconds(info["notBefore"])
    if not_after < now:
        raise TlsError(f"certificate {cert_file} expired on {info['notAfter']}")
    if not_before > now:
        raise TlsError(f"certificate {cert_file} is not valid before {info['notBefore']}")


def check_pair(cert_file: str, key_file: str, cert_name: str = "--ssl-cert",
               key_name: str = "--ssl-key") -> None:
    """Refuse a certificate without its key or a key without its certificate, in one line
    naming both: the one rule for the broker's settings and every client command (half a
    pair is a typo or a forgotten option, never meant; ignoring it would hide it)."""
    if bool(cert_file) != bool(key_file):
        given, missing = (cert_name, key_name) if cert_file else (key_name, cert_name)
        raise TlsError(f"{given} is given without {missing}: a certificate and its key "
                       "go together")


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str | None, what: str) -> None:
    for path in (cert_file, key_file):
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                raise TlsError(f"{what}: cannot read {path}: {e.strerror}") from None
    try:
        ctx.load_cert_chain(cert_file, key_file or None)
    except ssl.SSLError as e:
        reason = e.reason or str(e)
        if "KEY_VALUES_MISMATCH" in str(reason).upper():
            raise TlsError(f"{what}: the key {key_file} does not match the certificate "
                           f"{cert_file}") from None
        raise TlsError(f"{what}: cannot use certificate {cert_file} with key {key_file}: "
                       f"{reason}") from None
    _check_validity(cert_file)


def _load_ca(ctx: ssl.SSLContext, ca_file: str, what: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except OSError as e:
        raise TlsError(f"{what}: cannot read CA file {ca_file}: {e.strerror}") from None
    except ssl.SSLError as e:
        raise TlsError(f"{what}: CA file {ca_file} holds no usable certificate: "
                       f"{e.reason or e}") from None


def server_context(cert_file: str, key_file: str, ca_file: str = "",
                   what: str = "ssl_cert") -> ssl.SSLContext:
    """A listener's context; with ``ca_file`` every client must present a certificate
    signed by that CA (ActiveMQ's ``needClientAuth=true``)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = MINIMUM_TLS_VERSION
    _load_chain(ctx, cert_file, key_file, what)
    if ca_file:
        _load_ca(ctx, ca_file, "ssl_ca")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@dataclass(frozen=True, slots=True)
class ClientTls:
    """What a client needs to speak TLS: whom to trust and who it is."""

    #: CA certificates to trust; empty: the system's default trust store.
    ca_file: str = ""
    #: Client certificate (and its key) for brokers that require one.
    cert_file: str = ""
    key_file: str = ""
    #: Check that the certificate names the host in the URI (on unless told otherwise).
    verify_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        return client_context(self.ca_file, self.cert_file, self.key_file,
                              self.verify_hostname)


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "",
                   verify_hostname: bool = True) -> ssl.SSLContext:
    """A client's context: server certificates always verified (against ``ca_file`` or
    the system store), hostname checked unless ``verify_hostname`` is False."""
    check_pair(cert_file, key_file)
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = MINIMUM_TLS_VERSION
    if ca_file:
        _load_ca(ctx, ca_file, "--ssl-ca")
    if cert_file:
        _load_chain(ctx, cert_file, key_file, "--ssl-cert")
    ctx.check_hostname = verify_hostname
    return ctx
