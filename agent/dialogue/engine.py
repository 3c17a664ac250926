# size: the dialogue engine's one state machine: intents, slots, confirmations, transfers and
#       fallbacks answer each other
"""The dialogue engine: caller text or keys in, what to say and do out.

Rules first, from the operator's profile (:mod:`agent.dialogue.profile`): intents matched by regular
expressions, keywords compared word by word with a difflib ratio (so "ordered" still finds
"order" and "ours" finds "hours": ASR slips), and example sentences; slots filled over
several turns from spoken digits, numerals or keypad entry; reply templates; actions. Rules
answer in well under a millisecond, so they never cost the caller latency. An optional LLM
answers what no rule matched (or everything, in ``primary`` mode), spoken sentence by
sentence as it streams. Nothing here raises into the call: an LLM failure is the fallback.
"""

from __future__ import annotations

import copy
import datetime as dt
import difflib
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeAlias

from agent.dialogue.llm import LlmClient
from agent.dialogue.profile import (
    DTMF_KEYS,
    Actions,
    AgentProfile,
    Intent,
    SlotSpec,
    parse_template,
)
from agent.dialogue.sentences import SentenceBuffer
from agent.dialogue.slot_rules import KEYED, PREFILLED, from_keys, hear, needs_confirmation, problem
from agent.dialogue.slot_values import Heard
from agent.dialogue.spoken_numbers import digit_runs, yes_no
from agent.dialogue.vocabulary import listening_phrases
from agent.redaction import sensitive_text
from agent.transcript import confidence_of
from agent.words import has_phrase, normalize

__all__ = [
    "TRANSFER_FAILED",
    "DialogueEngine",
    "Hangup",
    "KeyTurn",
    "ReplyPart",
    "Say",
    "SendDtmf",
    "Transfer",
    "digit_runs",
    "yes_no",
]

log = logging.getLogger(__name__)

#: Said when a transfer fails and the profile's [fallback] transfer_failed is unset.
TRANSFER_FAILED = "Sorry, I couldn't connect you. How else can I help?"


@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class Transfer:
    target: str


@dataclass(frozen=True)
class Hangup:
    reason: str = ""


@dataclass(frozen=True)
class SendDtmf:
    digits: str


ReplyPart: TypeAlias = Say | Transfer | Hangup | SendDtmf


@dataclass(frozen=True)
class KeyTurn:
    """A turn the caller took on the keypad, and the engine's answer to it."""

    keys: str  # what the caller keyed: a slot entry's digits ("54321") or one key ("2")
    parts: list[ReplyPart]
    ended_by: str = "key"  # entries: "#", "length" (max_length reached) or "timeout"
    # the entry answered a sensitive slot: only the engine may see ``keys`` (the caller's
    # text for records is ``[redacted N digits]``, see agent.redaction)
    sensitive: bool = False


_ENDINGS = ("s", "es", "ed", "ing")


def _inflected(k: str, w: str) -> bool:
    """``w`` is ``k`` with a regular English ending: cancels, cancelled, cancelling,
    canceled, closing, shipped. Why: the ASR writes the caller's "cancel" as "cancelled"
    now and then, and as a near match (0.9) it lost to another intent's exact "order":
    "I need cancelled an order" was answered with the order's status (bench/conversations,
    en-us at -35 dBFS over 3 % loss)."""
    stems = [k, k + k[-1]]  # (a doubled last consonant: cancel-led, ship-ped)
    if k.endswith("e"):
        stems.append(k[:-1])  # (a dropped e: clos-ing, clos-ed)
    return any(w == stem + end for stem in stems for end in _ENDINGS)


