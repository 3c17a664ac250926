"""A pjsua2 softphone for interop tests, run as a subprocess so its C library can't hang pytest.

It either dials ``--call URI`` or answers the first incoming call, plays ``--play`` (a WAV,
looped) into the call from the moment media is up, and records what it hears to
``--record``. Timed actions (``--at SECONDS ACTION``, counted from when the call is
confirmed) drive the rest: ``dtmf:DIGITS`` (RFC 4733), ``info:DIGITS`` (SIP INFO), ``hold``,
``unhold``, ``hangup`` (of the newest call still up). A REFER (blind transfer) is
accepted (202): pjsua dials the target as a second call, NOTIFYs its progress, and once
it is answered the phone hangs up the transferred call; the phone exits when every call
it had is over. Every event is printed as one ``PEER {json}`` line on stdout with ``t``,
seconds since the recording started, so a test can cut the recording at the moments the
call changed. The sound card is pjmedia's null device: no hardware needed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any

import pjsua2 as pj  # type: ignore[import-untyped]

DTMF_METHODS = {pj.PJSUA_DTMF_METHOD_RFC2833: "rfc4733", pj.PJSUA_DTMF_METHOD_SIP_INFO: "info"}


class Peer:
    """The endpoint, its one account and its one call, driven from ``main``'s loop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ep = pj.Endpoint()
        self.calls: list[PeerCall] = []
        self.hangups: list[PeerCall] = []  # transferred calls to hang up from the main loop
        self.player: pj.AudioMediaPlayer | None = None
        self.recorder: pj.AudioMediaRecorder | None = None
        self.rec_t0: float | None = None
        self.confirmed_at: float | None = None

    @property
    def call(self) -> PeerCall | None:
        """The newest call not yet over: the one timed actions act on."""
        live = [c for c in self.calls if not c.disconnected]
        return live[-1] if live else None

    @property
    def finished(self) -> bool:
        return bool(self.calls) and all(c.disconnected for c in self.calls)

    def emit(self, ev: str, **fields: Any) -> None:
        t = time.monotonic() - self.rec_t0 if self.rec_t0 is not None else None
        print("PEER " + json.dumps({"ev": ev, "t": t, **fields}), flush=True)

    def start(self) -> None:
        cfg = pj.EpConfig()
        cfg.uaConfig.threadCnt = 0
        cfg.uaConfig.mainThreadOnly = True
        cfg.uaConfig.maxCalls = 4
        cfg.logConfig.level = self.args.log_level
        cfg.logConfig.consoleLevel = self.args.log_level
        cfg.medConfig.clockRate = 8000
        cfg.medConfig.sndClockRate = 8000
        cfg.medConfig.noVad = True
        cfg.medConfig.ecTailLen = 0
        cfg.medConfig.sndAutoCloseTime = -1  # keep the conference clock running while on hold
        self.ep.libCreate()
        self.ep.libInit(cfg)
        self.ep.audDevManager().setNullDev()
        tcfg = pj.TransportConfig()
        tcfg.boundAddress = "127.0.0.1"
        tcfg.port = 0
        tid = self.ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, tcfg)
        self.ep.libStart()
        acfg = pj.AccountConfig()
        acfg.idUri = "sip:peer@127.0.0.1"
        acfg.mediaConfig.transportConfig.boundAddress = "127.0.0.1"
        acfg.mediaConfig.transportConfig.port = self.args.rtp_port
        acfg.mediaConfig.transportConfig.portRange = self.args.rtp_range
        self.account = PeerAccount(self)
        self.account.create(acfg)
        port = self.ep.transportGetInfo(tid).localName.rsplit(":", 1)[1]
        self.emit("listening", port=int(port))

    def media_up(self, call: PeerCall) -> None:
        """Connect file player -> call -> recorder; again after every re-INVITE."""
        info = call.getInfo()
        for i, mi in enumerate(info.media):
            if mi.type != pj.PJMEDIA_TYPE_AUDIO:
                continue
            self.emit("media", status=int(mi.status), dir=int(mi.dir))
            if mi.status not in (pj.PJSUA_CALL_MEDIA_ACTIVE, pj.PJSUA_CALL_MEDIA_REMOTE_HOLD):
                continue
            aud = call.getAudioMedia(i)
            if self.recorder is None:
                self.recorder = pj.AudioMediaRecorder()
                self.recorder.createRecorder(self.args.record)
                self.rec_t0 = time.monotonic()
                self.emit("recording")
            if self.player is None and self.args.play:
                self.player = pj.AudioMediaPlayer()
                self.player.createPlayer(self.args.play)
            if self.player is not None:
                self.player.startTransmit(aud)
            aud.startTransmit(self.recorder)

    def act(self, action: str) -> None:
        call = self.call
        if call is None:
            return
        self.emit("action", action=action)
        prm = pj.CallOpParam(True)
        if action.startswith(("dtmf:", "info:")):
            d = pj.CallSendDtmfParam()
            d.digits = action[5:]
            d.duration = 160
            info = action.startswith("info:")
            d.method = pj.PJSUA_DTMF_METHOD_SIP_INFO if info else pj.PJSUA_DTMF_METHOD_RFC2833
            call.sendDtmf(d)
        elif action == "hold":
            call.setHold(prm)
        elif action == "unhold":
            prm.opt.flag = pj.PJSUA_CALL_UNHOLD
            call.reinvite(prm)
        elif action == "hangup":
            call.hangup(prm)

    def hang_up_transferred(self) -> None:
        """Hang up the calls whose transfer target answered, outside pjsua's callbacks.

        A method, not main-loop code: a Call left in a local of ``main`` would be freed
        after ``libDestroy`` and pjsua2's destructor asserts then.
        """
        while self.hangups:
            call = self.hangups.pop(0)
            if not call.disconnected:
                self.emit("action", action="hangup-transferred", call=call.index)
                call.hangup(pj.CallOpParam(True))


