"""``flask minify report`` over a cases file."""
from __future__ import annotations

import json

CASE = {"schema": {"type": "object", "properties": {
    "extracted_customer_organization_department_name": {"type": "string"},
    "customer_contact_email_addresses": {"type": "array", "items": {"type": "string"}}}},
    "output": {"extracted_customer_organization_department_name": "Revenue Operations",
               "customer_contact_email_addresses": ["a@example.com"]}}


def test_report_json_totals(runner, tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(CASE) + "\n\n" + json.dumps(CASE) + "\n")
    result = runner.invoke(args=["minify", "report", "--cases", str(cases), "--json"])
    assert result.exit_code == 0, result.output
    totals = json.loads(result.output)
    assert totals["cases"] == 2 and totals["roundtrip_ok"] is True
    # compact JSON, cl100k: the two long keys shrink to one token each
    assert totals["tokens_after"] < totals["tokens_before"]
    assert totals["reduction"] == round(1 - totals["tokens_after"] / totals["tokens_before"], 4)


def test_report_lines_and_bad_file(runner, tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(CASE) + "\n")
    result = runner.invoke(args=["minify", "report", "--cases", str(cases)])
    assert result.exit_code == 0, result.output
    assert "roundtrip ok" in result.output and "line   1" in result.output
    cases.write_text('{"schema": {}}\n')
    result = runner.invoke(args=["minify", "report", "--cases", str(cases)])
    assert result.exit_code != 0


def test_bench_corpus_roundtrips(runner):
    import os
    corpus = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "data",
                          "minify_corpus.jsonl")
    result = runner.invoke(args=["minify", "report", "--cases", corpus, "--json",
                                 "--no-minify-enums"])
    assert result.exit_code == 0, result.output
    totals = json.loads(result.output)
    assert totals["cases"] >= 20 and totals["roundtrip_ok"] is True
    assert totals["tokens_after"] < totals["tokens_before"]
    result = runner.invoke(args=["minify", "report", "--cases", corpus, "--json",
                                 "--minify-enums"])
    assert result.exit_code == 0, result.output
    with_enums = json.loads(result.output)
    assert with_enums["roundtrip_ok"] is True
    assert with_enums["tokens_after"] < totals["tokens_after"]


def test_report_minify_enums_flag(runner, tmp_path):
    case = {"schema": {"type": "object", "properties": {"status": {
        "enum": ["AWAITING_CUSTOMER_RESPONSE", "ESCALATED_TO_ENGINEERING"]}}},
        "output": {"status": "AWAITING_CUSTOMER_RESPONSE"}}
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(case) + "\n")
    plain = runner.invoke(args=["minify", "report", "--cases", str(cases), "--json",
                                "--no-minify-enums"])
    assert json.loads(plain.output)["reduction"] == 0.0  # "status" is one token already
    # the default follows the policy's (minify_enums on)
    default = runner.invoke(args=["minify", "report", "--cases", str(cases), "--json"])
    assert json.loads(default.output)["reduction"] > 0
    result = runner.invoke(args=["minify", "report", "--cases", str(cases), "--minify-enums"])
    assert result.exit_code == 0, result.output
    assert "values renamed   2" in result.output and "9 ->     5 tokens" in result.output
    assert "roundtrip ok" in result.output


def test_ledger_savings_fields():
    from app.contract.savings import output_token_savings
    small = '{"a":"Revenue Operations"}'
    full = '{"extracted_customer_organization_department_name":"Revenue Operations"}'
    fields = output_token_savings(small, full, "cl100k_base")
    assert fields["minified_schema_tokens_generated"] == 6
    assert fields["raw_schema_output_tokens_equivalent"] == 11
    assert fields["output_token_reduction_pct"] == 45.5
    assert output_token_savings(small, full, "cl100k_base", generated_tokens=7)[
        "raw_schema_output_tokens_equivalent"] == 12


def test_report_alias_styles_save_the_same_tokens_on_the_corpus(runner):
    import os
    corpus = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "data",
                          "minify_corpus.jsonl")
    got = {}
    for style in ("letters", "semantic"):
        result = runner.invoke(args=["minify", "report", "--cases", corpus, "--json",
                                     "--alias-style", style])
        assert result.exit_code == 0, result.output
        got[style] = json.loads(result.output)
        assert got[style]["roundtrip_ok"] is True
    # a word alias is one token and no dearer than a letter where keys are written
    assert got["semantic"]["tokens_after"] <= got["letters"]["tokens_after"]
    result = runner.invoke(args=["minify", "report", "--cases", corpus, "--alias-style", "x"])
    assert result.exit_code != 0


def test_report_spaced_baseline_counts_the_separators_a_pool_no_longer_writes(runner, tmp_path):
    """--baseline spaced: the original as xgrammar writes it without Sluice (", " ": "),
    the minified output as the compact grammar makes the pool write it."""
    from app.contract.tokenizers import count_tokens
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(CASE) + "\n")
    got = {}
    for baseline in ("compact", "spaced"):
        result = runner.invoke(args=["minify", "report", "--cases", str(cases), "--json",
                                     "--baseline", baseline])
        assert result.exit_code == 0, result.output
        got[baseline] = json.loads(result.output)
    assert got["spaced"]["tokens_after"] == got["compact"]["tokens_after"]
    assert got["spaced"]["tokens_before"] == count_tokens(
        json.dumps(CASE["output"], ensure_ascii=False), "cl100k_base")
    assert got["spaced"]["tokens_before"] > got["compact"]["tokens_before"]
    assert got["spaced"]["reduction"] > got["compact"]["reduction"]
