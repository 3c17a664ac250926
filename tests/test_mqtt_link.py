"""Call events and commands over MQTT against a real mosquitto on loopback.

Every broker test starts its own broker (testkit/mosquitto_runner.py) and watches what the
bridge sends with a separate aiomqtt client, the way an operator's consumer would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiomqtt
import pytest

from sip_bridge.ops import call_events as ce
from sip_bridge.ops.call_events import (
    CommandError,
    HangupCommand,
    PauseCommand,
    ResumeCommand,
    SayCommand,
    TransferCommand,
    parse_command,
)
from sip_bridge.ops.mqtt_link import MqttLink
from testkit.mosquitto_runner import HOST, Mosquitto, free_port

pytestmark = pytest.mark.timeout(30)
NODE = "n1"


# ---- helpers ----


class Consumer:
    """What a consumer of the events saw, in arrival order."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.seen: list[tuple[str, dict[str, object]]] = []

    async def collect(self) -> None:
        async for message in self.client.messages:
            assert isinstance(message.payload, bytes)
            self.seen.append((str(message.topic), json.loads(message.payload)))

    def seqs(self) -> list[int]:
        return [int(str(p["seq"])) for _, p in self.seen]

    async def send(self, topic: str, payload: bytes) -> None:
        await self.client.publish(topic, payload, qos=1)


