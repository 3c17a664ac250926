"""The talk page and the operator console in a real browser (headless Chromium, off the
network), against `sip-bridge run` with the shipped config: the voice agent, demo profile.

The browser's microphone is a WAV file saying a question; the test reads the reply's
transcript from the page and transcribes back, with our ASR, the audio the page itself
recorded from the WebRTC stream. The console must list a SIP call while it is in progress
(placed by `sip-bridge call`), hang it up once signed in (/login) with the operator token,
and then show it in the history with its per-stage latency chart and its timeline naming
the operator. Screenshots of each page land in the test's output directory.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pytest
from numpy.typing import NDArray
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from resample import Resampler
from sip_bridge.agents import prepare_agents
from sip_bridge.config.loader import load_config
from testkit.peers.chromium import chromium, start_recording, stop_recording
from testkit.peers.support import free_udp_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "operator-token-for-the-browser-test"
QUESTION = "What are your opening hours?"
FILE_RATE = 16000


@dataclass
class Bridge:
    proc: subprocess.Popen[str]
    url: str  # http://127.0.0.1:PORT
    sip_port: int
    out: Path  # screenshots, recordings


def _speech_wav(path: Path, text: str, lead_s: float, tail_s: float) -> None:
    """espeak-ng saying ``text`` at 48 kHz, between silences (Chromium loops the file)."""
    raw = path.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(raw), text], check=True)
    with wave.open(str(raw)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    speech = Resampler(rate, FILE_RATE).process(pcm)
    pad = [np.zeros(int(s * FILE_RATE), np.int16) for s in (lead_s, tail_s)]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(FILE_RATE)
        w.writeframes(np.concatenate([pad[0], speech, pad[1]]).tobytes())


def _config(tmp: Path) -> Path:
    """The shipped bridge.toml with an operator token, its relative paths made absolute."""
    text = (ROOT / "config" / "bridge.toml").read_text()
    for rel in ('"agents/demo.toml"', '"prompts/technical_difficulty.wav"'):
        text = text.replace(rel, f'"{ROOT / "config" / rel.strip(chr(34))}"')
    text = text.replace('operator_token_env = ""', 'operator_token_env = "SB_TEST_OPERATOR"')
    path = tmp / "bridge.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    tmp = tmp_path_factory.mktemp("browser")
    sip_port = free_udp_port()
    low = free_udp_port(even=True) // 100 * 100
    env = {**os.environ, "SB_TEST_OPERATOR": TOKEN, "SIP_BRIDGE_DATA": str(tmp / "data")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sip_bridge.cli", "run", "--config", str(_config(tmp)),
         "--listen", f"127.0.0.1:{sip_port}", "--http", "127.0.0.1:0",
         "--rtp-ports", f"{low}-{low + 99}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    url, seen = None, []
    deadline = time.monotonic() + 120  # models load and warm before the bridge listens
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"operator console: (http://127\.0\.0\.1:\d+)/console", line)
        url = m.group(1) if m else None
    assert url is not None, "".join(seen)
    try:
        yield Bridge(proc, url, sip_port, tmp)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait(driver: Chrome, what: str, cond: object, timeout: float = 30.0) -> object:
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(cond)  # type: ignore[arg-type]
    except Exception as exc:
        shot = Path(os.environ.get("TMPDIR", "/tmp")) / "browser-failure.png"
        driver.save_screenshot(str(shot))
        log = [e["message"] for e in driver.get_log("browser")][-20:]  # type: ignore[no-untyped-call]
        page = driver.page_source[:1500]
        why = f"{what}: {exc!r}; log: {log}; screenshot {shot}; page: {page}"
        raise AssertionError(why) from None


def _decode_webm(data: bytes) -> NDArray[np.int16]:
    """What the page recorded (WebM/Opus) as 16 kHz mono int16."""
    out = []
    with av.open(io.BytesIO(data), mode="r") as container:
        for frame in container.decode(audio=0):
            x = frame.to_ndarray()
            mono = x.mean(axis=0) if x.ndim == 2 and x.shape[0] > 1 else x.reshape(-1)
            if mono.dtype.kind == "f":
                mono = mono * 32767
            out.append(np.clip(mono, -32768, 32767).astype(np.int16))
            rate = frame.sample_rate
    pcm = np.concatenate(out)
    return Resampler(rate, 16000).process(pcm) if rate != 16000 else pcm


def test_a_browser_asks_the_demo_agent_and_hears_the_answer(bridge: Bridge) -> None:
    question = bridge.out / "question.wav"
    _speech_wav(question, QUESTION, lead_s=4.0, tail_s=25.0)
    with chromium(question) as driver:
        driver.get(f"{bridge.url}/talk")
        _wait(driver, "the profiles", lambda d: d.find_elements(By.CSS_SELECTOR, "#profile option"))
        options = driver.find_elements(By.CSS_SELECTOR, "#profile option")
        assert options[0].get_attribute("value") == "demo"
        # the microphone is a file: no loudspeaker echo to cancel, as with a headset
        driver.find_element(By.ID, "headset").click()
        driver.find_element(By.ID, "start").click()
        _wait(driver, "connected", lambda d: d.find_element(By.ID, "status").text == "connected")
        assert start_recording(driver)
        turn = _wait(driver, "a turn answering the question", lambda d: next(
            (t for t in d.find_elements(By.CSS_SELECTOR, "#transcript .turn")
             if "monday" in t.find_element(By.CSS_SELECTOR, ".agent").text.lower()), None
        ), timeout=40)  # fmt: skip
        caller = turn.find_element(By.CSS_SELECTOR, ".caller").text.lower()  # type: ignore[attr-defined]
        latency = turn.find_element(By.CSS_SELECTOR, ".latency").text  # type: ignore[attr-defined]
        time.sleep(7.0)  # the spoken reply (~6 s) reaches the browser
        driver.save_screenshot(str(bridge.out / "talk.png"))
        heard = stop_recording(driver)
        driver.find_element(By.ID, "stop").click()
        _wait(driver, "ended", lambda d: d.find_element(By.ID, "status").text.startswith("ended"))
        # a second session from the same page: the first answer handed it the next token
        driver.find_element(By.ID, "start").click()
        _wait(
            driver, "connected again", lambda d: d.find_element(By.ID, "status").text == "connected"
        )
        driver.find_element(By.ID, "stop").click()
    assert "opening hours" in caller, caller
    assert re.fullmatch(r"\d+ ms", latency), latency
    (bridge.out / "heard.webm").write_bytes(heard)
    pcm = _decode_webm(heard)
    assert pcm.size > 5 * 16000, "the page recorded less than 5 s of the agent"
    models, _ = prepare_agents(load_config(ROOT / "config" / "bridge.toml"))
    text = models.asr.transcribe(pcm).lower()
    assert "monday" in text or "friday" in text, text


def _api(bridge: Bridge, path: str, token: str) -> int:
    req = urllib.request.Request(f"{bridge.url}{path}", method="POST",
                                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_console_shows_a_sip_call_live_hangs_it_up_and_charts_it_after(
    bridge: Bridge,
) -> None:
    question = bridge.out / "question-sip.wav"
    _speech_wav(question, QUESTION, lead_s=1.0, tail_s=2.0)
    phone = subprocess.Popen(
        [sys.executable, "-m", "sip_bridge.cli", "call", f"sip:4000@127.0.0.1:{bridge.sip_port}",
         "--play", str(question), "--record", str(bridge.out / "sip-heard.wav"),
         "--duration", "40", "--rtp-ports", f"{free_udp_port(even=True)}-65000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        with chromium() as driver:
            driver.get(f"{bridge.url}/console")
            row = _wait(driver, "the SIP call listed live", lambda d: next(
                (r for r in d.find_elements(By.CSS_SELECTOR, "#live tr[data-call-id]")
                 if r.find_element(By.CSS_SELECTOR, 'td[data-col="leg"]').text == "sip"), None
            ))  # fmt: skip
            assert isinstance(row, WebElement)
            call_id = str(row.get_attribute("data-call-id"))

            def cell(col: str) -> str:
                return str(row.find_element(By.CSS_SELECTOR, f'td[data-col="{col}"]').text)

            assert cell("callee").startswith("sip:4000@") and cell("state") == "answered"
            answered = lambda d: "monday" in cell("turns").lower()  # noqa: E731
            _wait(driver, "the call's first answer", answered, 40)
            assert re.fullmatch(r"\d+", cell("latency")), cell("latency")
            # the node's headroom ([load]): figures against budgets; shedding is off here
            load = driver.find_element(By.ID, "node-load").text
            assert re.search(r"^load: headroom -?\d+ % · turn p95 .* of 900 ms · CPU \d+ % of "
                             r"90 %( · at most \d+ calls)? · (taking new calls|over budget .*)"
                             r" · refused so far 0$",
                             load), load  # fmt: skip
            driver.save_screenshot(str(bridge.out / "console-live.png"))
            # actions: refused without the operator token; the page offers to sign in
            assert _api(bridge, f"/api/calls/{call_id}/hangup", "wrong") == 401
            assert not row.find_element(By.CSS_SELECTOR, "button.hangup").is_displayed()
            driver.find_element(By.ID, "sign-in").click()
            _wait(driver, "the login form", lambda d: d.find_elements(By.ID, "token"))
            driver.find_element(By.ID, "token").send_keys(TOKEN)
            driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
            _wait(driver, "signed in", lambda d: "SB_TEST_OPERATOR (operator)" in d.find_element(
                By.ID, "signed-in-box").text)  # fmt: skip
            assert TOKEN not in driver.current_url  # never in a URL
            again = _wait(driver, "the call listed again", lambda d: next(iter(d.find_elements(
                By.CSS_SELECTOR, f'#live tr[data-call-id="{call_id}"]')), None))  # fmt: skip
            assert isinstance(again, WebElement)
            again.find_element(By.CSS_SELECTOR, "button.hangup").click()
            assert phone.wait(timeout=15) == 0
            _wait(driver, "the call gone from the live list", lambda d: not d.find_elements(
                By.CSS_SELECTOR, f'#live tr[data-call-id="{call_id}"]'))  # fmt: skip

            def open_past(d: Chrome) -> bool:
                """Click the call's history row once it says answered (the table refreshes
                every 5 s: a row found a moment ago may be gone by the click)."""
                try:
                    for r in d.find_elements(
                        By.CSS_SELECTOR, f'#history tr[data-call-id="{call_id}"]'
                    ):
                        if "answered" in r.text:
                            r.click()
                            return True
                except StaleElementReferenceException:
                    pass
                return False

            _wait(driver, "the call answered in the history, opened", open_past)
            chart = _wait(driver, "the latency chart", lambda d: next(iter(
                d.find_elements(By.CSS_SELECTOR, "#latency-chart svg")), None))  # fmt: skip
            assert isinstance(chart, WebElement)
            bars = chart.find_elements(By.CSS_SELECTOR, "rect")
            assert len(bars) >= 2 and "turn 1" in chart.text  # stages of turn 1, and a legend
            detail = driver.find_element(By.ID, "detail").text
            assert "operator hung up" in detail and '"by":"SB_TEST_OPERATOR"' in detail
            driver.save_screenshot(str(bridge.out / "console-history.png"))
    finally:
        if phone.poll() is None:
            phone.kill()
    assert phone.stdout is not None and "call answered" in phone.stdout.read()
