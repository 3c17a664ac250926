"""The console's rules without a server: tokens found by secret, browser logins that expire
or go with their token, and the per-source limit on wrong guesses (sip_bridge.web.web_auth)."""

from __future__ import annotations

from sip_bridge.config.config_types import HttpToken
from sip_bridge.web.web_auth import GuessLimit, Logins, find_token

ANN = HttpToken("ann", "viewer", "a" * 20)
OPS = HttpToken("desk-1", "operator", "o" * 20)


def test_a_token_is_found_by_its_secret_only() -> None:
    tokens = [ANN, OPS]
    assert find_token(tokens, "o" * 20) is OPS and find_token(tokens, "a" * 20) is ANN
    assert find_token(tokens, "") is None and find_token(tokens, "a" * 19) is None
    assert find_token([], "a" * 20) is None


def test_logins_expire_and_go_with_their_token() -> None:
    now = [0.0]
    logins = Logins(ttl_s=100.0, clock=lambda: now[0], limit=2)
    a = logins.open(ANN)
    assert a.id != a.csrf and len(a.id) >= 40  # unguessable, and not the same secret
    assert logins.get(a.id, [ANN, OPS]) == a and logins.get("", [ANN]) is None
    assert logins.get(a.id, [OPS]) is None, "a reload took the token away: the login goes"
    assert logins.get(a.id, [ANN, OPS]) is None  # and stays gone
    b = logins.open(OPS)
    now[0] = 100.0
    assert logins.get(b.id, [OPS]) is None  # expired
    made = [logins.open(OPS) for _ in range(3)]  # bounded: the oldest go first
    assert logins.get(made[0].id, [OPS]) is None and logins.get(made[2].id, [OPS]) is not None


def test_wrong_guesses_block_a_source_for_a_while() -> None:
    now = [0.0]
    limit = GuessLimit(max_failures=3, window_s=10.0, lockout_s=30.0, clock=lambda: now[0])
    assert not limit.failed("10.0.0.1") and not limit.failed("10.0.0.1")
    now[0] = 11.0  # the first two left the window
    assert not limit.failed("10.0.0.1") and not limit.failed("10.0.0.1")
    assert limit.retry_after("10.0.0.1") == 0.0
    assert limit.failed("10.0.0.1"), "three within ten seconds"
    assert limit.retry_after("10.0.0.1") == 30.0 and limit.retry_after("10.0.0.2") == 0.0
    now[0] = 41.0
    assert limit.retry_after("10.0.0.1") == 0.0 and limit.refused == 1