@functools.lru_cache(maxsize=1 << 16)
def _word_sim(k: str, w: str, threshold: float) -> float:
    """Similarity of keyword word ``k`` and heard word ``w``; 0 below ``threshold``.
    Cached: callers repeat their words, and difflib is the engine's only real cost."""
    if k == w:
        return 1.0
    if min(len(k), len(w)) < 4:  # "no"/"now", "bye"/"by": short words must be exact
        return 0.0
    if _inflected(k, w):
        return 1.0  # the keyword itself: "cancelled" is "cancel" as surely as "order" is
    if (w.startswith(k) and len(w) - len(k) <= 3) or (k.startswith(w) and len(k) - len(w) <= 2):
        return 0.9  # "open"/"opening", "ordered"/"order"; not "some"/"someone"
    sm = difflib.SequenceMatcher(None, k, w)
    if sm.real_quick_ratio() < threshold or sm.quick_ratio() < threshold:
        return 0.0
    r = sm.ratio()
    return r if r >= threshold else 0.0


def _phrase_score(phrase: Sequence[str], words: Sequence[str], threshold: float) -> float:
    """Best window of ``words`` against the keyword phrase: its weakest word's similarity."""
    best = 0.0
    for i in range(len(words) - len(phrase) + 1):
        score = 1.0
        for k, w in zip(phrase, words[i : i + len(phrase)], strict=True):
            score = min(score, _word_sim(k, w, threshold))
            if not score:
                break
        best = max(best, score)
    return best


