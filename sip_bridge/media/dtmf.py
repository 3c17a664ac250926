"""DTMF key presses over RFC 4733 telephone-events, sans-I/O.

:class:`DtmfReceiver` turns telephone-event packets into one :class:`DtmfDigit` per
key press (keyed on the End bit, never the marker); :class:`DtmfSender` produces the
packets for one key press on an :class:`~sip_bridge.media.rtp.RtpSender`'s sequence and
timestamp space; :class:`DtmfOutbox` queues digits and hands those packets out one per
frame slot of a paced stream, so events replace audio frames on the same SSRC.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from sip_bridge.media.rtp import (
    DTMF_EVENTS,
    RtpError,
    RtpPacket,
    RtpSender,
    TelephoneEvent,
    check_range,
    dtmf_to_event,
    event_to_dtmf,
)

__all__ = ["END_LOST_S", "DtmfDigit", "DtmfOutbox", "DtmfReceiver", "DtmfSender"]

_TS_MOD = 1 << 32


@dataclass(frozen=True, slots=True)
class DtmfDigit:
    """One detected key press.

    ``timestamp`` is the event's RTP timestamp (its start).  ``end_seen`` is False when
    the End packets were all lost and the digit was inferred from the next event (or
    from :meth:`DtmfReceiver.flush`); ``duration_ms`` is then the last duration seen.
    """

    digit: str
    duration_ms: float
    timestamp: int
    end_seen: bool = True


#: seconds without a packet of an event in progress after which its End packets are taken
#: for lost: senders update an event every 50 ms or so (RFC 4733 section 2.5.1.2), so this
#: is several updates lost in a row, or the key released
END_LOST_S = 0.5


class DtmfReceiver:
    """Telephone-event packets in, one :class:`DtmfDigit` per key press out.

    Design choices:

    * A digit is reported when a packet with the **End bit** arrives.  The marker bit is
      ignored: many gateways never set it, and when the first packets are lost it is
      gone anyway.
    * All packets of one event share the RTP timestamp.  Once an event is reported,
      further packets with that timestamp (the usual 3 End retransmissions, late
      updates) are dropped, as is anything older than the newest event seen (serial
      number arithmetic, so it survives the 32-bit wrap).
    * If all End packets are lost, the event is reported (``end_seen=False``, last
      duration seen) as soon as a packet with a newer timestamp arrives, i.e. when the
      next key press starts, or once :meth:`expire` finds no packet of it for
      :data:`END_LOST_S` (the media path asks each tick: a key pressed alone, its End
      packets lost in a burst, would otherwise wait for the next key or the call's end
      while the caller waits for an answer).  Call :meth:`flush` at the end of the call.
    * An RFC 4733 long-duration event (duration reached 0xFFFF and a new segment starts
      exactly 0xFFFF later with the same event code) continues the same digit.
    * A change of SSRC flushes the pending event and restarts the state.
    * Packets of other payload types, malformed event payloads and non-DTMF event codes
      (16 and up) are ignored.
    """

    def __init__(self, payload_type: int = 101, clock_rate: int = 8000) -> None:
        check_range("payload type", payload_type, 7)
        if clock_rate <= 0:
            raise ValueError("clock_rate must be positive")
        self.payload_type = payload_type
        self.clock_rate = clock_rate
        self._ssrc: int | None = None
        self._newest_ts: int | None = None  # newest event (segment) timestamp seen
        self._reported: deque[int] = deque(maxlen=16)  # segment timestamps already reported
        # The event in progress (not yet reported):
        self._cur_ts: int | None = None  # timestamp of its current segment
        self._cur_start_ts = 0  # timestamp of its first segment (reported)
        self._cur_event = 0
        self._cur_duration = 0  # duration of the current segment
        self._cur_base = 0  # total duration of the previous segments
        self._cur_heard: float | None = None  # when its newest packet arrived (None: untimed)
        self.ignored = 0  # packets ignored (wrong PT, malformed, duplicate, stale)

    def feed(self, packet: RtpPacket, now: float | None = None) -> list[DtmfDigit]:
        """Feed one RTP packet that arrived at ``now`` (seconds, any clock :meth:`expire`
        is given; None: never expired); returns the digits it completes (0, 1 or 2)."""
        if packet.payload_type != self.payload_type:
            self.ignored += 1
            return []
        try:
            ev = TelephoneEvent.parse(packet.payload)
        except RtpError:
            self.ignored += 1
            return []
        out: list[DtmfDigit] = []
        if self._ssrc is not None and packet.ssrc != self._ssrc:
            out.extend(self.flush())
            self._newest_ts = None
            self._reported.clear()
        self._ssrc = packet.ssrc
        ts = packet.timestamp
        if ts in self._reported or (
            self._newest_ts is not None and (ts - self._newest_ts) % _TS_MOD >= _TS_MOD // 2
        ):
            self.ignored += 1
            return out
        if event_to_dtmf(ev.event) is None:
            self.ignored += 1
            return out
        if self._cur_ts is not None and ts != self._cur_ts:
            continuation = (
                ev.event == self._cur_event
                and self._cur_duration == 0xFFFF
                and ts == (self._cur_ts + 0xFFFF) % _TS_MOD
            )
            if continuation:
                self._reported.append(self._cur_ts)
                self._cur_base += self._cur_duration
                self._cur_duration = 0
            else:
                out.extend(self.flush())
        if self._cur_ts is None:
            self._cur_start_ts = ts
            self._cur_event = ev.event
            self._cur_duration = 0
            self._cur_base = 0
        self._cur_ts = ts
        self._newest_ts = ts
        self._cur_heard = now
        self._cur_duration = max(self._cur_duration, ev.duration)
        if ev.end:
            out.append(self._finish(end_seen=True))
        return out

    def feed_all(self, packets: Iterable[RtpPacket]) -> list[DtmfDigit]:
        """Feed packets in order; returns all digits they complete."""
        out: list[DtmfDigit] = []
        for p in packets:
            out.extend(self.feed(p))
        return out

    def expire(self, now: float) -> list[DtmfDigit]:
        """The event in progress, reported if no packet of it came for :data:`END_LOST_S`
        up to ``now`` (its End packets were lost)."""
        heard = self._cur_heard
        if self._cur_ts is None or heard is None or now - heard < END_LOST_S:
            return []
        return self.flush()

    def flush(self) -> list[DtmfDigit]:
        """Report the event in progress, if any (its End packets never arrived)."""
        if self._cur_ts is None:
            return []
        return [self._finish(end_seen=False)]

    def _finish(self, *, end_seen: bool) -> DtmfDigit:
        assert self._cur_ts is not None
        digit = DtmfDigit(
            digit=DTMF_EVENTS[self._cur_event],
            duration_ms=(self._cur_base + self._cur_duration) * 1000.0 / self.clock_rate,
            timestamp=self._cur_start_ts,
            end_seen=end_seen,
        )
        self._reported.append(self._cur_ts)
        self._cur_ts = None
        return digit


class DtmfSender:
    """RFC 4733 packets for one key press, on the sequence space of an :class:`RtpSender`.

    :meth:`packets` returns ``(send_offset_s, datagram)`` pairs: a start packet with the
    marker bit, updates every ``ptime_ms`` with growing duration, then ``end_packets``
    (default 3) copies of the End packet with the final duration, also ``ptime_ms``
    apart.  All share the timestamp the stream had when the key press began; each has
    its own sequence number.  After the last one the stream timestamp has advanced by
    the event duration, so audio resumes seamlessly.  The packets are built (sequence
    numbers taken) when :meth:`packets` is called: send them in order and do not send
    audio on the stream until the last one is out.
    """

    def __init__(
        self,
        rtp: RtpSender,
        payload_type: int = 101,
        *,
        clock_rate: int = 8000,
        ptime_ms: int = 20,
        volume: int = 10,
        end_packets: int = 3,
    ) -> None:
        check_range("payload type", payload_type, 7)
        check_range("volume", volume, 6)
        if clock_rate <= 0 or ptime_ms <= 0 or end_packets < 1:
            raise ValueError("clock_rate, ptime_ms and end_packets must be positive")
        self.rtp = rtp
        self.payload_type = payload_type
        self.clock_rate = clock_rate
        self.ptime_ms = ptime_ms
        self.volume = volume
        self.end_packets = end_packets

    def packets(self, digit: str, duration_ms: int = 100) -> list[tuple[float, bytes]]:
        event = dtmf_to_event(digit)
        total = duration_ms * self.clock_rate // 1000
        step = self.ptime_ms * self.clock_rate // 1000
        if total <= 0 or step <= 0:
            raise ValueError("duration and ptime must be at least one clock tick")
        if total > 0xFFFF:
            raise ValueError(f"duration {duration_ms} ms exceeds the 16-bit duration field")
        # start + updates: step, 2*step, ... below total (just [total] if it is short)
        durations = list(range(step, total, step)) or [total]
        plan: list[tuple[int, bool]] = [(d, False) for d in durations]
        plan += [(total, True)] * self.end_packets
        out: list[tuple[float, bytes]] = []
        for i, (duration, end) in enumerate(plan):
            last = i == len(plan) - 1
            payload = TelephoneEvent(event, end, self.volume, duration).serialize()
            datagram = self.rtp.next_packet(
                payload,
                samples=total if last else 0,
                marker=i == 0,
                payload_type=self.payload_type,
            )
            out.append((i * self.ptime_ms / 1000.0, datagram))
        return out


class DtmfOutbox:
    """Digits waiting to go out as RFC 4733 events on a paced RTP stream, sans-I/O.

    The stream's pacer calls :meth:`next_packet` once per frame slot: it returns the event
    datagram for that slot, or None when the slot carries audio (idle, or the gap between
    two digits). An event takes one slot per packet (updates, then 3 End packets), all on
    the :class:`RtpSender`'s SSRC and sequence space with the event's start timestamp. After
    the last End packet the stream timestamp is moved to the slot clock (the End
    retransmissions outlast the event) and the next audio packet carries the marker bit.
    """

    def __init__(
        self,
        sender: DtmfSender,
        frame_samples: int,
        *,
        duration_ms: int = 100,
        gap_ms: int = 60,
    ) -> None:
        if frame_samples <= 0 or duration_ms <= 0 or gap_ms < 0:
            raise ValueError("frame_samples and duration_ms must be positive, gap_ms >= 0")
        self.sender = sender
        self.frame_samples = frame_samples
        self.duration_ms = duration_ms
        self.gap_frames = -(-gap_ms * sender.clock_rate // 1000 // frame_samples)
        self._digits: deque[str] = deque()
        self._packets: deque[bytes] = deque()
        self._start_ts = 0
        self._slots = 0
        self._gap_left = 0
        self.sent_digits = 0

    @classmethod
    def on(cls, rtp: RtpSender, payload_type: int, clock_rate: int, ptime_ms: int) -> DtmfOutbox:
        """An outbox for an audio stream of ``ptime_ms`` frames at ``clock_rate``."""
        sender = DtmfSender(rtp, payload_type, clock_rate=clock_rate, ptime_ms=ptime_ms)
        return cls(sender, clock_rate * ptime_ms // 1000)

    @staticmethod
    def check(digits: str) -> None:
        """ValueError unless every character is a DTMF key (``0-9 * # A-D``)."""
        for d in digits:
            dtmf_to_event(d)

    def add(self, digits: str) -> None:
        """Queue key presses; ValueError on a non-DTMF character, queuing nothing."""
        self.check(digits)
        self._digits.extend(d.upper() for d in digits)

    @property
    def busy(self) -> bool:
        """True while an event plays, digits wait, or an inter-digit gap runs."""
        return bool(self._packets or self._digits or self._gap_left)

    @property
    def playing(self) -> bool:
        """True while an event's packets own the stream (audio must wait)."""
        return bool(self._packets)

    def clear(self) -> None:
        """Forget queued digits (an event already started is finished: it must end)."""
        self._digits.clear()

    def next_packet(self) -> bytes | None:
        """The datagram for this frame slot, or None when the slot carries audio."""
        if not self._packets:
            if self._gap_left:
                self._gap_left -= 1
                return None
            if not self._digits:
                return None
            rtp = self.sender.rtp
            self._start_ts = rtp.timestamp
            digit = self._digits.popleft()
            plan = self.sender.packets(digit, self.duration_ms)
            self._packets.extend(d for _, d in plan)
            self._slots = len(plan)
        data = self._packets.popleft()
        if not self._packets:
            rtp = self.sender.rtp
            used = (rtp.timestamp - self._start_ts) % _TS_MOD
            rtp.skip(max(0, self._slots * self.frame_samples - used))  # and a marker next
            self._gap_left = self.gap_frames
            self.sent_digits += 1
        return data
