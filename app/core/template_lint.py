"""Prompt-template lint (seed guardrail): "a single dynamic timestamp or UUID at line 1 of a
system prompt invalidates 4,500 tokens of KV-cache prefill across every request". Pure.

Two signals:
- patterns: timestamps, dates, clock times, UUIDs, request ids, long hex ids, epoch
  numbers, e-mail addresses and greeting/user-name lines, found in one prompt;
- divergence: across several samples of one workflow's system prompt, the first
  character where they stop agreeing. That is where the engine's prefix cache stops, so
  with two or more samples it decides; a pattern before it is static (a fixed date in the
  instructions is harmless) and the pattern covering it names the cause.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

_MONTHS = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|"
           r"Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_HEX = r"[0-9a-fA-F]"

# Most specific first: a timestamp is reported as one span, not as a date plus a time.
PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("uuid", re.compile(rf"\b{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}\b")),
    ("timestamp", re.compile(
        r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")),
    ("request_id", re.compile(
        r"\b(?i:request[_ -]?id|req[_ -]?id|trace[_ -]?id|correlation[_ -]?id|session[_ -]?id)"
        r"\s*[:=#]\s*\S+|\b(?:req|inf|trace|run|msg|chatcmpl)[_-][A-Za-z0-9_-]{6,}")),
    ("email", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    ("date", re.compile(
        rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b|"
        rf"\b{_MONTHS}\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b|\b\d{{1,2}} {_MONTHS} \d{{4}}\b|"
        r"\b(?i:today is|current date|the date is)\b[^\n.]{0,30}")),
    ("time", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp][Mm])?\b")),
    ("epoch", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?\b")),
    ("hex_id", re.compile(rf"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F]){_HEX}{{12,}}\b")),
    ("user_name", re.compile(
        r"\b(?i:user(?:name)?|customer|name|agent)\s*[:=]\s*[A-Z]?[\w.'-]+(?: [A-Z][\w'-]+)?"
        r"|\b(?:Hello|Hi|Dear|Welcome(?: back)?),? [A-Z][a-z]+(?: [A-Z][a-z]+)?")),
)


@dataclass(frozen=True)
class Finding:
    kind: str
    start: int          # character offsets in the prompt
    end: int
    text: str


@dataclass
class LintResult:
    prompt_tokens: int
    first_dynamic_token: int | None     # None: nothing dynamic found
    kind: str = ""                      # what sits there ("varies" when no pattern says)
    snippet: str = ""
    confirmed: bool = False             # True when samples really differ there
    findings: list[Finding] = field(default_factory=list)

    @property
    def cacheable_tokens_lost(self) -> int:
        """Static-prompt tokens after the first dynamic span: the prefix cache cannot reuse
        them although most of them are the same in every request."""
        if self.first_dynamic_token is None:
            return 0
        return max(0, self.prompt_tokens - self.first_dynamic_token)


def approx_tokens(text: str) -> int:
    """~4 characters per token, the usual BPE average; pass a real counter when known."""
    return (len(text) + 3) // 4


def find_dynamic(text: str) -> list[Finding]:
    """Dynamic-looking spans, left to right, without overlaps."""
    taken: list[tuple[int, int]] = []
    out: list[Finding] = []
    for kind, rx in PATTERNS:
        for m in rx.finditer(text):
            s, e = m.span()
            if e <= s or any(s < te and ts < e for ts, te in taken):
                continue
            taken.append((s, e))
            out.append(Finding(kind, s, e, m.group(0)))
    return sorted(out, key=lambda f: f.start)


def common_prefix_chars(samples: Sequence[str]) -> int:
    if not samples:
        return 0
    first, n = samples[0], min(len(s) for s in samples)
    for i in range(n):
        ch = first[i]
        if any(s[i] != ch for s in samples[1:]):
            return i
    return n


def lint_samples(samples: Sequence[str],
                 count_tokens: Callable[[str], int] = approx_tokens) -> LintResult:
    """Lint one workflow's system prompts (one or more samples of live traffic)."""
    samples = [s for s in samples if s]
    if not samples:
        return LintResult(0, None)
    base = samples[0]
    findings = find_dynamic(base)
    total = count_tokens(base)
    if len(samples) == 1:
        if not findings:
            return LintResult(total, None, findings=findings)
        f = findings[0]
        return LintResult(total, count_tokens(base[:f.start]), f.kind, f.text[:80], False,
                          findings)
    cut = common_prefix_chars(samples)
    if cut >= min(len(s) for s in samples) and all(len(s) == len(base) for s in samples):
        return LintResult(total, None, findings=findings)      # identical samples
    at = next((f for f in findings if f.start <= cut < max(f.end, f.start + 1)), None)
    if at is not None:
        start, kind = at.start, at.kind
    else:
        start = max(base.rfind(" ", 0, cut), base.rfind("\n", 0, cut)) + 1
        kind = "varies"
    snippet = base[start:start + 60].split("\n")[0]
    return LintResult(total, count_tokens(base[:start]), kind, snippet, True, findings)


def tokens_lost_per_day(result: LintResult, requests_per_day: float) -> int:
    return int(result.cacheable_tokens_lost * max(0.0, requests_per_day))
