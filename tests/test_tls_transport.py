"""SIP over TLS: the listener, client connections, mutual TLS, config checks, a whole call.

Certificates are made here with `cryptography`: a test CA signs the bridge's
certificate (IP SAN 127.0.0.1) and a phone's; a second, untrusted CA signs a
rogue phone's. Phones are asyncio TLS streams speaking SIP with Content-Length.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sip_bridge.config.loader import BridgeConfig, ConfigError, TlsConfig, load_config
from sip_bridge.server import BridgeServer
from sip_bridge.sip.framing import StreamFramer
from sip_bridge.sip.message import (
    SipMessage,
    SipRequest,
    SipResponse,
    make_response,
)
from sip_bridge.sip.transport import (
    Received,
    SipTransport,
    TransportError,
    tls_client_context,
    tls_server_context,
)
from testkit.phone import phone_request

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files: a CA, the bridge's and a phone's (CA-signed), a rogue's."""

    dir: Path

    def __getattr__(self, name: str) -> str:  # pki.server_cert -> <dir>/server.cert
        stem, _, ext = name.rpartition("_")
        return str(self.dir / f"{stem}.{ext}")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    cn: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey]
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    is_ca = issuer[0] == _name(cn)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer[0])
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    else:
        san = [x509.DNSName(cn), x509.IPAddress(ipaddress.ip_address(HOST))]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer[1], hashes.SHA256())