class DialogueEngine:
    """One call's conversation. Feed it turns (:meth:`respond`) and keys (:meth:`press`);
    speak the :class:`Say` parts, carry out the others, and report what was really heard
    with :meth:`played` (barge-in may cut a reply short)."""

    def __init__(
        self,
        profile: AgentProfile,
        *,
        llm: LlmClient | None = None,
        variables: Mapping[str, str] = MappingProxyType({}),
        clock: Callable[[], float] = time.monotonic,
        today: Callable[[], dt.date] = dt.date.today,
    ) -> None:
        self.profile = profile
        if llm is None and profile.llm is not None:
            llm = LlmClient.from_settings(profile.llm)
        self.llm = llm
        self.primary = llm is not None and profile.llm is not None and profile.llm.mode == "primary"
        self.transcript: list[tuple[str, str]] = []
        self.turns = 0
        self.misses = 0  # in a row
        self.unanswered = 0  # times in a row the caller said nothing when asked (no_input)
        self.last_missed = False  # the last turn was not understood (a fallback, a retry)
        # ...or it was: a whole value the caller gave, refused (not found, not allowed). A
        # miss all the same (it counts toward escalation), but the caller has finished
        self.last_refused = False
        # ...or a number asked for, said with too few digits: an answer the caller thinks
        # whole, though one a digit short may still be going on ("one two three four...")
        self.last_short = False
        self.last_by_rules = False  # the last turn was answered by a rule (not the LLM)
        self.ended = False  # after a hang-up or transfer
        self._vars = {"caller": "", "callee": ""} | dict(profile.variables) | dict(variables)
        self._clock = clock
        self._start = clock()
        self._intent: Intent | None = None
        self._pending: str | None = None  # the slot being asked for
        self._today = today  # what "tomorrow" and "not in the past" count from
        self._confirming: tuple[str, str] | None = None  # (slot, value) asked "is that right?"
        self._filled: dict[str, str] = {}
        self._keys = ""  # keypad digits typed into a digits slot so far
        self._key_at: float | None = None  # when the last of them was typed
        self._hash_until: float | None = None  # a '#' before this ends an entry already over
        self._llm_warned = False

    def fork(self) -> DialogueEngine:
        """A twin to answer a turn speculatively (before the end of the turn is certain):
        adopt it if the turn really ended, drop it if the caller went on. The profile and
        the LLM client are shared; the conversation state is copied."""
        twin = copy.copy(self)
        twin.transcript = list(self.transcript)
        twin._vars = dict(self._vars)
        twin._filled = dict(self._filled)
        return twin

    @property
    def collecting_sensitive(self) -> bool:
        """A ``sensitive`` slot is being asked for: what the caller says or keys now must
        leave no trace (the engine alone gets it; its own transcript, which an LLM reads,
        holds ``[redacted N digits]``)."""
        return self._pending is not None and self.profile.slots[self._pending].sensitive

    def _heard(self, text: str) -> None:
        self.transcript.append(("caller", sensitive_text(text) if self.collecting_sensitive
                                else text))  # fmt: skip

    def greeting(self) -> list[ReplyPart]:
        return [Say(self.profile.greeting.render(self._vars))]

    def played(self, said: str) -> None:
        """What the caller actually heard of a reply (all of it, or up to the barge-in)."""
        if said.strip():
            self.transcript.append(("agent", said.strip()))

    def check_limits(self) -> list[ReplyPart]:
        """Call now and then (e.g. once a second): the closing line once the call is too long."""
        return self._time_up()

    def on_transfer_result(self, succeeded: bool) -> list[ReplyPart]:
        """A failed transfer hands the caller back to the engine, with an apology."""
        if succeeded or not self.ended:
            return []
        self.ended = False
        t = self.profile.fallback.transfer_failed
        text = t.render(self._vars) if t else TRANSFER_FAILED
        return [Say(text)]

    async def respond(self, text: str) -> AsyncIterator[ReplyPart]:
        """One caller turn (the ASR text)."""
        self.last_missed = self.last_by_rules = self.last_refused = self.last_short = False
        self.unanswered = 0
        if self.ended or not text.strip():
            return
        self._heard(text.strip())
        if closing := self._time_up():
            for part in closing:
                yield part
            return
        self.turns += 1
        parts = self._by_rules(text, normalize(text))
        self.last_by_rules = parts is not None
        if parts is None:
            async for part in self._ask_llm():
                yield part
            parts = self._after_turn()
        for part in parts:
            yield part

    def unheard(self) -> list[ReplyPart]:
        """The caller spoke at length and the ASR made no words of it (too quiet, a burst
        of loss): they are asked again as for words not understood, with the slot's retry
        or the fallback, and it counts toward escalation. Nothing once the call ends."""
        self.last_missed = self.last_by_rules = self.last_refused = self.last_short = False
        self.unanswered = 0
        if self.ended:
            return []
        if closing := self._time_up():
            return closing
        self.turns += 1
        slot = self._slot_asked()
        retry = slot.retry.render(self._vars) if slot is not None else None
        return self._miss(retry) + self._after_turn()

    def listening_for(self) -> tuple[str, ...]:
        """The phrases a caller is likely to say now (:mod:`agent.dialogue.vocabulary`):
        what the recogniser leans toward."""
        slot = self.profile.slots[self._pending] if self._pending is not None else None
        return listening_phrases(self.profile, slot, confirming=self._confirming is not None)

    def _slot_asked(self) -> SlotSpec | None:
        """The slot whose question is open (not one being confirmed): what to ask again."""
        if self._pending is None or self._confirming is not None:
            return None
        return self.profile.slots[self._pending]

    def no_input(self) -> list[ReplyPart]:
        """The caller has said nothing for ``limits.no_input_s`` since the floor became
        theirs: "Are you still there?" and the question being asked (a slot's prompt), up to
        ``no_input_prompts`` times in a row; then the goodbye and a hang-up. Not a turn."""
        lim = self.profile.limits
        if self.ended:
            return []
        if closing := self._time_up():
            return closing
        self.unanswered += 1
        if self.unanswered > lim.no_input_prompts:
            self.ended = True
            return [Say(lim.no_input_goodbye.render(self._vars)), Hangup("no input")]
        text = lim.no_input_reply.render(self._vars)
        if (question := self._question_open()) is not None:
            text = f"{text} {question}"
        return [Say(text)]

    def _question_open(self) -> str | None:
        """The question the caller was asked and has not answered, to ask again: the slot's
        prompt, or "the fifteenth, is that right?" while a value is being confirmed. None
        while they are typing an entry (the keys so far stand)."""
        if self._pending is None or self._keys:
            return None
        slot = self.profile.slots[self._pending]
        if self._confirming is not None and slot.confirm_prompt is not None:
            values = self._vars | self._filled | {slot.name: self._confirming[1]}
            return slot.confirm_prompt.render(values)
        return slot.prompt.render(self._vars)

    def understands(self, text: str) -> bool:
        """Whether :meth:`respond` would make sense of ``text`` now (an intent, an answer to
        the slot or the question asked, or anything at all when an LLM answers what no rule
        does) rather than give the fallback or a retry. Changes nothing (a fork answers):
        the voice agent asks it of a few words said over its reply ("A minimum." for a
        hummed "mm-hmm")."""
        words = normalize(text)
        if self.ended or not words:
            return False
        twin = self.fork()
        twin.last_missed = False
        return twin._by_rules(text, words) is None or not twin.last_missed

    def _by_rules(self, text: str, words: Sequence[str]) -> list[ReplyPart] | None:
        """The rules' answer to a turn, ending with what follows any turn; None when no
        rule had one and the LLM answers."""
        intent: Intent | None = None
        if self._pending is not None:
            slot = self.profile.slots[self._pending]
            if self._confirming is not None:  # "the fifteenth, is that right?"
                return self._confirmed(slot, words, text) + self._after_turn()
            heard = hear(slot, words, text, self._today())
            intent = self._match(words)
            # digits said for a number asked for are an answer, even one too short: "My
            # order number is one to four five" (a digit lost) gets the retry, not the
            # order-status intent its "order" matches (the cancel asked: it began again)
            tried = slot.kind in ("digits", "number") and bool(digit_runs(words))
            if heard is not None or intent is None or intent is self._intent or tried:
                if heard is not None:
                    return self._offer(slot, heard, confidence_of(text)) + self._after_turn()
                self.last_short = tried
                return self._miss(slot.retry.render(self._vars)) + self._after_turn()
        else:
            intent = self._match(words) or self._no_to_the_question(words)
        if intent is not None:
            return self._begin(intent, words, confidence_of(text)) + self._after_turn()
        if self.llm is not None:
            return None
        return self._miss(None) + self._after_turn()

    def press(self, digit: str, now: float | None = None) -> KeyTurn | None:
        """One key. A :class:`KeyTurn` when it makes a turn: a menu key, a yes/no key, or the
        key that ends a digits slot's entry ('#', or the ``max_length``-th digit). None when
        it does not: a digit typed into an unfinished entry, '*' (clears the entry), and
        keys the engine ignores: '#' right after an entry that ended at its length (the
        caller's terminator, typed as the prompt said), '#' and unbound '*' or A-D at the
        menu, anything once the call is ending. The agent must not stop talking for those.
        """
        now = self._clock() if now is None else now
        if self.ended or len(digit) != 1 or digit not in DTMF_KEYS:
            return None
        self.unanswered = 0
        grace, self._hash_until = self._hash_until, None
        if digit == "#" and grace is not None and now <= grace:
            return None  # the terminator of an entry already complete
        if closing := self._time_up():  # a key into a sensitive slot's entry stays masked
            return KeyTurn(digit, closing, sensitive=self.collecting_sensitive)
        slot = self.profile.slots[self._pending] if self._pending else None
        if slot is not None and self._confirming is not None:  # 1 = yes, 2 = no
            said = {"1": ("yes",), "2": ("no",)}.get(digit)
            if said is None:
                return None
            self._heard(f"(keypad {digit})")
            self.turns += 1
            parts = self._confirmed(slot, said, "") + self._after_turn()
            return KeyTurn(digit, parts, sensitive=slot.sensitive)
        if slot is not None and slot.kind in KEYED:
            if digit == "*":
                self._keys, self._key_at = "", None
                return None
            if digit != "#":
                self._keys += digit
                self._key_at = now
                if len(self._keys) < slot.max_length:
                    return None
                self._hash_until = now + slot.digit_timeout_s
                return self._entry(slot, "length")
            return self._entry(slot, "#") if self._keys else None
        if slot is not None:  # yes_no: 1 = yes, 2 = no; a choice or text is said
            self.transcript.append(("caller", f"(keypad {digit})"))
            answer = {"1": "yes", "2": "no"}.get(digit) if slot.kind == "yes_no" else None
            parts = self._fill(answer) if answer else self._miss(slot.retry.render(self._vars))
        else:
            intent = next((i for i in self.profile.intents if i.dtmf == digit), None)
            if intent is None and digit in "#*ABCD":
                return None  # not a menu choice: nothing a caller meant to answer
            self.transcript.append(("caller", f"(keypad {digit})"))
            parts = self._begin(intent, ()) if intent else self._miss(None)
        self.turns += 1
        return KeyTurn(digit, parts + self._after_turn())

    def keypad_deadline(self) -> float | None:
        """When the unfinished keypad entry times out (``digit_timeout_s`` after its last
        key), on the engine's clock; None when no entry is open."""
        slot = self.profile.slots[self._pending] if self._pending else None
        if slot is None or slot.kind not in KEYED or not self._keys or self._key_at is None:
            return None
        return self._key_at + slot.digit_timeout_s

    def keypad_timeout(self, now: float | None = None) -> KeyTurn | None:
        """Call now and then (every tick): the entry's turn once its deadline has passed
        (a shorter entry than ``min_length`` gets the slot's retry)."""
        deadline = self.keypad_deadline()
        now = self._clock() if now is None else now
        if deadline is None or now < deadline or self.ended:
            return None
        assert self._pending is not None
        return self._entry(self.profile.slots[self._pending], "timeout")

    def _entry(self, slot: SlotSpec, ended_by: str) -> KeyTurn:
        """A digits slot's keypad entry is over: fill the slot, or say its retry."""
        value, self._keys, self._key_at = self._keys, "", None
        self._heard(f"(keypad {value})")
        heard = from_keys(slot, value, self._today())  # DDMM, HHMM, a number, digits
        parts = self._offer(slot, heard) if heard else self._miss(slot.retry.render(self._vars))
        self.turns += 1
        return KeyTurn(value, parts + self._after_turn(), ended_by, sensitive=slot.sensitive)

    # -- rules -------------------------------------------------------------------------

    def _match(self, words: Sequence[str]) -> Intent | None:
        """The best-scoring intent, ties to the one first in the file; None below thresholds."""
        m = self.profile.matching
        joined = " ".join(words)
        best, best_score = None, 0.0
        for intent in self.profile.intents:
            if self.primary and not intent.override_llm:
                continue
            score = 1.0 if any(p.search(joined) for p in intent.patterns) else 0.0
            thr = m.fuzzy_threshold
            hits = [s for s in (_phrase_score(k, words, thr) for k in intent.keywords) if s]
            if hits:  # several keywords heard: a little more sure
                score = max(score, max(hits) + 0.01 * (len(hits) - 1))
            for ex in intent.examples:
                r = difflib.SequenceMatcher(None, ex, words).ratio()
                if r >= m.example_threshold:
                    score = max(score, r)
            if score > best_score:
                best, best_score = intent, score
        return best

    def _no_to_the_question(self, words: Sequence[str]) -> Intent | None:
        """A plain no to the question the caller was just asked ("... Anything else?" "No,
        I'm good."): the first intent whose ``no_to`` names that question. Only right after
        it: a no at any other point means nothing by itself."""
        if len(self.transcript) < 2 or yes_no(words) != "no":
            return None
        who, asked = self.transcript[-2]  # [-1] is this turn
        if who != "agent":
            return None
        asked_words = normalize(asked)
        for intent in self.profile.intents:
            if self.primary and not intent.override_llm:
                continue
            if any(has_phrase(asked_words, q) for q in intent.no_to):
                return intent
        return None

    def _begin(
        self, intent: Intent, words: Sequence[str], confidence: float = 1.0
    ) -> list[ReplyPart]:
        """Start an intent; digits already said ("where is order 12345") fill its slots
        (when heard surely enough to need no confirmation: otherwise they are asked for)."""
        self._intent, self._filled, self._pending = intent, {}, None
        self._keys, self._key_at, self._confirming = "", None, None
        today = self._today()
        for name in intent.slots:  # "book a cleaning for tomorrow": sure, allowed values only
            slot = self.profile.slots[name]
            heard = hear(slot, words, "", today) if slot.kind in PREFILLED else None
            if (
                heard is not None
                and not needs_confirmation(slot, heard, confidence)
                and self._problem(slot, heard.value, today) is None
            ):
                self._filled[name] = heard.value
        return self._proceed()

    def _offer(self, slot: SlotSpec, heard: Heard, confidence: float = 1.0) -> list[ReplyPart]:
        """A value the caller gave: refused with the reason (and the question again), asked
        back ("the fifteenth, is that right?") when unsure (the words, or the ASR under the
        slot's ``confirm_below``), else the slot is filled."""
        today = self._today()
        values = self._vars | self._filled | {slot.name: heard.value}
        why = self._problem(slot, heard.value, today)
        if why is not None:
            said = slot.invalid.render(values) if slot.invalid is not None else why
            self.last_refused = True
            return self._miss(f"{said} {slot.retry.render(values)}")
        if needs_confirmation(slot, heard, confidence) and slot.confirm_prompt is not None:
            self._confirming = (slot.name, heard.value)
            return [Say(slot.confirm_prompt.render(values))]
        return self._fill(heard.value)

    def _problem(self, slot: SlotSpec, value: str, today: dt.date) -> str | None:
        """Why ``value`` is not allowed; a time is checked against the hours of the day
        already chosen in this intent, when there is one."""
        day = next(
            (
                dt.date.fromisoformat(v)
                for k, v in self._filled.items()
                if k in self.profile.slots and self.profile.slots[k].kind == "date"
            ),
            None,
        )
        return problem(slot, value, today, self.profile.hours, day)

    def _confirmed(self, slot: SlotSpec, words: Sequence[str], text: str) -> list[ReplyPart]:
        """The answer to "is that right?": yes fills the slot; "no, the sixteenth" offers
        the new value; a plain no asks the question again; anything else repeats it."""
        assert self._confirming is not None
        _, value = self._confirming
        self._confirming = None
        answer = yes_no(words)
        if answer == "yes":
            return self._fill(value)
        heard = (
            hear(slot, words, text, self._today()) if slot.kind not in ("text", "yes_no") else None
        )
        if heard is not None and heard.value != value:
            return self._offer(slot, heard, confidence_of(text))
        values = self._vars | self._filled
        if answer == "no":
            return [Say(slot.prompt.render(values))]
        self._confirming = (slot.name, value)
        assert slot.confirm_prompt is not None
        return self._miss(slot.confirm_prompt.render(values | {slot.name: value}))

    def _fill(self, value: str) -> list[ReplyPart]:
        assert self._pending is not None
        self._keys, self._key_at = "", None  # (a spoken answer ends a half-typed entry)
        self._filled[self._pending] = value
        self._pending, self._confirming = None, None
        self.misses = 0  # an answer ends a run of misses
        return self._proceed()

    def _proceed(self) -> list[ReplyPart]:
        """Ask for the next missing slot, or answer with everything filled."""
        intent = self._intent
        assert intent is not None
        values = self._vars | self._filled
        for name in intent.slots:
            if name not in self._filled:
                self._pending = name
                return [Say(self.profile.slots[name].prompt.render(values))]
        lk = intent.lookup
        if lk is not None:
            row = self.profile.data[lk.table].get(self._filled[lk.key])
            if row is None:  # ask again: the caller may have misspoken
                text = lk.not_found.render(values)
                del self._filled[lk.key]
                self._pending = lk.key
                self.last_refused = True
                return self._miss(text)
            values |= {f"{lk.alias}.{k}": v for k, v in row.items()}
        no = any(
            self._filled.get(s) == "no" and self.profile.slots[s].kind == "yes_no"
            for s in intent.slots
        )
        self._intent, self.misses = None, 0
        return self._act(intent.on_no if no and intent.on_no else intent.then, values)

    def _act(self, acts: Actions, values: dict[str, str]) -> list[ReplyPart]:
        for var, template in acts.set:
            self._vars[var] = values[var] = template.render(values)
        parts: list[ReplyPart] = []
        if text := acts.reply.render(values):
            parts.append(Say(text))
        if acts.send_dtmf:
            parts.append(SendDtmf(acts.send_dtmf))
        if acts.transfer:  # a template of slots and variables; the bridge checks the result
            parts.append(Transfer(parse_template(acts.transfer).render(values)))
        elif acts.hangup:
            parts.append(Hangup("intent"))
        self.ended = bool(acts.transfer or acts.hangup)
        return parts

    def _miss(self, text: str | None) -> list[ReplyPart]:
        """Not understood: the fallback (or ``text``); after N in a row, escalate."""
        fb = self.profile.fallback
        self.misses += 1
        self.last_missed = True
        if fb.escalate_after and self.misses >= fb.escalate_after:
            self._intent, self._pending, self.misses, self.ended = None, None, 0, True
            parts: list[ReplyPart] = []
            if fb.escalate_reply is not None:
                parts.append(Say(fb.escalate_reply.render(self._vars)))
            target = fb.escalate_transfer
            target = parse_template(target).render(self._vars) if target else ""
            parts.append(Transfer(target) if target else Hangup("too many misses"))
            return parts
        if text is None:
            text = fb.replies[min(self.misses, len(fb.replies)) - 1].render(self._vars)
        return [Say(text)]

    def _after_turn(self) -> list[ReplyPart]:
        lim = self.profile.limits
        if self.ended or not lim.max_turns or self.turns < lim.max_turns:
            return []
        self.ended = True
        return [Say(lim.closing.render(self._vars)), Hangup("max turns")]

    def _time_up(self) -> list[ReplyPart]:
        lim = self.profile.limits
        if self.ended or not lim.max_call_s or self._clock() - self._start < lim.max_call_s:
            return []
        self.ended = True
        return [Say(lim.closing.render(self._vars)), Hangup("max call length")]

    # -- LLM ---------------------------------------------------------------------------

    def _messages(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        assert self.profile.llm is not None or self.llm is not None
        system = self.profile.llm.system_prompt.render(self._vars) if self.profile.llm else ""
        if system:
            out.append({"role": "system", "content": system})
        for who, text in self.transcript[-20:]:
            role = "user" if who == "caller" else "assistant"
            if out and out[-1]["role"] == role:
                out[-1]["content"] += " " + text
            else:
                out.append({"role": role, "content": text})
        return out

    async def _ask_llm(self) -> AsyncIterator[ReplyPart]:
        """Stream the model's answer as sentences; on any failure the fallback, logged."""
        assert self.llm is not None
        buf = SentenceBuffer()
        said = False
        try:
            async with aclosing(self.llm.stream_chat(self._messages())) as stream:
                async for delta in stream:
                    for sentence in filter(None, map(_clean, buf.push(delta))):
                        said = True
                        yield Say(sentence)
            for sentence in filter(None, map(_clean, buf.flush())):
                said = True
                yield Say(sentence)
        except Exception as exc:  # an LLM problem must never end the call
            level = logging.DEBUG if self._llm_warned else logging.WARNING
            log.log(level, "LLM failed, using the fallback reply: %s", exc)
            self._llm_warned = True
        if said:
            self.misses = 0
        else:
            for part in self._miss(None):
                yield part


def _clean(s: str) -> str:
    """No markdown on the phone."""
    return " ".join(re.sub(r"[*_#`]+", "", s).split())
