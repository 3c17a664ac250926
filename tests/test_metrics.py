"""Prometheus metrics and /healthz: scraped over a real loopback socket, parsed by the
official text parser, so what a Prometheus server would see is what is checked."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sip_bridge.ops.metrics import (
    MAX_REQUEST,
    OUTCOMES,
    READ_TIMEOUT_S,
    TURN_STAGES,
    BridgeMetrics,
    MetricsServer,
)

pytestmark = pytest.mark.timeout(60)

Response = tuple[int, dict[str, str], bytes]


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run one test's coroutine, never longer than 30 s."""
    asyncio.run(asyncio.wait_for(coro, 30))


async def exchange(port: int, raw: bytes, timeout: float = 5.0) -> Response:
    """Send ``raw`` and read the whole answer (the server closes after one response)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    return parse_response(data)


def parse_response(data: bytes) -> Response:
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {data!r}"
    lines = head.decode("ascii").split("\r\n")
    version, code, _ = lines[0].split(" ", 2)
    assert version == "HTTP/1.1"
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    assert int(headers["content-length"]) == len(body) or not body
    return int(code), headers, body


async def get(port: int, path: str, method: str = "GET") -> Response:
    return await exchange(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


async def scrape(port: int) -> dict[str, list[Sample]]:
    """Sample lists by sample name (``..._bucket``, ``..._total``, ...)."""
    code, headers, body = await get(port, "/metrics")
    assert code == 200
    assert headers["content-type"] == BridgeMetrics.content_type
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(body.decode("utf-8")):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    """The one sample called ``name`` whose labels include ``labels``."""
    found = [
        s.value
        for s in samples.get(name, [])
        if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


def buckets(samples: dict[str, list[Sample]], name: str, **labels: str) -> dict[float, float]:
    """Cumulative bucket counts of one histogram series, by upper bound."""
    return {
        float(s.labels["le"]): s.value
        for s in samples[name + "_bucket"]
        if all(s.labels.get(k) == v for k, v in labels.items())
    }


async def serving(
    metrics: BridgeMetrics,
    body: Callable[[MetricsServer], Awaitable[None]],
    ready: Callable[[], bool] = lambda: True,
    **kwargs: Any,
) -> None:
    server = MetricsServer("127.0.0.1", 0, metrics, ready, **kwargs)
    await server.start()
    try:
        assert server.port > 0
        await body(server)
    finally:
        await server.stop()


def drive(m: BridgeMetrics) -> None:
    """A small day at the bridge: 3 offers, 2 answers, 3 ends, 3 turns, 3 model runs."""
    m.media_path("compiled")
    m.call_offered("carrier-1")
    m.call_offered("carrier-1")
    m.call_offered(None)
    m.call_answered(0.004)
    m.call_answered(0.15)
    m.set_active(7)
    m.set_active(2)
    m.call_ended("answered", 62.0, 3, 3000, 40.0, 1.5)
    m.call_ended("rejected", 0.0, 0, 0, 0.0, 0.0)
    m.call_ended("exploded", 3.0, 1, 100, 20.0, 0.0)  # not an outcome we know
    m.turn(
        {
            "end_of_turn_ms": 362.0,
            "asr_tail_ms": 45.0,
            "dialogue_ms": 0.6,
            "tts_first_audio_ms": 153.0,
            "write_to_wire_ms": 22.0,
        }
    )
    m.turn({"end_of_turn": 400.0, "tts_first_audio": 90.0, "total": 450.0})
    m.turn({"mystery_stage_ms": 7.0})
    m.model_inference("silero_vad", "CPUExecutionProvider", 0.0012)
    m.model_inference("silero_vad", "CPUExecutionProvider", 0.0030)
    m.model_inference("piper", "CUDAExecutionProvider", 0.070)


def test_scrape_has_exact_values_and_labels() -> None:
    async def body(server: MetricsServer) -> None:
        drive(server.metrics)
        s = await scrape(server.port)

        assert value(s, "sipbridge_calls_offered_total", trunk="carrier-1") == 2
        assert value(s, "sipbridge_calls_offered_total", trunk="none") == 1
        assert value(s, "sipbridge_active_calls") == 2
        assert value(s, "sipbridge_calls_total", outcome="answered") == 1
        assert value(s, "sipbridge_calls_total", outcome="rejected") == 1
        assert value(s, "sipbridge_calls_total", outcome="other") == 1
        for outcome in ("cancelled", "failed"):  # present from the start, at zero
            assert value(s, "sipbridge_calls_total", outcome=outcome) == 0
        assert {x.labels["outcome"] for x in s["sipbridge_calls_total"]} == {*OUTCOMES, "other"}

        setup = buckets(s, "sipbridge_call_setup_seconds")
        assert setup[0.001] == 0 and setup[0.005] == 1 and setup[0.1] == 1 and setup[0.2] == 2
        assert setup[math.inf] == 2
        assert value(s, "sipbridge_call_setup_seconds_count") == 2
        assert value(s, "sipbridge_call_setup_seconds_sum") == pytest.approx(0.154)

        assert value(s, "sipbridge_call_duration_seconds_count") == 3
        assert value(s, "sipbridge_call_duration_seconds_sum") == pytest.approx(65.0)
        assert value(s, "sipbridge_late_frames_total") == 4
        assert value(s, "sipbridge_frames_sent_total") == 3100
        # the rejected call had no media: no jitter-buffer or loss figure for it
        jb = buckets(s, "sipbridge_jitter_buffer_delay_seconds")
        assert jb[0.01] == 0 and jb[0.02] == 1 and jb[0.04] == 2 and jb[math.inf] == 2
        assert value(s, "sipbridge_jitter_buffer_delay_seconds_sum") == pytest.approx(0.06)
        loss = buckets(s, "sipbridge_call_loss_ratio")
        assert loss[0.0] == 1 and loss[0.01] == 1 and loss[0.02] == 2
        assert value(s, "sipbridge_call_loss_ratio_sum") == pytest.approx(0.015)

        turn = "sipbridge_turn_latency_seconds"
        assert value(s, turn + "_count", stage="end_of_turn") == 2
        assert value(s, turn + "_sum", stage="end_of_turn") == pytest.approx(0.762)
        assert value(s, turn + "_count", stage="asr_tail") == 1
        assert value(s, turn + "_count", stage="dialogue") == 1
        assert value(s, turn + "_count", stage="tts_first_audio") == 2
        assert value(s, turn + "_count", stage="other") == 1
        # totals: summed 582.6 ms, given 450 ms (stages overlap), summed 7 ms
        assert value(s, turn + "_count", stage="total") == 3
        assert value(s, turn + "_sum", stage="total") == pytest.approx(1.0396)
        total = buckets(s, turn, stage="total")
        assert total[0.01] == 1 and total[0.5] == 2 and total[0.6] == 3
        stages = {x.labels["stage"] for x in s[turn + "_count"]}
        assert stages == {*TURN_STAGES, "total", "other"}

        inf = "sipbridge_model_inference_seconds"
        cpu = {"model": "silero_vad", "provider": "CPUExecutionProvider"}
        assert value(s, inf + "_count", **cpu) == 2
        assert value(s, inf + "_sum", **cpu) == pytest.approx(0.0042)
        assert buckets(s, inf, **cpu)[0.002] == 1
        gpu = {"model": "piper", "provider": "CUDAExecutionProvider"}
        assert value(s, inf + "_count", **gpu) == 1
        assert value(s, "sipbridge_media_path_info", mode="compiled") == 1

        # every family is ours and documented
        _, _, text = await get(server.port, "/metrics")
        families = list(text_string_to_metric_families(text.decode()))
        assert families and all(f.name.startswith("sipbridge_") for f in families)
        assert all(f.documentation for f in families)

    run(serving(BridgeMetrics(), body))


def test_bucket_ranges_fit_what_they_measure() -> None:
    m = BridgeMetrics()
    m.call_answered(0.01)
    m.turn({"dialogue": 1.0})
    m.model_inference("m", "p", 0.01)

    async def body(server: MetricsServer) -> None:
        s = await scrape(server.port)
        setup = sorted(b for b in buckets(s, "sipbridge_call_setup_seconds") if b != math.inf)
        assert setup[0] == 0.001 and setup[-1] == 2.0 and len(setup) >= 8
        turn = buckets(s, "sipbridge_turn_latency_seconds", stage="total")
        bounds = sorted(b for b in turn if b != math.inf)
        assert bounds[0] == 0.01 and bounds[-1] == 5.0 and len(bounds) >= 10

    run(serving(m, body))


def test_dead_air_gaps_their_sum_and_each_calls_longest() -> None:
    m = BridgeMetrics()
    for gap in (0.42, 0.61, 1.3, 0.05):
        m.dead_air_gap(gap)
    m.dead_air_gap(float("nan"))  # dropped
    m.call_dead_air(1.3)
    m.call_dead_air(0.2)

    async def body(server: MetricsServer) -> None:
        s = await scrape(server.port)
        gaps = buckets(s, "sipbridge_dead_air_gap_seconds")
        assert gaps[0.1] == 1 and gaps[0.5] == 2 and gaps[1.0] == 3 and gaps[1.5] == 4
        assert value(s, "sipbridge_dead_air_seconds_total") == pytest.approx(2.38)
        longest = buckets(s, "sipbridge_call_dead_air_longest_seconds")
        assert longest[0.25] == 1 and longest[1.5] == 2 and longest[math.inf] == 2

    run(serving(m, body))


def test_media_path_change_replaces_the_mode() -> None:
    m = BridgeMetrics()
    m.media_path("compiled")
    m.media_path("python")

    async def body(server: MetricsServer) -> None:
        s = await scrape(server.port)
        assert [x.labels for x in s["sipbridge_media_path_info"]] == [{"mode": "python"}]
        server.metrics.media_path("something else")
        s = await scrape(server.port)
        assert [x.labels for x in s["sipbridge_media_path_info"]] == [{"mode": "other"}]

    run(serving(m, body))


def test_two_instances_do_not_share_values() -> None:
    a, b = BridgeMetrics(), BridgeMetrics()
    drive(a)
    b.call_offered("carrier-2")

    async def both() -> None:
        async def body_a(sa: MetricsServer) -> None:
            async def body_b(sb: MetricsServer) -> None:
                assert sa.port != sb.port
                sa_s, sb_s = await scrape(sa.port), await scrape(sb.port)
                assert value(sa_s, "sipbridge_calls_offered_total", trunk="carrier-1") == 2
                assert [x.labels["trunk"] for x in sb_s["sipbridge_calls_offered_total"]] == [
                    "carrier-2"
                ]
                assert value(sb_s, "sipbridge_calls_total", outcome="answered") == 0
                assert value(sb_s, "sipbridge_late_frames_total") == 0
                assert value(sb_s, "sipbridge_active_calls") == 0
                assert [x.labels for x in sb_s["sipbridge_media_path_info"]] == [{}]
                assert [x.labels for x in sa_s["sipbridge_media_path_info"]] == [
                    {"mode": "compiled"}
                ]

            await serving(b, body_b)

        await serving(a, body_a)

    run(both())


def test_label_values_stay_bounded() -> None:
    m = BridgeMetrics(max_label_values=3)
    for i in range(10):
        m.call_offered(f"trunk-{i}")
        m.model_inference(f"model-{i}", "CPUExecutionProvider", 0.001)
    m.call_offered("x" * 500)
    m.call_offered("trunk-1")  # one already seen keeps its own series

    async def body(server: MetricsServer) -> None:
        s = await scrape(server.port)
        trunks = {x.labels["trunk"]: x.value for x in s["sipbridge_calls_offered_total"]}
        assert trunks == {"trunk-0": 1, "trunk-1": 2, "trunk-2": 1, "other": 8}
        models = {x.labels["model"] for x in s["sipbridge_model_inference_seconds_count"]}
        assert models == {"model-0", "model-1", "model-2", "other"}

    run(serving(m, body))


def test_bad_figures_are_dropped_not_raised() -> None:
    m = BridgeMetrics()
    m.call_answered(float("nan"))
    m.call_answered(-1.0)
    m.set_active(-3)
    m.call_ended("failed", float("inf"), -5, -1, float("nan"), -2.0)
    m.turn({"end_of_turn": float("nan")})
    m.model_inference("m", "p", -0.1)

    async def body(server: MetricsServer) -> None:
        s = await scrape(server.port)
        assert value(s, "sipbridge_call_setup_seconds_count") == 0
        assert value(s, "sipbridge_active_calls") == 0
        assert value(s, "sipbridge_calls_total", outcome="failed") == 1
        assert value(s, "sipbridge_call_duration_seconds_count") == 0
        assert value(s, "sipbridge_late_frames_total") == 0
        assert value(s, "sipbridge_frames_sent_total") == 0
        assert value(s, "sipbridge_turn_latency_seconds_count", stage="total") == 0
        assert "sipbridge_model_inference_seconds_count" not in s

    run(serving(m, body))


def test_healthz_follows_readiness_and_draining() -> None:
    state = {"ready": False}

    async def body(server: MetricsServer) -> None:
        assert await get(server.port, "/healthz") == (503, _text_headers(9), b"starting\n")
        state["ready"] = True
        code, headers, text = await get(server.port, "/healthz")
        assert (code, text) == (200, b"ok\n")
        assert headers["content-type"] == "text/plain; charset=utf-8"
        server.set_draining(True)
        assert (await get(server.port, "/healthz"))[::2] == (503, b"draining\n")
        # metrics keep being served while draining
        assert (await get(server.port, "/metrics"))[0] == 200
        server.set_draining(False)
        assert (await get(server.port, "/healthz"))[::2] == (200, b"ok\n")
        assert (await get(server.port, "/healthz?verbose=1"))[::2] == (200, b"ok\n")

    run(serving(BridgeMetrics(), body, ready=lambda: state["ready"]))


def _text_headers(length: int) -> dict[str, str]:
    return {
        "content-type": "text/plain; charset=utf-8",
        "content-length": str(length),
        "cache-control": "no-store",
        "connection": "close",
    }


def test_healthz_when_ready_check_raises() -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    async def body(server: MetricsServer) -> None:
        assert (await get(server.port, "/healthz"))[::2] == (503, b"error\n")
        assert (await get(server.port, "/metrics"))[0] == 200  # the server lives on

    run(serving(BridgeMetrics(), body, ready=broken))


def test_errors_404_405_400() -> None:
    async def body(server: MetricsServer) -> None:
        port = server.port
        assert (await get(port, "/"))[::2] == (404, b"not found\n")
        assert (await get(port, "/metricsX"))[0] == 404
        code, headers, _ = await get(port, "/metrics", method="POST")
        assert code == 405 and headers["allow"] == "GET, HEAD"
        assert (await get(port, "/healthz", method="DELETE"))[0] == 405
        garbage = [
            b"hello\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET /metrics SIP/2.0\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"G(T /metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"\x00\x01\x02\xff\r\n\r\n",
        ]
        for raw in garbage:
            assert (await exchange(port, raw))[0] == 400, raw
        # still serving after all that
        assert (await get(port, "/healthz"))[0] == 200

    run(serving(BridgeMetrics(), body))


def test_head_gives_headers_only() -> None:
    m = BridgeMetrics()
    drive(m)

    async def body(server: MetricsServer) -> None:
        full = await get(server.port, "/metrics")
        code, headers, text = await get(server.port, "/metrics", method="HEAD")
        assert code == 200 and text == b""
        # same length, give or take the _created timestamps' digits
        assert abs(int(headers["content-length"]) - len(full[2])) < 200

    run(serving(m, body))


def test_oversized_request_is_refused_and_server_lives() -> None:
    async def body(server: MetricsServer) -> None:
        port = server.port
        started = time.monotonic()
        one_line = b"GET /" + b"a" * (2 * MAX_REQUEST) + b" HTTP/1.1\r\n\r\n"
        assert (await exchange(port, one_line))[0] == 431
        many = b"GET /metrics HTTP/1.1\r\n" + b"".join(
            b"X-Pad-%d: %s\r\n" % (i, b"b" * 100) for i in range(200)
        )
        assert len(many) > MAX_REQUEST
        assert (await exchange(port, many + b"\r\n"))[0] == 431
        assert time.monotonic() - started < 3.0
        assert (await get(port, "/healthz"))[0] == 200

    run(serving(BridgeMetrics(), body))


def test_slow_client_times_out_and_does_not_block_others() -> None:
    assert READ_TIMEOUT_S == 5.0 and MAX_REQUEST == 8192  # the documented defaults

    async def body(server: MetricsServer) -> None:
        port = server.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # ...and never finishes
        await writer.drain()
        started = time.monotonic()
        # others are served at once while the slow one hangs on
        for _ in range(3):
            assert (await get(port, "/healthz"))[0] == 200
        assert time.monotonic() - started < 0.4
        data = await asyncio.wait_for(reader.read(), 5.0)
        waited = time.monotonic() - started
        assert parse_response(data)[0] == 408
        assert 0.3 < waited < 3.0
        writer.close()

    run(serving(BridgeMetrics(), body, read_timeout_s=0.5))


def test_too_many_clients_get_busy_not_queued() -> None:
    async def body(server: MetricsServer) -> None:
        port = server.port
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.05)  # let the server accept them
        code, _, text = await get(port, "/metrics")
        assert (code, text) == (503, b"busy\n")
        for _, w in held:
            w.close()
        await asyncio.sleep(0.05)
        assert (await get(port, "/healthz"))[0] == 200

    run(serving(BridgeMetrics(), body, max_clients=2))


def test_stop_drops_slow_clients_and_closes_the_port() -> None:
    async def go() -> None:
        server = MetricsServer("127.0.0.1", 0, BridgeMetrics(), lambda: True)
        await server.start()
        port = server.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metr")
        await writer.drain()
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await server.stop()
        assert time.monotonic() - started < 2.0
        assert await asyncio.wait_for(reader.read(), 2.0) == b""  # closed, no answer
        writer.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        await server.stop()  # twice is harmless

    run(go())
