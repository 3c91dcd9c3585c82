"""Security finding 8 (entity scan): the entity parse costs ~10 us a character, so a 4 MiB
prompt held the gateway's CPU for about a minute. Past MAX_ENTITY_CHARS the guard reads
the question alone (the history before it is bound exactly by the key's history hash),
and a question longer than the embedding window is exact-only and never scanned."""
from __future__ import annotations

from app.contract.cache.keys import MAX_ENTITY_CHARS, build_key
from app.contract.policy import DEFAULTS
from app.core.entities import entity_profile

Q = "What is the refund window for order 1234?"


def _body(system: str, question: str = Q) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": question}]}


def test_a_huge_system_prompt_is_not_scanned_only_the_question_is():
    huge = "Alice paid Bob 12 USD on 3 March. " * (4 * 1024 * 1024 // 34)
    key = build_key(1, DEFAULTS, "m", _body(huge))
    assert key.semantic is True
    assert key.profile == entity_profile(Q)
    other = build_key(1, DEFAULTS, "m", _body(huge, Q.replace("1234", "1235")))
    assert other.history_hash == key.history_hash      # same bucket...
    assert other.profile.signature_hash != key.profile.signature_hash   # ...told apart
    changed = build_key(1, DEFAULTS, "m", _body(huge.replace("12 USD", "13 USD", 1)))
    assert changed.history_hash != key.history_hash    # a changed prefix never shares


def test_a_huge_question_is_exact_only_and_never_scanned():
    key = build_key(1, DEFAULTS, "m", _body("be brief", "Alice paid Bob 12 USD. " * 200_000))
    assert key.semantic is False and key.profile.signature_hash == "unscanned"


def test_up_to_the_cap_the_guard_reads_the_whole_conversation():
    system = "Carol manages account 5521. " * (MAX_ENTITY_CHARS // 40)
    key = build_key(1, DEFAULTS, "m", _body(system))
    assert key.profile == entity_profile(system + "\n" + Q)