def _write(d: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    (d / f"{stem}.cert").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / f"{stem}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key, rogue_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    _write(d, "ca", _issue("ca", ca_key, (_name("ca"), ca_key)), ca_key)
    for stem, issuer in (("server", "ca"), ("phone", "ca"), ("rogue", "rogue-ca")):
        key = ec.generate_private_key(ec.SECP256R1())
        _write(
            d,
            stem,
            _issue(stem, key, (_name(issuer), ca_key if issuer == "ca" else rogue_key)),
            key,
        )
    return Pki(d)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _config(pki: Pki, **tls: object) -> BridgeConfig:
    base = BridgeConfig.line_check()
    tls_cfg = TlsConfig(
        port=_free_port(),
        certificate=pki.server_cert,
        private_key=pki.server_key,
        ca_file=pki.ca_cert,
    )
    return replace(
        base,
        sip=replace(base.sip, listen=f"{HOST}:0", tls=replace(tls_cfg, **tls)),  # type: ignore[arg-type]
        rtp=replace(base.rtp, ports="44600-44699"),
    )


def _phone_context(pki: Pki, cert: str = "", key: str = "") -> ssl.SSLContext:
    """A phone that checks the bridge's certificate against the test CA."""
    return tls_client_context(cert, key, pki.ca_cert, verify_peer=True)


class Phone:
    """One TLS stream to the bridge, SIP messages in and out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.framer = StreamFramer()
        self.inbox: list[SipMessage] = []
        self.port = int(writer.get_extra_info("sockname")[1])

    @classmethod
    async def connect(cls, port: int, ctx: ssl.SSLContext) -> Phone:
        r, w = await asyncio.wait_for(
            asyncio.open_connection(HOST, port, ssl=ctx, server_hostname=HOST), 5
        )
        return cls(r, w)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def next(self) -> SipMessage:
        while not self.inbox:
            data = await asyncio.wait_for(self.reader.read(65535), 5)
            if not data:
                raise ConnectionResetError("the bridge closed the connection")
            self.inbox += self.framer.feed(data)
        return self.inbox.pop(0)

    async def final(self) -> SipResponse:
        while True:
            msg = await self.next()
            if isinstance(msg, SipResponse) and msg.status >= 200:
                return msg

    def close(self) -> None:
        self.writer.close()


def _request(
    method: str, bridge: int, local: int, cseq: int, rtp: int = 0, to_tag: str = "", call: str = ""
) -> bytes:
    call_id = call or ("options-tls" if method == "OPTIONS" else "call-tls")
    return phone_request(
        method, bridge, local, cseq, rtp=rtp, to_tag=to_tag, call_id=call_id, transport="TLS",
        host=HOST,
    )  # fmt: skip


async def _options_ok(server: BridgeServer, ctx: ssl.SSLContext) -> None:
    phone = await Phone.connect(server.config.sip.tls.port, ctx)
    try:
        phone.send(_request("OPTIONS", server.config.sip.tls.port, phone.port, 1))
        ok = await phone.final()
        assert ok.status == 200
        assert "TLS" in (ok.headers.get("Via") or "")
    finally:
        phone.close()


def test_options_over_tls_gets_200_on_the_same_connection(pki: Pki) -> None:
    async def main() -> None:
        server = BridgeServer(_config(pki))
        await server.start()
        try:
            assert server.transport.tls_local == (HOST, server.config.sip.tls.port)
            await _options_ok(server, _phone_context(pki))
        finally:
            await server.stop()
        assert server.transport.tls_local is None

    asyncio.run(main())


def test_invite_ack_bye_over_tls_both_directions(pki: Pki) -> None:
    """The phone's call is hung up by the phone; the second one by the bridge (max_call_s),
    whose BYE must come down the phone's own TLS connection."""

    async def main() -> None:
        cfg = _config(pki)
        server = BridgeServer(replace(cfg, sip=replace(cfg.sip, max_call_s=0.5)))
        await server.start()
        tls_port = server.config.sip.tls.port
        rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rtp.bind((HOST, 0))
        rtp_port = rtp.getsockname()[1]
        phone = await Phone.connect(tls_port, _phone_context(pki))
        try:
            phone.send(_request("INVITE", tls_port, phone.port, 1, rtp_port))
            ok = await phone.final()
            assert ok.status == 200 and b"m=audio" in ok.body
            contact = (ok.headers.get("Contact") or "").lower()
            # A phone that opens a new connection to our Contact must reach the TLS port.
            assert "transport=tls" in contact and f":{tls_port};" in contact, contact
            to_tag = (ok.headers.get("To") or "").split("tag=")[1]
            phone.send(_request("ACK", tls_port, phone.port, 1, to_tag=to_tag))
            await asyncio.sleep(0.1)
            assert server.stats["established"] == 1
            phone.send(_request("BYE", tls_port, phone.port, 2, to_tag=to_tag))
            assert (await phone.final()).status == 200
            await asyncio.sleep(0.1)
            assert server.stats == {"offered": 1, "established": 1, "ended": 1}
            # Second call: wait for the bridge's BYE on this same connection.
            phone.send(_request("INVITE", tls_port, phone.port, 3, rtp_port, call="call-tls-2"))
            ok = await phone.final()
            to_tag = (ok.headers.get("To") or "").split("tag=")[1]
            phone.send(_request("ACK", tls_port, phone.port, 3, to_tag=to_tag, call="call-tls-2"))
            bye = await phone.next()
            assert isinstance(bye, SipRequest) and bye.method == "BYE"
            assert bye.headers.get("Call-ID") == "call-tls-2"
            assert "SIP/2.0/TLS" in (bye.headers.get("Via") or "")
            phone.send(make_response(bye, 200).to_bytes())
            await asyncio.sleep(0.1)
            assert server.stats == {"offered": 2, "established": 2, "ended": 2}
            assert server.ua is not None and server.ua.active_calls == 0
        finally:
            phone.close()
            rtp.close()
            await server.stop()

    asyncio.run(main())


async def _refused(port: int, ctx: ssl.SSLContext) -> None:
    """The handshake fails, or (TLS 1.3: the client finishes first) the stream dies unanswered."""
    try:
        phone = await Phone.connect(port, ctx)
    except (ssl.SSLError, ConnectionError):
        return
    try:
        phone.send(_request("OPTIONS", port, phone.port, 1))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await phone.final()
    finally:
        phone.close()


def test_verify_peer_refuses_phones_without_a_trusted_certificate(pki: Pki) -> None:
    async def main() -> None:
        server = BridgeServer(_config(pki, verify_peer=True))
        got: list[Received] = []
        server.transport.handler = got.append  # see exactly what reaches the SIP core
        await server.start()
        port = server.config.sip.tls.port
        try:
            await _refused(port, _phone_context(pki))  # no certificate at all
            await _refused(port, _phone_context(pki, pki.rogue_cert, pki.rogue_key))
            assert got == []
            # A phone whose certificate the CA signed is let in and answered.
            server.transport.handler = server._on_received
            await _options_ok(server, _phone_context(pki, pki.phone_cert, pki.phone_key))
        finally:
            await server.stop()

    asyncio.run(main())


def test_plain_tcp_on_the_tls_port_is_dropped_and_the_listener_lives_on(pki: Pki) -> None:
    async def main() -> None:
        server = BridgeServer(_config(pki))
        await server.start()
        port = server.config.sip.tls.port
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(_request("OPTIONS", port, 5999, 1))
            data = b""
            with pytest.raises(ConnectionError):  # a reset also ends it; both are fine
                while True:
                    chunk = await asyncio.wait_for(reader.read(4096), 5)
                    if not chunk:
                        raise ConnectionResetError("closed")
                    data += chunk
            assert b"SIP/2.0" not in data  # at most a TLS alert, never a SIP answer
            writer.close()
            assert server.transport._tls == {}  # it never got past the handshake
            await _options_ok(server, _phone_context(pki))
        finally:
            await server.stop()

    asyncio.run(main())


def test_transport_opens_tls_connections_and_replies_on_them(pki: Pki) -> None:
    """A client SipTransport connects out over TLS (verifying the name), the listener answers
    on that connection, and the client reuses it instead of opening another."""

    async def main() -> None:
        at_server: list[Received] = []
        at_client: list[Received] = []
        server = SipTransport(at_server.append)
        client = SipTransport(at_client.append)
        await server.start(HOST, 0, ("udp",))
        await server.start_tls(HOST, 0, tls_server_context(pki.server_cert, pki.server_key))
        await client.start(HOST, 0, ("udp",))
        try:
            with pytest.raises(TransportError, match="TLS is off"):
                assert server.tls_local is not None
                await client.send(b"x", server.tls_local, "tls")
            client.tls_client = tls_client_context(ca_file=pki.ca_cert, verify_peer=True)
            assert server.tls_local is not None
            for n in (1, 2):
                await client.send(_request("OPTIONS", 5061, 5999, n), server.tls_local, "tls")
            for _ in range(200):
                if len(at_server) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [r.transport for r in at_server] == ["tls", "tls"]
            assert at_server[0].source == at_server[1].source  # one connection for both
            req = at_server[0].message
            assert isinstance(req, SipRequest)
            await server.send(make_response(req, 200).to_bytes(), at_server[0].source, "tls")
            for _ in range(200):
                if at_client:
                    break
                await asyncio.sleep(0.01)
            assert at_client[0].transport == "tls"
            assert isinstance(at_client[0].message, SipResponse)
            assert at_client[0].message.status == 200
            assert len(client._tls) == 1 and len(server._tls) == 1
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())


