"""Token savings of key minification over a file of (schema, output) cases.

Minified outputs are counted serialised compactly, as a pool tier behind S02 writes them
(policy ``minify_compact_json``): ``json.dumps(obj, ensure_ascii=False, separators=(",",
":"))``. The original output is counted the same way (the keys' saving alone), or with
``baseline_separators=(", ", ": ")`` as a grammar engine writes it without Sluice
(xgrammar's default; the whole saving on a pool tier).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from app.core.minify import (MinifyOptions, expand_json, minify_json, minify_schema,
                             validate_minified)
from app.contract.tokenizers import get_counter


@dataclass
class CaseReport:
    line: int
    name: str
    tokens_before: int
    tokens_after: int
    roundtrip_ok: bool
    valid_minified: bool
    renamed_keys: int
    renamed_values: int = 0

    @property
    def reduction(self) -> float:
        return 1 - self.tokens_after / self.tokens_before if self.tokens_before else 0.0


COMPACT = (",", ":")
SPACED = (", ", ": ")


def compact(obj: Any, separators: tuple[str, str] = COMPACT) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=separators)


def read_cases(lines: Iterable[str]) -> list[tuple[int, dict]]:
    cases = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            case = json.loads(line)
            if not isinstance(case, dict) or "schema" not in case or "output" not in case:
                raise ValueError(f"line {n}: expected {{\"schema\": ..., \"output\": ...}}")
            cases.append((n, case))
    return cases


def report_case(n: int, case: dict, tokenizer: str, options: MinifyOptions = MinifyOptions(),
                baseline_separators: tuple[str, str] = COMPACT) -> CaseReport:
    counter = get_counter(tokenizer)
    minified_schema, keymap = minify_schema(case["schema"], tokenizer=counter, options=options)
    output = case["output"]
    small = minify_json(output, keymap)
    text = compact(small)
    back = expand_json(text, keymap)
    roundtrip = json.loads(back) == output and expand_json(small, keymap) == output
    return CaseReport(line=n, name=str(case.get("name") or case["schema"].get("title") or n),
                      tokens_before=counter.count(compact(output, baseline_separators)),
                      tokens_after=counter.count(text), roundtrip_ok=roundtrip,
                      valid_minified=not validate_minified(small, minified_schema),
                      renamed_keys=keymap.renamed,
                      renamed_values=len(keymap.value_renames))


def summarise(reports: list[CaseReport]) -> dict[str, Any]:
    before = sum(r.tokens_before for r in reports)
    after = sum(r.tokens_after for r in reports)
    return {"cases": len(reports), "tokens_before": before, "tokens_after": after,
            "reduction": round(1 - after / before, 4) if before else 0.0,
            "roundtrip_ok": all(r.roundtrip_ok for r in reports)}


def case_dicts(reports: list[CaseReport]) -> list[dict[str, Any]]:
    return [{**asdict(r), "reduction": round(r.reduction, 4)} for r in reports]
