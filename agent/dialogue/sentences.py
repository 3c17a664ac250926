"""Split reply text into sentences for TTS, in one go or as an LLM streams it.

Why: Piper synthesises a whole utterance at once, so the caller hears nothing until the
first utterance is done. Speaking sentence by sentence starts the audio after the first
sentence only; a long first sentence is cut at its first comma for the same reason.

Rules (pure, no I/O): a sentence ends at ``.``, ``!``, ``?`` or ``…`` (with any closing
quotes or brackets) followed by white space, or at a line break. A ``.`` does not end a
sentence after a title (``Dr.``, ``Mr.``, ``e.g.``), inside a number or time (``9.30``,
``5:00``: no space follows), or after a list number at the start of a line (``1. Open``);
after ``etc.``, ``a.m.``, ``Inc.`` or an acronym (``U.S.``) it ends one only if the next word
starts with a capital. A sentence of more than ``max_words`` words is cut at its last comma
(``,;:`` or a dash) within that many words, else after exactly ``max_words`` words. A
reply's first sentence of more than ``first_max_words`` words is cut at its first comma,
else before the next word that opens a phrase ("and", "on", "which"...).

:class:`SentenceBuffer` applies the same rules to streamed text: feeding a text in any
pieces gives exactly the sentences :func:`split_sentences` gives for the whole text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_FIRST_MAX_WORDS", "DEFAULT_MAX_WORDS", "SentenceBuffer", "split_sentences"]

#: Longest piece (in words) before a sentence is cut; ~25 words is ~8 s of speech.
DEFAULT_MAX_WORDS = 25
#: A first sentence longer than this is cut at its first comma, for an early first audio.
DEFAULT_FIRST_MAX_WORDS = 10

# A "." after these never ends a sentence (lower case, without the final dot).
_TITLES = frozenset(
    {
        *("mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs"),
        *("approx", "dept", "tel", "fig", "no", "nr", "e.g", "i.e", "cf", "ca"),
    }
)
# A "." after these ends a sentence only when a capitalised word follows.
_MAYBE_END = frozenset({"etc", "a.m", "p.m", "am", "pm", "inc", "ltd", "co", "corp", "al"})
_CLOSERS = "\"')]}»”’"
_END_RE = re.compile(r"(?:[.!?…]+)[" + re.escape(_CLOSERS) + r"]*$")
_SOFT_RE = re.compile(r"(?:[,;:]|[—–-]{1,2})[" + re.escape(_CLOSERS) + r"]*$")
_TOKEN_RE = re.compile(r"\S+")
_NUMBER_RE = re.compile(r"^[(\[]?\d+[.)]?$")


@dataclass(frozen=True, slots=True)
class _Token:
    text: str
    start: int
    end: int
    newline_after: bool  # a line break separates it from the next token (or the end)
    complete: bool  # white space follows it (or the text is final)


def _tokens(text: str, final: bool) -> list[_Token]:
    out: list[_Token] = []
    matches = list(_TOKEN_RE.finditer(text))
    for i, m in enumerate(matches):
        gap_end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        gap = text[m.end() : gap_end]
        out.append(_Token(m.group(), m.start(), m.end(), "\n" in gap, final or gap != ""))
    return out


def _ends_sentence(tok: _Token, nxt: _Token | None, position: int, final: bool) -> bool | None:
    """Whether the sentence ends after ``tok`` (its ``position``-th word, from 0); None when
    only text still to come can tell."""
    if not tok.complete:
        return None
    if tok.newline_after or (nxt is None and final):
        return True
    end = _ends_at_punctuation(tok, nxt, position)
    if end is False and nxt is None and not final:
        return None  # a line break may still follow
    return end


def _ends_at_punctuation(tok: _Token, nxt: _Token | None, position: int) -> bool | None:
    word = tok.text
    if not _END_RE.search(word):
        return False
    stripped = word.rstrip(_CLOSERS)
    if not stripped.endswith(".") or stripped.endswith(".."):
        return True  # "?", "!", "…" or "...": no abbreviation ends like that
    stem = stripped[:-1].lstrip("\"'([{«“‘").lower()
    if stem in _TITLES:
        return False
    if position == 0 and _NUMBER_RE.match(stripped):
        return False  # "1. Open the app": a list number, not a sentence
    if stem in _MAYBE_END or "." in stem:
        if nxt is None:
            return None  # the next word decides
        first = nxt.text.lstrip("\"'([{«“‘")[:1]
        return first.isupper() or first.isdigit()
    return True


def _cut(words: list[_Token], limit: int, earliest: bool) -> int | None:
    """How many of ``words`` (more than ``limit``) go into the piece cut off: after a comma
    within ``limit`` words (the first one if ``earliest``, else the last); None if none."""
    cuts = [i + 1 for i in range(min(limit, len(words) - 1)) if _SOFT_RE.search(words[i].text)]
    if not cuts:
        return None
    return cuts[0] if earliest else cuts[-1]


# Words that open a phrase: a long first sentence without a comma is cut before one.
_PHRASE_START = frozenset(
    {
        *("and", "but", "or", "so", "because", "which", "that", "who", "where", "when"),
        *("while", "if", "until", "after", "before", "on", "in", "at", "by", "from"),
        *("with", "for", "to"),
    }
)


def _phrase_starts(cur: list[_Token], limit: int) -> bool:
    """The newest word opens a phrase, the first piece is already over ``limit`` words (and
    not yet twice as long), and at least three words go before the cut."""
    last = cur[-1]
    return limit < len(cur) <= 2 * limit and last.complete and last.text.lower() in _PHRASE_START


def _scan(
    text: str, final: bool, first: bool, max_words: int, first_max_words: int
) -> tuple[list[str], int, bool]:
    """Complete pieces of ``text``; the offset where the undecided rest starts; whether the
    next piece is still the reply's first."""
    pieces: list[str] = []
    toks = _tokens(text, final)
    cur: list[_Token] = []
    rest = len(text)
    for i, tok in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        cur.append(tok)
        # Too long already? (decided before the end, so a piece never exceeds the limit)
        n = None
        if first and len(cur) == first_max_words + 1:
            n = _cut(cur, first_max_words, earliest=True)
        if n is None and first and _phrase_starts(cur, first_max_words):
            n = len(cur) - 1  # no comma: cut before "and", "on", "which"...
        if n is None and len(cur) == max_words + 1:
            n = _cut(cur, max_words, earliest=False) or max_words
        if n is not None:
            pieces.append(" ".join(t.text for t in cur[:n]))
            cur, first = cur[n:], False
        end = _ends_sentence(tok, nxt, len(cur) - 1, final)
        if end is None:
            break
        if end:
            pieces.append(" ".join(t.text for t in cur))
            cur, first = [], False
    if cur:
        # only when not final: the open sentence waits for more text
        rest = cur[0].start
    return pieces, rest, first


