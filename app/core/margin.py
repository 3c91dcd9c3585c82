"""Token-level logprob margin (seed S04) and the streaming monitor that decides escalation. Pure.

Input is the OpenAI chat logprobs format: ``choices[0].logprobs.content`` is a list of
``{"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}`` (one per generated
token; a streamed chunk carries a slice of that list).

Margin of a token = log p(top-1) − log p(top-2) of the distribution it was drawn from.
When the engine returned only one alternative, the rest of the probability mass
(1 − p1) bounds p(top-2) from above, so log p1 − log(1 − p1) is used: a lower bound on
the true margin, i.e. the monitor errs towards escalating. Per-token margins are
clipped to [0, MAX_TOKEN_MARGIN] so one near-certain token cannot hide the rest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

MAX_TOKEN_MARGIN = 20.0
UNDECIDED, PASS, ESCALATE = "undecided", "pass", "escalate"


def token_margin(item: Mapping[str, Any]) -> float:
    """Margin of one generated token (see the module docstring)."""
    lps = [float(t["logprob"]) for t in item.get("top_logprobs") or ()]
    if item.get("logprob") is not None:
        lps.append(float(item["logprob"]))  # the sampled token may be missing from the top list
    lps = sorted({lp for lp in lps if not math.isnan(lp)}, reverse=True)
    if not lps:
        return 0.0
    top1 = min(lps[0], 0.0)
    if len(lps) >= 2:
        top2 = lps[1]
    else:
        rest = 1.0 - math.exp(top1)
        top2 = math.log(rest) if rest > 0 else -math.inf
    m = top1 - top2
    return MAX_TOKEN_MARGIN if math.isinf(m) else max(0.0, min(MAX_TOKEN_MARGIN, m))


def margin(items: Sequence[Mapping[str, Any]], value_mask: Sequence[bool] | None = None) -> float:
    """Mean token margin over the tokens where ``value_mask`` is true (all when None).
    NaN when no token is selected."""
    chosen = [it for i, it in enumerate(items) if value_mask is None or value_mask[i]]
    if not chosen:
        return math.nan
    return sum(token_margin(it) for it in chosen) / len(chosen)


class JsonValueScanner:
    """Incremental JSON scanner: which characters of a text stream lie inside JSON values.

    Text before the first ``{``/``[`` (a preamble, a code fence) and after the top-level
    container closes is not JSON. Value characters are the content of value strings
    (not keys, not the quotes) and the characters of numbers, true, false and null.
    """

    def __init__(self) -> None:
        self.stack: list[str] = []     # "{" or "["
        self.expect_key = False        # inside an object, before the ":" of a member
        self.in_string = False
        self.string_is_value = False
        self.escape = False
        self.in_literal = False

    def _starts_value(self) -> bool:
        return bool(self.stack) and not (self.stack[-1] == "{" and self.expect_key)

    def feed(self, text: str) -> int:
        """Consume ``text``; return how many of its characters were value characters."""
        count = 0
        for ch in text:
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                    continue
                count += self.string_is_value
                continue
            if self.in_literal:
                if ch.isalnum() or ch in "+-.":
                    count += 1
                    continue
                self.in_literal = False
            if not self.stack:
                if ch in "{[":
                    self.stack.append(ch)
                    self.expect_key = ch == "{"
                continue
            if ch == '"':
                self.in_string = True
                self.string_is_value = self._starts_value()
            elif ch in "{[":
                self.stack.append(ch)
                self.expect_key = ch == "{"
            elif ch in "}]":
                self.stack.pop()
                self.expect_key = False
            elif ch == ":":
                self.expect_key = False
            elif ch == ",":
                self.expect_key = self.stack[-1] == "{"
            elif ch.isalnum() or ch in "+-.":
                if self._starts_value():
                    self.in_literal = True
                    count += 1
        return count


def value_token_mask(tokens: Iterable[str], *, schema: bool = True) -> list[bool]:
    """Which generated tokens carry JSON value characters (all tokens when ``schema`` is false).
    JSON state is tracked across token boundaries, so ``"Par`` + ``is"`` both count."""
    tokens = list(tokens)
    if not schema:
        return [True] * len(tokens)
    scanner = JsonValueScanner()
    return [scanner.feed(t) > 0 for t in tokens]


def logprob_items(payload: Mapping[str, Any]) -> list[dict]:
    """The logprob items of a chat completion or of one streamed chunk (choice 0); [] if none."""
    try:
        return list(payload["choices"][0]["logprobs"]["content"] or [])
    except (KeyError, IndexError, TypeError):
        return []


@dataclass
class MarginMonitor:
    """Streaming margin decision for one attempt.

    ``feed`` returns "undecided" until ``window_tokens`` value tokens were seen, then
    "escalate" when their mean margin is below ``gamma`` and "pass" otherwise; the first
    decision sticks. ``finish`` decides at end of stream on what was seen (all tokens when
    a schema was set but no value token appeared; "pass" on an empty answer).
    """

    gamma: float
    window_tokens: int
    schema: bool = False
    decision: str = UNDECIDED
    value_tokens: int = 0
    tokens: int = 0
    _sum: float = 0.0
    _sum_all: float = 0.0
    _scanner: JsonValueScanner = field(default_factory=JsonValueScanner)

    @property
    def margin(self) -> float:
        """Running mean margin over the value tokens seen so far (NaN before the first)."""
        return self._sum / self.value_tokens if self.value_tokens else math.nan

    def feed(self, items: Iterable[Mapping[str, Any]]) -> str:
        for it in items:
            if self.decision != UNDECIDED:
                break
            m = token_margin(it)
            self.tokens += 1
            self._sum_all += m
            is_value = not self.schema or self._scanner.feed(str(it.get("token", ""))) > 0
            if is_value:
                self.value_tokens += 1
                self._sum += m
                if self.value_tokens >= self.window_tokens:
                    self.decision = ESCALATE if self.margin < self.gamma else PASS
        return self.decision

    def finish(self) -> str:
        if self.decision == UNDECIDED:
            if self.value_tokens:
                mean = self.margin
            elif self.tokens:
                mean = self._sum_all / self.tokens
            else:
                mean = math.inf
            self.decision = ESCALATE if mean < self.gamma else PASS
        return self.decision


@dataclass
class HeldStream:
    """Holds one attempt's stream events back until its monitor decides (S04 streaming).

    ``push`` takes an event (bytes, a chunk dict: anything) with the logprob items it
    carries and returns (decision, events the client may now be sent): nothing while
    undecided, everything held on "pass" (then each later event as it comes), and
    nothing ever on "escalate" (the held events are dropped: the caller aborts the
    upstream and re-runs on the next tier). ``end`` decides at end of stream.
    """

    monitor: MarginMonitor
    held: list = field(default_factory=list)

    def push(self, event: Any, items: Iterable[Mapping[str, Any]] = ()) -> tuple[str, list]:
        if self.monitor.decision == PASS:
            return PASS, [event]
        if self.monitor.decision == ESCALATE:
            return ESCALATE, []
        decision = self.monitor.feed(items)
        self.held.append(event)
        return self._settle(decision)

    def end(self) -> tuple[str, list]:
        if self.monitor.decision == PASS:
            return PASS, []
        return self._settle(self.monitor.finish())

    def _settle(self, decision: str) -> tuple[str, list]:
        if decision == UNDECIDED:
            return decision, []
        out, self.held = (self.held if decision == PASS else []), []
        return decision, out
