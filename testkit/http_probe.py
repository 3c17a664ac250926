"""Reading a running bridge's HTTP endpoints in tests: a GET on loopback, a metric's value.

A plain asyncio client on purpose: the bridge under test shares the test's event loop, so a
blocking client (urllib) would wait for a server that can never answer it.
"""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families


async def http_get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` from 127.0.0.1:``port``: (status, body). One request, then closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


def metric_sample(body: str, name: str, **labels: str) -> float:
    """The value of sample ``name`` with ``labels`` in a Prometheus text exposition."""
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no {name} {labels}")