def _check(max_words: int, first_max_words: int) -> None:
    if max_words < 2 or first_max_words < 1:
        raise ValueError("max_words must be >= 2 and first_max_words >= 1")


def split_sentences(
    text: str,
    *,
    max_words: int = DEFAULT_MAX_WORDS,
    first_max_words: int = DEFAULT_FIRST_MAX_WORDS,
) -> list[str]:
    """The sentences (pieces to speak one by one) of ``text``, white space normalised."""
    _check(max_words, first_max_words)
    pieces, _, _ = _scan(text, True, True, max_words, first_max_words)
    return pieces


class SentenceBuffer:
    """Collects streamed text (LLM tokens) and hands out each sentence once it is complete.

    A sentence is complete once the text after it shows where it ends: usually the white
    space after its ``.``/``?``/``!``; after ``etc.``-like words, the next word. One buffer
    serves one reply; :meth:`flush` ends the reply and readies the buffer for the next one.
    """

    def __init__(
        self,
        *,
        max_words: int = DEFAULT_MAX_WORDS,
        first_max_words: int = DEFAULT_FIRST_MAX_WORDS,
    ) -> None:
        _check(max_words, first_max_words)
        self._max_words = max_words
        self._first_max_words = first_max_words
        self._text = ""
        self._first = True

    @property
    def pending(self) -> str:
        """Text received but not yet handed out."""
        return self._text

    def push(self, text: str) -> list[str]:
        """Add ``text``; return the sentences it completed (often none)."""
        self._text += text
        pieces, rest, self._first = _scan(
            self._text, False, self._first, self._max_words, self._first_max_words
        )
        self._text = self._text[rest:]
        return pieces

    def flush(self) -> list[str]:
        """The reply is over: return what is left as sentences and reset."""
        pieces, _, _ = _scan(self._text, True, self._first, self._max_words, self._first_max_words)
        self._text, self._first = "", True
        return pieces