@contextlib.asynccontextmanager
async def consumer(port: int) -> AsyncIterator[Consumer]:
    async with aiomqtt.Client(HOST, port, identifier=f"consumer-{time.monotonic_ns()}") as client:
        await client.subscribe(ce.events_filter(NODE), qos=1)
        seen = Consumer(client)
        task = asyncio.create_task(seen.collect())
        try:
            yield seen
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def until(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def first_occurrences(seqs: list[int]) -> list[int]:
    """The stream a consumer keeps after dropping QoS 1 duplicates by seq."""
    kept: list[int] = []
    seen: set[int] = set()
    for seq in seqs:
        if seq not in seen:
            seen.add(seq)
            kept.append(seq)
    return kept


def no_command(call_id: str, command: ce.Command) -> None:
    raise AssertionError(f"unexpected command {command}")


def segments(spool: Path) -> list[Path]:
    return sorted(spool.glob("*.jsonl"))


# ---- the vocabulary (pure) ----


def test_event_topic_and_payload() -> None:
    fields = ce.turn("what time", "nine to five", {"asr": 41.5, "tts": float("nan")})
    payload = ce.build_event("n1", "c-7", "turn", 42, 1700000000.5, fields)
    assert ce.event_topic("n1", "c-7", "turn") == "sipbridge/n1/calls/c-7/turn"
    doc = json.loads(ce.encode_event(payload))
    assert doc == {
        "schema": 1,
        "event": "turn",
        "node": "n1",
        "call_id": "c-7",
        "seq": 42,
        "at": 1700000000.5,
        "caller_text": "what time",
        "agent_text": "nine to five",
        "timings_ms": {"asr": 41.5, "tts": None},
        "barged_in": False,
        "input": "speech",
        "keys": "",
    }
    line = ce.encode_event(ce.build_event("n1", "c", "error", 1, 0.0, ce.error("x", "a\nb")))
    assert b"\n" not in line
    record = ce.ended(
        started_at=100.0,
        answered_at=102.0,
        ended_at=132.5,
        outcome="completed",
        reason="caller hung up",
        codec="PCMU",
        stats={"packets_in": 1500, "lost_pct": 0.1, "jitter_ms": 3.2},
    )
    assert record["duration_s"] == 30.5 and record["stats"] == {
        "packets_in": 1500,
        "lost_pct": 0.1,
        "jitter_ms": 3.2,
    }
    with pytest.raises(ValueError, match="unknown event"):
        ce.event_topic("n1", "c", "exploded")
    # a Call-ID may hold what a topic level may not: escaped in the topic, back in commands
    for call_id, level in (("a/b@h", "a%2Fb@h"), ("+1", "%2B1"), ("x#%", "x%23%25")):
        topic = ce.event_topic("n1", call_id, "started")
        assert topic == f"sipbridge/n1/calls/{level}/started"
        command = ce.parse_command(ce.command_topic("n1", call_id), b'{"cmd": "hangup"}')
        assert command == ce.HangupCommand(call_id)
    for bad in ("", "x" * 300):
        with pytest.raises(ValueError):
            ce.event_topic("n1", bad, "started")
    for bad_node in ("a/b", "+"):
        with pytest.raises(ValueError):
            ce.event_topic(bad_node, "c", "started")
    with pytest.raises(ValueError, match="seq"):
        ce.build_event("n1", "c", "dtmf", 1, 0.0, {"seq": 5})


def test_parse_valid_commands() -> None:
    topic = "sipbridge/n1/cmd/call-9"
    assert parse_command(topic, b'{"cmd": "hangup"}') == HangupCommand("call-9")
    assert parse_command(topic, '{"cmd":"transfer","target":"sip:desk@pbx"}', node="n1") == (
        TransferCommand("call-9", "sip:desk@pbx")
    )
    assert parse_command(topic, '{"cmd":"say","text":"Hold on, please."}') == SayCommand(
        "call-9", "Hold on, please."
    )
    assert parse_command(topic, b'{"cmd":"pause"}') == PauseCommand("call-9")
    assert parse_command(topic, bytearray(b'{"cmd":"resume"}')) == ResumeCommand("call-9")
    # who sent it, for the call's timeline
    assert parse_command(topic, b'{"cmd":"hangup","by":"ops.desk-2"}') == HangupCommand(
        "call-9", "ops.desk-2"
    )


@pytest.mark.parametrize(
    ("topic", "payload", "message"),
    [
        ("sipbridge/n1/cmd/c1", b"hangup", "not JSON"),
        ("sipbridge/n1/cmd/c1", b"\xff\xfe", "not JSON"),
        ("sipbridge/n1/cmd/c1", b'["hangup"]', "JSON object"),
        ("sipbridge/n1/cmd/c1", b'{"command": "hangup"}', 'missing "cmd"'),
        ("sipbridge/n1/cmd/c1", b'{"cmd": 3}', 'missing "cmd"'),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "explode"}', "unknown cmd 'explode'"),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "hangup", "now": true}', "unexpected field(s) now"),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "pause", "text": "x"}', "unexpected field(s) text"),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "pause", "by": "a b"}', '"by" must be a name'),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "pause", "by": 7}', '"by" must be a name'),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "transfer"}', '"target" must be'),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "transfer", "target": 5}', '"target" must be'),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "say", "text": "  "}', '"text" must be'),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "say", "text": "a", "text": "b"}', "duplicate key"),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "say", "text": NaN}', "not JSON"),
        ("sipbridge/n1/cmd/c1", b'{"cmd": "say", "text": "' + b"a" * 5000 + b'"}', "longer"),
        ("sipbridge/n1/cmd/c1", b" " * (16 * 1024 + 1), "over 16384"),
        ("sipbridge/n1/calls/c1", b'{"cmd": "hangup"}', "wrong topic"),
        ("sipbridge/n1/cmd", b'{"cmd": "hangup"}', "wrong topic"),
        ("sipbridge/n1/cmd/c1/x", b'{"cmd": "hangup"}', "wrong topic"),
        ("other/n1/cmd/c1", b'{"cmd": "hangup"}', "wrong topic"),
        ("sipbridge/n2/cmd/c1", b'{"cmd": "hangup"}', "not 'n1'"),
        ("sipbridge/n1/cmd/", b'{"cmd": "hangup"}', "bad topic"),
    ],
)
def test_parse_command_rejects(topic: str, payload: bytes, message: str) -> None:
    result = parse_command(topic, payload, node="n1")
    assert isinstance(result, CommandError), result
    assert message in result.message


def test_oversize_limit_is_exact() -> None:
    body = b'{"cmd": "hangup"}'
    at_limit = body + b" " * (16 * 1024 - len(body))
    assert parse_command("sipbridge/n1/cmd/c", at_limit) == HangupCommand("c")
    assert isinstance(parse_command("sipbridge/n1/cmd/c", at_limit + b" "), CommandError)


# ---- the link against a real broker ----


