"""Headless Chromium (Debian `chromium` + `chromium-driver`) driven by Selenium, kept off
the network: no background services, every host name but 127.0.0.1 unresolvable, no
Selenium Manager download, WebRTC allowed on loopback and never hiding addresses behind
mDNS names (the bridge keeps loopback candidates only). The microphone is a WAV file."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

_OFF_THE_NETWORK = [
    "--headless=new",
    "--no-sandbox",  # root in CI
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--disable-features=WebRtcHideLocalIpsWithMdns,MediaRouter,OptimizationHints,Translate",
    "--allow-loopback-in-peer-connection",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--window-size=1280,900",
]


@contextmanager
def chromium(microphone: Path | None = None) -> Iterator[webdriver.Chrome]:
    """A headless browser whose microphone plays ``microphone`` (a 16-bit WAV, looped)."""
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a driver
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in _OFF_THE_NETWORK:
        opts.add_argument(arg)
    if microphone is not None:
        opts.add_argument(f"--use-file-for-fake-audio-capture={microphone}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


_RECORD = """
const stream = window.talk && window.talk.remoteStream;
if (!stream) { return false; }
const rec = new MediaRecorder(stream, {mimeType: "audio/webm;codecs=opus"});
window.__heard = [];
rec.ondataavailable = (e) => { if (e.data.size) window.__heard.push(e.data); };
rec.start(250);
window.__recorder = rec;
return true;
"""

_STOP = """
const done = arguments[arguments.length - 1];
const rec = window.__recorder;
rec.onstop = async () => {
  const buf = new Uint8Array(await new Blob(window.__heard).arrayBuffer());
  let s = "";
  for (let i = 0; i < buf.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, buf.subarray(i, i + 0x8000));
  }
  done(btoa(s));
};
rec.stop();
"""


def start_recording(driver: webdriver.Chrome) -> bool:
    """Record, inside the page, the agent's audio as it arrived (WebM/Opus)."""
    return bool(driver.execute_script(_RECORD))


def stop_recording(driver: webdriver.Chrome) -> bytes:
    return base64.b64decode(driver.execute_async_script(_STOP))
