"""A bridge with [mqtt] on: a real call's events reach a subscriber, an operator's commands
reach the call (hang up; say to an agent that cannot speak gets an error event)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiomqtt

from sip_bridge.config.loader import load_config
from sip_bridge.script.caller import CallOptions, place_call
from sip_bridge.server import BridgeServer
from testkit.mosquitto_runner import Mosquitto
from testkit.sipp_media import tone, write_wav


def _config(tmp_path: Path, broker: Mosquitto, node: str) -> Path:
    f = tmp_path / "bridge.toml"
    f.write_text(
        '[sip]\nlisten = "127.0.0.1:0"\n[rtp]\nports = "45600-45699"\n'
        f'[agent]\nname = "echo"\n[node]\nname = "{node}"\n[http]\nlisten = ""\n'
        '[records]\ndb = "calls.sqlite"\n'
        f'[mqtt]\nenabled = true\nport = {broker.port}\nspool_dir = "spool"\n'
    )
    return f


async def _collect_until(ops: aiomqtt.Client, got: list[dict[str, Any]], event: str) -> None:
    """Append every event the subscription delivers to ``got``, up to one of kind ``event``."""
    async for msg in ops.messages:
        got.append(json.loads(bytes(msg.payload)))
        if got[-1]["event"] == event:
            return


def test_call_events_and_operator_commands_over_mqtt(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "broker")
    broker.start()
    f = _config(tmp_path, broker, "node-a")
    play = write_wav(tmp_path / "a.wav", tone((440,), 1.0, 0.2))

    async def main() -> tuple[list[dict[str, Any]], float]:
        got: list[dict[str, Any]] = []
        server = BridgeServer(load_config(f))
        await server.start()
        try:
            async with aiomqtt.Client("127.0.0.1", broker.port, identifier="ops") as ops:
                await ops.subscribe("sipbridge/node-a/calls/#", qos=1)
                for _ in range(100):  # the bridge's link is up (its command subscription too)
                    if server.telemetry.mqtt is not None and server.telemetry.mqtt.connected:
                        break
                    await asyncio.sleep(0.05)
                call = asyncio.ensure_future(place_call(CallOptions(
                    f"sip:7000@127.0.0.1:{server.port}", play, tmp_path / "heard.wav",
                    duration_s=20.0, rtp_ports=(45700, 45799),
                )))  # fmt: skip
                loop = asyncio.get_running_loop()
                hung_up_at = 0.0

                async def consume() -> None:
                    nonlocal hung_up_at
                    async for msg in ops.messages:
                        event = json.loads(bytes(msg.payload))
                        event["topic"] = str(msg.topic)
                        got.append(event)
                        cmd = f"sipbridge/node-a/cmd/{event['call_id']}"
                        if event["event"] == "answered":  # an operator acts on the call
                            say = {"cmd": "say", "text": "hello"}
                            await ops.publish(cmd, json.dumps(say), qos=1)
                            await ops.publish(cmd, "not json", qos=1)
                        elif event["event"] == "error" and not hung_up_at:
                            hung_up_at = loop.time()
                            await ops.publish(cmd, json.dumps({"cmd": "hangup"}), qos=1)
                        elif event["event"] == "ended":
                            return

                await asyncio.wait_for(consume(), 15)
                result = await call
                assert result.answered
                return got, result.recorded_s
        finally:
            await server.stop()

    try:
        events, recorded_s = asyncio.run(main())
    finally:
        broker.stop()
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["started", "answered"] and kinds[-1] == "ended", kinds
    assert kinds.count("error") == 2, kinds  # "say" to an echo, and the garbage
    errors = " ".join(json.dumps(e) for e in events if e["event"] == "error")
    assert "does not take say" in errors
    call_id = events[0]["call_id"]
    assert all(e["call_id"] == call_id and e["node"] == "node-a" for e in events)
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # in order, once each
    started, answered, ended = events[0], events[1], events[-1]
    assert started["topic"] == f"sipbridge/node-a/calls/{call_id}/started"
    assert "7000" in started["callee"] and started["agent"] == "echo"
    assert answered["codec"] == "PCMU" and answered["setup_ms"] >= 0
    assert ended["outcome"] == "answered" and ended["reason"] == "operator hung up"
    assert ended["stats"]["packets_out"] > 0 and ended["agent"] == "echo" and ended["schema"] == 1
    assert recorded_s < 15  # the hangup ended the 20 s call early


def test_events_of_a_call_during_a_broker_outage_arrive_after_it(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "broker")
    broker.start()
    f = _config(tmp_path, broker, "node-b")
    play = write_wav(tmp_path / "a.wav", tone((440,), 1.0, 0.2))

    async def main() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        server = BridgeServer(load_config(f))
        await server.start()
        try:
            async with aiomqtt.Client("127.0.0.1", broker.port, identifier="ops1") as ops:
                await ops.subscribe("sipbridge/node-b/calls/#", qos=1)
                for _ in range(100):
                    if server.telemetry.mqtt is not None and server.telemetry.mqtt.connected:
                        break
                    await asyncio.sleep(0.05)
                call = asyncio.ensure_future(place_call(CallOptions(
                    f"sip:7000@127.0.0.1:{server.port}", play, tmp_path / "heard.wav",
                    duration_s=2.0, rtp_ports=(45700, 45799),
                )))  # fmt: skip
                await _collect_until(ops, got, "answered")
            broker.stop()  # mid-call: the call ends while the broker is away
            assert (await call).answered
            link = server.telemetry.mqtt
            assert link is not None
            while link.stats.connect_failures < 3:  # its next try is >= 2 s away now
                await asyncio.sleep(0.1)
            assert link.pending >= 1  # "ended" waits in the spool
            broker.start()
            async with aiomqtt.Client("127.0.0.1", broker.port, identifier="ops2") as ops:
                await ops.subscribe("sipbridge/node-b/calls/#", qos=1)
                async with asyncio.timeout(20):
                    await _collect_until(ops, got, "ended")
        finally:
            await server.stop()
        return got

    try:
        events = asyncio.run(main())
    finally:
        broker.stop()
    by_seq = {e["seq"]: e for e in events}  # QoS 1: a resent event shows twice; keep one
    seqs = sorted(by_seq)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # none missing
    assert [by_seq[s]["event"] for s in seqs] == ["started", "answered", "ended"]
    assert by_seq[seqs[-1]]["outcome"] == "answered"


def test_calls_cut_off_by_a_crash_get_their_ended_event_at_the_next_start(
    tmp_path: Path,
) -> None:
    """kill -9 leaves a call with a `started` event and no `ended`: the next start marks its
    record interrupted and sends that `ended`, so a subscriber never waits for it forever."""
    from sip_bridge.ops.records import CallRecords

    broker = Mosquitto(tmp_path / "broker")
    broker.start()
    f = _config(tmp_path, broker, "node-c")
    # keep_days = 0: these 1970 rows would otherwise be purged at start (older than 90 days)
    f.write_text(f.read_text().replace("[records]\n", "[records]\nkeep_days = 0\n"))
    store = CallRecords(str(tmp_path / "calls.sqlite"))
    store.call_started("cut-1", node="node-c", trunk=None, caller="100", callee="7000",
                       remote="127.0.0.1:5062", agent="echo", at=1000.0)  # fmt: skip
    store.call_answered("cut-1", codec="PCMU", agent="echo", remote="127.0.0.1:5062", at=1000.5)
    store.call_started("other-node", node="node-d", trunk=None, caller="1", callee="2",
                       remote="127.0.0.1:5062", agent="echo", at=1000.0)  # fmt: skip
    store.close()

    async def main() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="ops") as ops:
            await ops.subscribe("sipbridge/+/calls/#", qos=1)
            server = BridgeServer(load_config(f))
            await server.start()
            try:
                await asyncio.wait_for(_collect_until(ops, got, "ended"), 10)
            finally:
                await server.stop()
        return got

    try:
        events = asyncio.run(main())
    finally:
        broker.stop()
    [ended] = events
    assert ended["call_id"] == "cut-1" and ended["node"] == "node-c"
    assert ended["outcome"] == "interrupted" and ended["answered_at"] == 1000.5
    assert ended["caller"] == "100" and ended["callee"] == "7000" and ended["reason"]
    rows = {r["call_id"]: r for r in CallRecords(str(tmp_path / "calls.sqlite")).list()}
    assert rows["cut-1"]["outcome"] == "interrupted"
    assert rows["other-node"]["ended_at"] is None  # another node's call is not ours to end