def test_events_arrive_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        with Mosquitto(tmp_path / "broker") as broker:
            async with consumer(broker.port) as seen:
                link = MqttLink(HOST, broker.port, NODE, tmp_path / "spool", no_command)
                await link.start()
                await until(lambda: link.connected, "connect")
                sent = [
                    ("a", "started", ce.started("sip:alice@x", "sip:voice@y", trunk="t1")),
                    ("b", "started", ce.started("sip:bob@x", "sip:voice@y")),
                    ("a", "answered", ce.answered("PCMU")),
                    ("a", "turn", ce.turn("hours?", "nine to five", {"asr": 40.0})),
                    ("b", "dtmf", ce.dtmf("1")),
                    ("a", "transfer", ce.transfer("sip:desk@pbx", "accepted")),
                    ("b", "error", ce.error("agent", "tts failed")),
                ]
                seqs = [link.publish(call, event, fields) for call, event, fields in sent]
                assert seqs == list(range(1, 8))
                await until(lambda: len(seen.seen) >= len(sent), "all events")
                await until(lambda: link.pending == 0, "acks")
                await link.stop()
        assert seen.seqs() == seqs
        for (call, event, fields), (topic, doc) in zip(sent, seen.seen, strict=True):
            assert topic == f"sipbridge/{NODE}/calls/{call}/{event}"
            assert doc["schema"] == 1 and doc["node"] == NODE and doc["call_id"] == call
            assert doc["event"] == event
            assert abs(float(str(doc["at"])) - time.time()) < 30
            assert {k: doc[k] for k in fields} == fields
        assert link.stats.spooled == 7 and link.stats.delivered == 7
        assert link.stats.published == 7 and link.stats.reconnects == 0

    asyncio.run(main())


