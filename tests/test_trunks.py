"""Trunks in the config, and the inbound admission policy built from them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from sip_bridge.config.loader import DEMO_PROFILE, ConfigError, InboundConfig, load_config
from sip_bridge.config.trunks import TrunkConfig
from sip_bridge.sip.admission import InboundPolicy
from sip_bridge.sip.digest import DigestClient, choose_challenge
from sip_bridge.sip.message import SipRequest, parse_message

INVITE = (
    b"INVITE sip:echo@127.0.0.1:5060 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 203.0.113.5:5060;branch=z9hG4bK-1\r\n"
    b"From: <sip:carrier@203.0.113.5>;tag=a\r\nTo: <sip:echo@127.0.0.1>\r\n"
    b"Call-ID: c1\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
)


def _invite(authorization: str | None = None) -> SipRequest:
    req = parse_message(INVITE)
    assert isinstance(req, SipRequest)
    if authorization is not None:
        req.headers.add("Authorization", authorization)
    return req


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bridge.toml"
    p.write_text(text)
    return p


TRUNK_FILE = """\
[sip]
listen = "127.0.0.1:5060"

[[trunks]]
name = "carrier"
registrar = "sip.carrier.example:5080"
username = "4420123"
auth_username = "acct-77"
password_env = "TEST_CARRIER_PW"
expires_s = 600
acl = ["203.0.113.0/24", "2001:db8::/32"]