class PeerCall(pj.Call):  # type: ignore[misc]
    """One call; ``index`` (0 first) tells the calls apart in the event lines."""

    def __init__(self, peer: Peer, acc: pj.Account, call_id: int = pj.PJSUA_INVALID_ID) -> None:
        super().__init__(acc, call_id)
        self.peer = peer
        self.index = len(peer.calls)
        self.disconnected = False
        self.replaces: PeerCall | None = None  # the call this one was dialled to transfer
        peer.calls.append(self)

    def onCallState(self, prm: pj.OnCallStateParam) -> None:
        info = self.getInfo()
        self.peer.emit(
            "state", state=info.stateText, code=int(info.lastStatusCode), call=self.index
        )
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED and self.peer.confirmed_at is None:
            self.peer.confirmed_at = time.monotonic()
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED and self.replaces is not None:
            self.peer.hangups.append(self.replaces)  # after pjsua's NOTIFY 200 went out
        if info.state == pj.PJSIP_INV_STATE_DISCONNECTED:
            self.disconnected = True

    def onCallTransferRequest(self, prm: pj.OnCallTransferRequestParam) -> None:
        """Accept (202) and let pjsua dial the target into a Call object we own.

        pjsua2 binds the new call to ``prm.newCall``; without one it warns and the call
        has no Python object (no callbacks). ``peer.calls`` keeps it alive. pjsua itself
        reports the new call's progress to the referrer (NOTIFY, message/sipfrag); the
        ``onCallTransferStatus`` callback is for the other role, the phone that sent a REFER.
        """
        self.peer.emit("xfer_request", dst=prm.dstUri, code=int(prm.statusCode), call=self.index)
        new = PeerCall(self.peer, self.peer.account)
        new.replaces = self
        prm.newCall = new

    def onCallMediaState(self, prm: pj.OnCallMediaStateParam) -> None:
        self.peer.media_up(self)

    def onDtmfDigit(self, prm: pj.OnDtmfDigitParam) -> None:
        method = DTMF_METHODS.get(int(prm.method), str(prm.method))
        self.peer.emit("dtmf", digit=prm.digit, method=method)


class PeerAccount(pj.Account):  # type: ignore[misc]
    def __init__(self, peer: Peer) -> None:
        super().__init__()
        self.peer = peer

    def onIncomingCall(self, prm: pj.OnIncomingCallParam) -> None:
        call = PeerCall(self.peer, self, prm.callId)
        op = pj.CallOpParam()
        if len(self.peer.calls) > 1:
            op.statusCode = 486
            call.hangup(op)
            return
        op.statusCode = 200
        call.answer(op)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--call", metavar="URI", help="dial this URI (default: wait for a call)")
    p.add_argument("--play", default="", help="WAV to play into the call (looped)")
    p.add_argument("--record", required=True, help="WAV of what the peer hears")
    p.add_argument("--at", nargs=2, action="append", default=[], metavar=("S", "ACTION"))
    p.add_argument("--rtp-port", type=int, required=True, help="even, free UDP port (and +1)")
    p.add_argument("--rtp-range", type=int, default=1, help="ports from --rtp-port to use")
    p.add_argument("--timeout", type=float, default=30.0, help="give up after this long")
    p.add_argument("--log-level", type=int, default=1)
    args = p.parse_args()
    actions = sorted((float(s), a) for s, a in args.at)
    peer = Peer(args)
    peer.start()
    if args.call:
        PeerCall(peer, peer.account).makeCall(args.call, pj.CallOpParam(True))
    deadline = time.monotonic() + args.timeout
    rc = 1
    while time.monotonic() < deadline:
        peer.ep.libHandleEvents(10)
        if peer.finished:
            rc = 0
            break
        peer.hang_up_transferred()
        if peer.confirmed_at is not None:
            while actions and time.monotonic() - peer.confirmed_at >= actions[0][0]:
                peer.act(actions.pop(0)[1])
    else:
        peer.emit("timeout")
    peer.player = peer.recorder = None  # close the WAV files before the library goes
    peer.calls.clear()
    peer.hangups.clear()
    peer.account.shutdown()
    gc.collect()  # every Call's destructor must run before libDestroy, not after it
    peer.emit("done", rc=rc)
    peer.ep.libDestroy()
    return rc


if __name__ == "__main__":
    code = main()
    # pjsua2's SWIG objects (Endpoint, Account) would otherwise be freed during interpreter
    # teardown, after the library is gone, in no fixed order: a rare segfault in CI after
    # the call had been judged. Everything worth keeping (WAVs, event lines) is closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
