"""Digest authentication: RFC 7616 worked example, parsing edge cases, client<->server trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sip_bridge.sip.digest import (
    ALGORITHMS,
    Challenge,
    DigestClient,
    DigestError,
    Verdict,
    choose_challenge,
    digest_response,
    make_challenge,
    make_nonce,
    parse_auth_params,
    parse_challenge,
    verify,
)

# RFC 7616 section 3.9.1
RFC_NONCE = "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v"
RFC_CNONCE = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"
RFC_OPAQUE = "FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"
RFC_REALM = "http-auth@example.org"
RFC_MD5 = "8ca523f5e9506fed4657c9700eebdbec"
RFC_SHA256 = "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"

SECRET = b"registrar-secret"
REALM = "sip.example.com"
URI = "sip:sip.example.com"
USERS = {"alice": "wonderland"}


def lookup(user: str, realm: str) -> str | None:
    return USERS.get(user) if realm == REALM else None


@pytest.mark.parametrize(("algorithm", "expected"), [("MD5", RFC_MD5), ("SHA-256", RFC_SHA256)])
def test_rfc7616_worked_example_response(algorithm: str, expected: str) -> None:
    got = digest_response(
        algorithm=algorithm,
        username="Mufasa",
        realm=RFC_REALM,
        password="Circle of Life",
        method="GET",
        uri="/dir/index.html",
        nonce=RFC_NONCE,
        nc="00000001",
        cnonce=RFC_CNONCE,
        qop="auth",
    )
    assert got == expected


@pytest.mark.parametrize(("algorithm", "expected"), [("MD5", RFC_MD5), ("SHA-256", RFC_SHA256)])
def test_rfc7616_example_through_client(algorithm: str, expected: str) -> None:
    header = (
        f'Digest realm="{RFC_REALM}", qop="auth, auth-int", algorithm={algorithm}, '
        f'nonce="{RFC_NONCE}", opaque="{RFC_OPAQUE}"'
    )
    challenge = parse_challenge(header)
    assert challenge.qop == ("auth", "auth-int")
    client = DigestClient("Mufasa", "Circle of Life", cnonce_source=lambda: RFC_CNONCE)
    value = client.authorize(challenge, "GET", "/dir/index.html")
    scheme, params = parse_auth_params(value)
    assert scheme == "Digest"
    assert params["response"] == expected
    assert params["nc"] == "00000001"
    assert params["qop"] == "auth"
    assert params["opaque"] == RFC_OPAQUE
    assert params["cnonce"] == RFC_CNONCE


def test_parse_challenge_quoted_commas_escapes_and_case() -> None:
    header = (
        'DIGEST  REALM="a, \\"quoted\\" realm" ,nonce = "n,1" , Algorithm=md5-SESS,'
        ' QOP="auth-int,auth", STALE=true, opaque="x\\\\y", domain="sip:a sip:b"'
    )
    c = parse_challenge(header)
    assert c == Challenge(
        realm='a, "quoted" realm',
        nonce="n,1",
        algorithm="MD5-sess",
        qop=("auth-int", "auth"),
        opaque="x\\y",
        stale=True,
    )


def test_parse_challenge_defaults_rfc2069() -> None:
    c = parse_challenge('Digest realm="r", nonce="n"')
    assert (c.algorithm, c.qop, c.stale, c.opaque) == ("MD5", (), False, None)


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Digest",  # no realm / nonce
        'Basic realm="r"',
        'Digest realm="r", nonce="n", algorithm=SHA-512-256-foo',
        'Digest realm="r" nonce="n"',  # missing comma
        'Digest realm="r, nonce="n"',  # unterminated quote
        'Digest realm="r", nonce',  # no value
        'Digest realm="r", realm="s", nonce="n"',  # duplicate
        'Digest realm="r", nonce=@',
    ],
)
def test_malformed_challenge_raises_digest_error(header: str) -> None:
    with pytest.raises(DigestError):
        parse_challenge(header)


@given(st.text(max_size=60))
def test_parser_never_raises_anything_but_digest_error(text: str) -> None:
    try:
        c = parse_challenge(text)
    except DigestError:
        return
    assert c.algorithm in ALGORITHMS


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=30))
def test_quoted_values_round_trip(username: str) -> None:
    header = DigestClient(username, "pw").authorize(Challenge('r"\\,', "n"), "REGISTER", URI)
    params = parse_auth_params(header)[1]
    assert params["username"] == username
    assert params["realm"] == 'r"\\,'


def test_choose_prefers_sha256_and_skips_unusable() -> None:
    values = [
        'Basic realm="r"',
        'Digest realm="r", nonce="m", algorithm=MD5, qop="auth"',
        'Digest realm="r", nonce="s", algorithm=SHA-256, qop="auth"',
        'Digest realm="r", nonce="x", algorithm=SHA-512-256',
    ]
    assert choose_challenge(values).nonce == "s"
    assert choose_challenge(values[:2]).algorithm == "MD5"
    with pytest.raises(DigestError):
        choose_challenge(['Basic realm="r"'])


def test_nc_counts_per_nonce() -> None:
    client = DigestClient("alice", "pw", cnonce_source=lambda: "c")
    a = Challenge(realm="r", nonce="a", qop=("auth",))
    b = Challenge(realm="r", nonce="b", qop=("auth",))
    ncs = [parse_auth_params(client.authorize(ch, "REGISTER", URI))[1]["nc"] for ch in (a, a, b, a)]
    assert ncs == ["00000001", "00000002", "00000001", "00000003"]


@pytest.mark.parametrize("algorithm", ["MD5", "MD5-sess", "SHA-256", "SHA-256-sess"])
def test_round_trip_client_server(algorithm: str) -> None:
    challenge = parse_challenge(make_challenge(REALM, 1000.0, SECRET, algorithm=algorithm))
    assert challenge.algorithm == algorithm
    header = DigestClient("alice", "wonderland").authorize(challenge, "REGISTER", URI)
    verdict = verify(header, "REGISTER", lookup, 1010.0, secret=SECRET, realm=REALM)
    assert verdict is Verdict.OK
    # the same header for another method does not verify
    assert verify(header, "INVITE", lookup, 1010.0, secret=SECRET, realm=REALM) is Verdict.BAD


def test_auth_int_covers_the_body() -> None:
    challenge = parse_challenge(make_challenge(REALM, 0.0, SECRET, qop="auth-int"))
    header = DigestClient("alice", "wonderland").authorize(challenge, "INVITE", URI, b"v=0\r\n")
    assert parse_auth_params(header)[1]["qop"] == "auth-int"
    ok = verify(header, "INVITE", lookup, 1.0, secret=SECRET, realm=REALM, body=b"v=0\r\n")
    assert ok is Verdict.OK
    bad = verify(header, "INVITE", lookup, 1.0, secret=SECRET, realm=REALM, body=b"v=1\r\n")
    assert bad is Verdict.BAD


def test_wrong_password_unknown_user_and_wrong_realm_are_bad() -> None:
    challenge = parse_challenge(make_challenge(REALM, 0.0, SECRET))
    wrong = DigestClient("alice", "looking-glass").authorize(challenge, "REGISTER", URI)
    assert verify(wrong, "REGISTER", lookup, 1.0, secret=SECRET, realm=REALM) is Verdict.BAD
    nobody = DigestClient("bob", "wonderland").authorize(challenge, "REGISTER", URI)
    assert verify(nobody, "REGISTER", lookup, 1.0, secret=SECRET, realm=REALM) is Verdict.BAD
    good = DigestClient("alice", "wonderland").authorize(challenge, "REGISTER", URI)
    assert verify(good, "REGISTER", lookup, 1.0, secret=SECRET, realm="other") is Verdict.BAD
    assert (
        verify(good, "REGISTER", lookup, 1.0, secret=SECRET, realm=REALM, request_uri="sip:x")
        is Verdict.BAD
    )


def test_replayed_old_nonce_is_stale_not_ok() -> None:
    challenge = parse_challenge(make_challenge(REALM, 0.0, SECRET))
    header = DigestClient("alice", "wonderland").authorize(challenge, "REGISTER", URI)
    assert verify(header, "REGISTER", lookup, 299.0, secret=SECRET, realm=REALM) is Verdict.OK
    late = verify(header, "REGISTER", lookup, 301.0, secret=SECRET, realm=REALM, max_age=300)
    assert late is Verdict.STALE
    # a stale nonce with the wrong password is still plainly bad
    wrong = DigestClient("alice", "nope").authorize(challenge, "REGISTER", URI)
    assert verify(wrong, "REGISTER", lookup, 301.0, secret=SECRET, realm=REALM) is Verdict.BAD
    assert "stale=TRUE" in make_challenge(REALM, 301.0, SECRET, stale=True)


def test_forged_or_foreign_nonce_is_bad() -> None:
    client = DigestClient("alice", "wonderland")
    for nonce in (
        make_nonce(REALM, 0.0, b"another-secret"),
        make_nonce("other.realm", 0.0, SECRET),
        make_nonce(REALM, 500.0, SECRET),  # issued in the future
        "not-base64!!",
        "",
    ):
        header = client.authorize(Challenge(REALM, nonce, "SHA-256", ("auth",)), "REGISTER", URI)
        assert verify(header, "REGISTER", lookup, 10.0, secret=SECRET, realm=REALM) is Verdict.BAD


@pytest.mark.parametrize(
    "header",
    ["garbage", "Basic dXNlcjpwdw==", 'Digest username="alice", realm="sip.example.com"'],
)
def test_malformed_authorization_is_bad(header: str) -> None:
    assert verify(header, "REGISTER", lookup, 0.0, secret=SECRET, realm=REALM) is Verdict.BAD


def test_tampered_nonce_timestamp_is_bad() -> None:
    nonce = make_nonce(REALM, 0.0, SECRET)
    forged = ("A" if nonce[0] != "A" else "B") + nonce[1:]
    client = DigestClient("alice", "wonderland")
    header = client.authorize(Challenge(REALM, forged, "MD5", ("auth",)), "REGISTER", URI)
    assert verify(header, "REGISTER", lookup, 1.0, secret=SECRET, realm=REALM) is Verdict.BAD