[[trunks]]
name = "pbx"
inbound_auth = true
username = "pbx"
password_file = "pbx.secret"
realm = "bridge.example"
"""


def test_trunks_load_with_passwords_from_env_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_CARRIER_PW", "hunter2")
    (tmp_path / "pbx.secret").write_text("pbx-pass\n")
    cfg = load_config(_write(tmp_path, TRUNK_FILE))
    carrier, pbx = cfg.trunks
    assert carrier.name == "carrier" and carrier.registers and carrier.password == "hunter2"
    assert carrier.aor == "sip:4420123@sip.carrier.example" and carrier.digest_user == "acct-77"
    assert carrier.acl == ("203.0.113.0/24", "2001:db8::/32") and carrier.expires_s == 600
    assert pbx.inbound_auth and not pbx.registers and pbx.password == "pbx-pass"
    assert pbx.realm == "bridge.example"


@pytest.mark.parametrize(
    ("edit", "line", "key", "words"),
    [
        (("acl = [", 'acl = ["10.0.0.1/8", '), 11, "trunks[1].acl", "invalid CIDR"),
        (('name = "pbx"', 'name = "carrier"'), 14, "trunks[2].name", "duplicate"),
        (("expires_s = 600", "expires_s = 5"), 10, "trunks[1].expires_s", "60..86400"),
        (("expires_s = 600", "expire = 600"), 10, "trunks[1].expire", "unknown key"),
        (('username = "4420123"\n', ""), 4, "trunks[1].username", "required"),
        (("TEST_CARRIER_PW", "NO_SUCH_VAR_X"), 9, "trunks[1].password_env", "not set"),
        (("pbx.secret", "missing.secret"), 17, "trunks[2].password_file", "cannot read"),
        (("inbound_auth = true", "inbound_auth = 1"), 15, "trunks[2].inbound_auth", "bool"),
        (("registrar = ", "registrar = 5 #"), 6, "trunks[1].registrar", "expected str"),
    ],
)
def test_trunk_mistakes_name_file_line_and_key(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    edit: tuple[str, str],
    line: int,
    key: str,
    words: str,
) -> None:
    monkeypatch.setenv("TEST_CARRIER_PW", "hunter2")
    (tmp_path / "pbx.secret").write_text("pbx-pass\n")
    path = _write(tmp_path, TRUNK_FILE.replace(*edit))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.key == key and err.value.line == line, str(err.value)
    assert words in str(err.value) and str(path) in str(err.value)


def test_a_trunk_that_means_nothing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trunks\[1\].acl: a trunk needs registrar"):
        load_config(_write(tmp_path, '[[trunks]]\nname = "x"\n'))


# -- the admission policy -------------------------------------------------------------------


def _policy(*trunks: TrunkConfig, rate: float = 0.0) -> InboundPolicy:
    return InboundPolicy(trunks, InboundConfig(rate_per_s=rate, burst=2), 0.0, secret=b"k" * 32)


CARRIER = TrunkConfig("carrier", acl=("203.0.113.0/24",))
PBX = TrunkConfig("pbx", inbound_auth=True, username="pbx", password="pbx-pass", realm="r.example")


def test_without_trunks_everyone_may_call() -> None:
    assert _policy()(_invite(), ("198.51.100.1", 5060), 0.0).status == 0


def test_sources_outside_every_acl_get_403_and_inside_are_the_trunks() -> None:
    policy = _policy(CARRIER)
    inside = policy(_invite(), ("203.0.113.77", 5060), 0.0)
    assert inside.status == 0 and inside.trunk == "carrier"
    assert policy(_invite(), ("198.51.100.1", 5060), 0.0).status == 403
    assert policy(_invite(), ("::ffff:203.0.113.9", 5060), 0.0).trunk == "carrier"
    assert policy.counts == {"admitted": 2, "challenged": 0, "forbidden": 1, "rate_limited": 0}


def test_a_registering_trunk_admits_its_registrars_address() -> None:
    trunk = TrunkConfig("reg", registrar="sip.example", username="u", password="p")
    policy = _policy(trunk)
    assert policy(_invite(), ("192.0.2.8", 5060), 0.0).status == 403
    policy.set_registrar_addresses("reg", ["192.0.2.8"])
    assert policy(_invite(), ("192.0.2.8", 5060), 0.0).trunk == "reg"


def _answer(challenge_value: str, password: str) -> str:
    client = DigestClient("pbx", password)
    return client.authorize(
        choose_challenge([challenge_value]), "INVITE", "sip:echo@127.0.0.1:5060"
    )


@pytest.mark.parametrize("algorithm", ["SHA-256", "MD5"])
def test_digest_trunk_challenges_then_admits_the_right_password(algorithm: str) -> None:
    policy = _policy(PBX)
    first = policy(_invite(), ("192.0.2.50", 5060), 1.0)
    assert first.status == 401
    challenges = [v for k, v in first.headers if k == "WWW-Authenticate"]
    assert ["algorithm=SHA-256" in challenges[0], "algorithm=MD5" in challenges[1]] == [True, True]
    value = next(c for c in challenges if f"algorithm={algorithm}" in c)
    ok = policy(_invite(_answer(value, "pbx-pass")), ("192.0.2.50", 5060), 2.0)
    assert ok.status == 0 and ok.trunk == "pbx"
    bad = policy(_invite(_answer(value, "guess")), ("192.0.2.50", 5060), 2.0)
    assert bad.status == 403


def test_an_expired_nonce_is_challenged_again_as_stale() -> None:
    policy = _policy(PBX)
    value = policy(_invite(), ("192.0.2.50", 5060), 1.0).headers[0][1]
    late = policy(_invite(_answer(value, "pbx-pass")), ("192.0.2.50", 5060), 1000.0)
    assert late.status == 401 and "stale=TRUE" in late.headers[0][1]


def test_an_acl_trunk_without_auth_wins_over_a_digest_one() -> None:
    policy = _policy(PBX, CARRIER)
    assert policy(_invite(), ("203.0.113.1", 5060), 0.0).trunk == "carrier"
    assert policy(_invite(), ("192.0.2.1", 5060), 0.0).status == 401


def test_a_source_over_its_invite_rate_gets_503_with_retry_after() -> None:
    policy = _policy(rate=1.0)  # burst 2, then one a second
    src = ("198.51.100.1", 5060)
    assert [policy(_invite(), src, 0.0).status for _ in range(3)] == [0, 0, 503]
    assert ("Retry-After", "5") in policy(_invite(), src, 0.1).headers
    assert policy(_invite(), ("198.51.100.2", 5060), 0.1).status == 0  # others unaffected
    assert policy(_invite(), src, 1.5).status == 0  # refilled


def test_a_trunks_own_address_is_never_rate_limited_but_digest_peers_are() -> None:
    policy = InboundPolicy((CARRIER, PBX), InboundConfig(rate_per_s=1.0, burst=1), 0.0)
    assert {policy(_invite(), ("203.0.113.1", 5060), 0.0).status for _ in range(50)} == {0}
    other = ("192.0.2.1", 5060)
    assert [policy(_invite(), other, 0.0).status for _ in range(2)] == [401, 503]


def test_a_source_refused_too_often_is_silenced_but_never_a_trunk() -> None:
    cfg = InboundConfig(rate_per_s=1.0, burst=1, silence_after=5, silence_s=30.0)
    policy = InboundPolicy((CARRIER, PBX), cfg, 0.0)
    stranger, carrier = "198.51.100.7", "203.0.113.1"
    for k in range(4):  # a challenge (the PBX may be anywhere), then 503s past its rate
        assert policy(_invite(), (stranger, 5060), 0.1 * k).status in (401, 503)
        assert not policy.silenced(stranger, 0.1 * k)
    policy(_invite(), (stranger, 5060), 0.5)
    assert policy.silenced(stranger, 0.6) and policy.silenced_count == 1
    for _ in range(50):
        assert policy(_invite(), (carrier, 5060), 1.0).status == 0
    assert not policy.silenced(carrier, 1.0)
    assert not policy.silenced(stranger, 40.0)  # quiet for 30 s: answered again
    assert not InboundPolicy((CARRIER,), InboundConfig(silence_after=0), 0.0).silenced(
        stranger, 0.0
    )


def test_credentials_made_for_another_target_are_not_accepted() -> None:
    policy = _policy(PBX)
    value = policy(_invite(), ("192.0.2.50", 5060), 1.0).headers[0][1]
    challenge = choose_challenge([value])
    auth = DigestClient("pbx", "pbx-pass").authorize(challenge, "INVITE", "sip:echo@192.0.2.99")
    assert policy(_invite(auth), ("192.0.2.50", 5060), 2.0).status == 401


def test_the_trunk_examples_in_the_shipped_config_load_when_uncommented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = (Path(__file__).resolve().parents[1] / "config" / "bridge.toml").read_text()
    examples = shipped[shipped.index("# [[trunks]]") :]
    uncommented = [line.removeprefix("# ") for line in examples.splitlines()]
    lines = [line for line in uncommented if re.match(r"\[\[|\w+ = |\s+#", line)]
    monkeypatch.setenv("CARRIER_SIP_PASSWORD", "pw")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "office.pw").write_text("office-pw\n")
    (tmp_path / "agents").mkdir()  # the route examples name the demo profile
    shutil.copy(DEMO_PROFILE, tmp_path / "agents" / "demo.toml")
    cfg = load_config(_write(tmp_path, "\n".join(lines) + "\n"))
    assert [t.name for t in cfg.trunks] == ["carrier", "pbx", "office"]
    assert [r.name for r in cfg.routes] == ["support", "line-check", "gold-queue"]
    assert cfg.trunks[0].registers and cfg.trunks[2].password == "office-pw"