def test_broker_outage_spools_then_delivers_everything(tmp_path: Path) -> None:
    total = 400
    took: list[float] = []

    async def produce(link: MqttLink) -> None:
        """A call's media path: events every 2 ms, whatever the broker does."""
        for i in range(total):
            t0 = time.perf_counter()
            link.publish(f"call-{i % 3}", "turn", ce.turn(f"q{i}", f"a{i}", {"asr": 1.0}))
            took.append(time.perf_counter() - t0)
            await asyncio.sleep(0.002)

    async def main() -> None:
        broker = Mosquitto(tmp_path / "broker")
        broker.start()
        try:
            link = MqttLink(HOST, broker.port, NODE, tmp_path / "spool", no_command)
            async with consumer(broker.port) as before:
                await link.start()
                await until(lambda: link.connected, "connect")
                producer = asyncio.create_task(produce(link))
                await until(lambda: link.stats.delivered >= 60, "some deliveries")
                await asyncio.to_thread(broker.stop)  # mid-stream
                await until(lambda: not link.connected, "link noticing the outage")
                outage_from = len(took)
            await producer
            assert link.pending > 0 and segments(tmp_path / "spool")
            assert link.stats.spooled == total
            # two failed attempts: the next one is >= 2 s away (backoff 0.5, 1, 2 ...), so
            # the consumer below is subscribed before the link comes back
            await until(lambda: link.stats.connect_failures >= 2, "backoff", timeout=8)
            await asyncio.to_thread(broker.start)
            async with consumer(broker.port) as after:
                await until(lambda: link.connected, "reconnect", timeout=15)
                await until(lambda: link.pending == 0, "resent events")
                await until(lambda: max(after.seqs(), default=0) == total, "consumer catching up")
                await link.stop()
        finally:
            broker.stop()
        assert total - outage_from > 100, "most events were published during the outage"
        # publish never waits on the broker: a blocked call would cost a connect's or a
        # send's timeout (hundreds of ms) and repeat for every event of the outage, while
        # one preemption of the test's process on a loaded machine costs a few ms once
        # (6.04 ms once in a full suite run): so count the slow ones, not the maximum
        slow = sorted(took)
        assert slow[len(slow) // 2] < 0.001, f"median publish {slow[len(slow) // 2]:.4f} s"
        over = sum(t >= 0.005 for t in took)
        assert over <= total // 100, f"{over} publishes took 5 ms or more"
        assert slow[-1] < 0.1, f"a publish took {slow[-1] * 1000:.1f} ms"
        stream = first_occurrences(before.seqs() + after.seqs())
        assert stream == list(range(1, total + 1)), "every seq once, in order, after dedup"
        for call in ("call-0", "call-1", "call-2"):
            per_call = first_occurrences(
                [int(str(d["seq"])) for _, d in before.seen + after.seen if d["call_id"] == call]
            )
            assert per_call == sorted(per_call) and len(per_call) > 100
        assert link.stats.reconnects == 1 and link.stats.delivered == total
        assert link.stats.published >= total

    asyncio.run(main())


def test_restart_resends_what_was_not_acknowledged(tmp_path: Path) -> None:
    spool = tmp_path / "spool"

    async def main() -> None:
        broker = Mosquitto(tmp_path / "broker")
        broker.start()
        try:
            async with consumer(broker.port) as first:
                link = MqttLink(HOST, broker.port, NODE, spool, no_command)
                await link.start()
                await until(lambda: link.connected, "connect")
                for i in range(10):
                    link.publish("c1", "dtmf", ce.dtmf(str(i)))
                await until(lambda: link.pending == 0 and len(first.seen) == 10, "delivery")
            broker.stop()
            await until(lambda: not link.connected, "outage")
            for i in range(15):
                link.publish("c1", "turn", ce.turn(f"q{i}", f"a{i}", {}))
            await link.stop()  # the bridge goes away with 15 events unacknowledged
            assert json.loads((spool / "cursor.json").read_text())["delivered"] == 10

            broker.start()
            async with consumer(broker.port) as second:
                again = MqttLink(HOST, broker.port, NODE, spool, no_command)
                assert again.pending == 15
                await again.start()
                await until(lambda: again.connected, "reconnect")
                assert again.publish("c1", "ended", {"outcome": "completed"}) == 26
                await until(lambda: again.pending == 0, "resend")
                await until(lambda: len(second.seen) >= 16, "consumer")
                await again.stop()
        finally:
            broker.stop()
        assert first.seqs() == list(range(1, 11))
        assert first_occurrences(second.seqs()) == list(range(11, 27))
        assert [d["caller_text"] for _, d in second.seen[:15]] == [f"q{i}" for i in range(15)]

    asyncio.run(main())


def test_torn_spool_tail_is_ignored(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    port = free_port()
    crashed = MqttLink(HOST, port, NODE, spool, no_command)
    for i in range(5):
        crashed.publish("c1", "dtmf", ce.dtmf(str(i)))
    (segment,) = segments(spool)
    good = segment.read_bytes()
    with segment.open("ab") as f:  # the process died half-way through a line
        f.write(b'{"schema":1,"event":"dtmf","node":"n1","call_id":"c1","seq":6,"di')

    async def main() -> None:
        recovered = MqttLink(HOST, port, NODE, spool, no_command)
        assert segment.read_bytes() == good, "the torn tail is cut off"
        assert recovered.pending == 5
        assert recovered.publish("c1", "dtmf", ce.dtmf("#")) == 6
        with Mosquitto(tmp_path / "broker", port=port):
            async with consumer(port) as seen:
                await recovered.start()
                await until(lambda: len(seen.seen) >= 6 and recovered.pending == 0, "delivery")
                await recovered.stop()
        assert seen.seqs() == [1, 2, 3, 4, 5, 6]
        assert [d["digit"] for _, d in seen.seen] == ["0", "1", "2", "3", "4", "#"]

    asyncio.run(main())


def test_compaction_and_spool_bound(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    port = free_port()
    link = MqttLink(HOST, port, NODE, spool, no_command, max_spool_bytes=64 * 1024, compact_bytes=0)
    for i in range(2000):  # ~150 bytes each: about 300 KB into a 64 KB bound
        link.publish(f"c{i % 4}", "turn", ce.turn(f"question {i}", f"answer {i}", {"asr": 1.0}))
    assert link.stats.dropped > 0
    assert sum(p.stat().st_size for p in segments(spool)) <= 64 * 1024 + 200
    assert link.stats.dropped + link.pending == 2000

    async def main() -> None:
        with Mosquitto(tmp_path / "broker", port=port):
            async with consumer(port) as seen:
                await link.start()
                await until(lambda: link.pending == 0, "delivery")
                await until(lambda: len(seen.seen) >= 2000 - link.stats.dropped, "consumer")
                await link.stop()
        kept = seen.seqs()
        assert kept == list(range(link.stats.dropped + 1, 2001)), "the newest survive, in order"

    asyncio.run(main())
    assert segments(spool) == [], "everything delivered: the spool is compacted"
    assert MqttLink(HOST, port, NODE, spool, no_command).publish("c1", "dtmf", ce.dtmf("1")) == 2001


def test_what_the_broker_has_is_not_kept_in_the_spool(tmp_path: Path) -> None:
    """Events hold what callers said: once acknowledged they leave the disk, the active
    segment included, at every delivery (not only once it has grown); what is still on its
    way stays until it is delivered."""
    spool = tmp_path / "spool"

    def spooled_text() -> str:
        return "".join(p.read_text() for p in segments(spool))

    async def main() -> None:
        with Mosquitto(tmp_path / "broker") as broker:
            async with consumer(broker.port) as seen:
                link = MqttLink(HOST, broker.port, NODE, spool, no_command)  # the defaults
                await link.start()
                await until(lambda: link.connected, "connect")
                for i in range(3):
                    link.publish("c1", "turn", ce.turn(f"my secret {i}", "noted", {}))
                    await until(lambda: link.pending == 0, "delivery")
                    await until(lambda: "secret" not in spooled_text(), "the spool emptied")
                await until(lambda: len(seen.seen) == 3, "consumer")
                broker.stop()  # the broker goes away: what is sent meanwhile is kept
                await until(lambda: not link.connected, "disconnect")
                link.publish("c1", "turn", ce.turn("said during the outage", "ok", {}))
                assert "during the outage" in spooled_text() and link.pending == 1
                broker.start()
                await until(lambda: link.pending == 0, "delivery after the outage", 20)
                await until(lambda: segments(spool) == [], "the spool emptied again")
                await link.stop()

    asyncio.run(main())


def test_commands_reach_the_handler_and_garbage_becomes_error_events(tmp_path: Path) -> None:
    got: list[tuple[str, ce.Command]] = []

    async def handler(call_id: str, command: ce.Command) -> None:
        if isinstance(command, SayCommand) and command.text == "boom":
            raise RuntimeError("tts is down")
        got.append((call_id, command))

    async def main() -> None:
        with Mosquitto(tmp_path / "broker") as broker:
            async with consumer(broker.port) as ctl:
                link = MqttLink(HOST, broker.port, NODE, tmp_path / "spool", handler)
                await link.start()
                await until(lambda: link.connected, "connect")
                topic = ce.command_topic(NODE, "c1")
                for command in [
                    {"cmd": "hangup"},
                    {"cmd": "transfer", "target": "sip:desk@pbx"},
                    {"cmd": "say", "text": "One moment."},
                    {"cmd": "pause"},
                    {"cmd": "resume"},
                ]:
                    await ctl.send(topic, json.dumps(command).encode())
                await until(lambda: len(got) == 5, "five commands")
                garbage = [
                    (topic, b"{not json"),
                    (topic, b'{"cmd": "explode"}'),
                    (topic, b'{"cmd": "say"}'),
                    (topic, b'{"cmd": "hangup", "force": true}'),
                    (topic, b'{"cmd": "say", "text": "' + b"x" * (17 * 1024) + b'"}'),
                    (f"sipbridge/{NODE}/cmd/", b'{"cmd": "hangup"}'),
                    (topic, b'{"cmd": "say", "text": "boom"}'),
                ]
                for bad_topic, junk in garbage:
                    await ctl.send(bad_topic, junk)
                await until(lambda: len(ctl.seen) >= len(garbage), "error events")
                await ctl.send(ce.command_topic(NODE, "c2"), b'{"cmd": "hangup"}')
                await until(lambda: len(got) == 6, "a command after the garbage")
                assert link.connected
                await link.stop()
        assert got == [
            ("c1", HangupCommand("c1")),
            ("c1", TransferCommand("c1", "sip:desk@pbx")),
            ("c1", SayCommand("c1", "One moment.")),
            ("c1", PauseCommand("c1")),
            ("c1", ResumeCommand("c1")),
            ("c2", HangupCommand("c2")),
        ]
        topics = [t for t, _ in ctl.seen]
        assert topics == [f"sipbridge/{NODE}/calls/c1/error"] * 5 + [
            f"sipbridge/{NODE}/calls/-/error",
            f"sipbridge/{NODE}/calls/c1/error",
        ]
        messages = [str(d["message"]) for _, d in ctl.seen]
        for doc_message, expected in zip(
            messages,
            [
                "not JSON",
                "unknown cmd",
                '"text" must be',
                "unexpected field",
                "over 16384",
                "bad topic",
                "handler failed: tts is down",
            ],
            strict=True,
        ):
            assert expected in doc_message
        assert all(d["source"] == "command" for _, d in ctl.seen)
        assert link.stats.commands == 7 and link.stats.commands_rejected == 6

    asyncio.run(main())