def test_outgoing_tls_refuses_a_server_certificate_from_an_untrusted_ca(pki: Pki) -> None:
    """With verify_peer the bridge connecting out checks the peer's chain: a certificate
    signed by a CA not in ca_file fails the connection (a TransportError naming /tls)."""

    async def main() -> None:
        server = SipTransport(lambda r: None)
        client = SipTransport(lambda r: None)
        await server.start_tls(HOST, 0, tls_server_context(pki.rogue_cert, pki.rogue_key))
        client.tls_client = tls_client_context(ca_file=pki.ca_cert, verify_peer=True)
        try:
            assert server.tls_local is not None
            with pytest.raises(TransportError, match="/tls"):
                await client.send(b"OPTIONS", server.tls_local, "tls")
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())


def test_start_fails_cleanly_on_a_key_that_does_not_match(pki: Pki) -> None:
    """A config that names real but wrong files fails at start, naming TLS, and leaves
    no half-open listener behind (UDP/TCP are closed again)."""

    async def main() -> None:
        cfg = _config(pki)
        tls = replace(cfg.sip.tls, private_key=pki.phone_key)  # the phone's key, our cert
        server = BridgeServer(replace(cfg, sip=replace(cfg.sip, tls=tls)))
        with pytest.raises(TransportError, match=f"TLS on port {tls.port}"):
            await server.start()
        assert server.transport._udp is None and server.transport._tcp_server is None
        assert server.transport.tls_local is None

    asyncio.run(main())


def _toml(tmp_path: Path, tls: str) -> Path:
    """[sip.tls] is on line 4 (where a missing key is reported), its first key on line 5."""
    p = tmp_path / "bridge.toml"
    p.write_text(f'[sip]\nlisten = "127.0.0.1:5060"\n\n[sip.tls]\n{tls}\n', encoding="utf-8")
    return p


def test_config_tls_keys_load_and_resolve_relative_to_the_file(pki: Pki, tmp_path: Path) -> None:
    for name in ("server.pem", "server.key", "ca.pem"):
        (tmp_path / name).write_bytes((pki.dir / name.replace(".pem", ".cert")).read_bytes())
    cfg = load_config(
        _toml(
            tmp_path,
            'port = 5061\ncertificate = "server.pem"\nprivate_key = "server.key"\n'
            'ca_file = "ca.pem"\nverify_peer = true',
        )
    )
    tls = cfg.sip.tls
    assert tls.enabled and tls.port == 5061 and tls.verify_peer
    assert tls.certificate == str(tmp_path / "server.pem")
    assert tls.ca_file == str(tmp_path / "ca.pem")
    assert not load_config(None).sip.tls.enabled  # off by default


@pytest.mark.parametrize(
    ("tls", "key", "line", "message"),
    [
        ('port = 5061\ncertificate = "nope.pem"\nprivate_key = "k"', "certificate", 6, "no such"),
        ('port = 5061\ncertificate = "CERT"', "private_key", 4, "is required"),
        ('port = 5061\ncertificate = "CERT"\nprivate_key = "KEY"\nca_file = "x.pem"', "ca_file", 8,
         "no such"),
        ("port = 70000", "port", 5, "0 (off) or 1-65535"),
        ('port = 5061\nverify_peer = "yes"', "verify_peer", 6, "expected bool"),
        ("port = 5061\ncertfile = 'a'", "certfile", 6, "unknown key; allowed: ca_file"),
    ],
)  # fmt: skip
def test_config_tls_errors_name_file_line_and_key(
    pki: Pki, tmp_path: Path, tls: str, key: str, line: int, message: str
) -> None:
    tls = tls.replace("CERT", pki.server_cert).replace("KEY", pki.server_key)
    path = _toml(tmp_path, tls)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.path == str(path)
    assert err.value.key == f"sip.tls.{key}"
    assert err.value.line == line
    assert message in str(err.value)


def test_tls_off_needs_no_files(tmp_path: Path) -> None:
    cfg = load_config(_toml(tmp_path, 'port = 0\ncertificate = "missing.pem"'))
    assert not cfg.sip.tls.enabled
