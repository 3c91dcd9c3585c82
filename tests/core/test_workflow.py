from app.core.workflow import static_system_prompt, workflow_signature


def _body(system, schema=None, user="hi"):
    b = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    if schema:
        b["response_format"] = {"type": "json_schema", "json_schema": schema}
    return b


def test_dynamic_parts_do_not_split_a_workflow():
    a = _body("Extract invoices. Now: 2026-10-18T09:12:00Z, trace 550e8400-e29b-41d4-a716-446655440000")
    b = _body("Extract invoices. Now: 2026-12-01T23:59:59Z, trace 123e4567-e89b-12d3-a456-426614174000",
              user="different question")
    assert workflow_signature(1, a) == workflow_signature(1, b)


def test_tenant_prompt_and_schema_each_split():
    base = _body("Extract invoices.", {"name": "inv", "schema": {"type": "object"}})
    sig = workflow_signature(1, base)[0]
    assert workflow_signature(2, base)[0] != sig
    assert workflow_signature(1, _body("Summarise tickets.", {"name": "inv",
                                                               "schema": {"type": "object"}}))[0] != sig
    assert workflow_signature(1, _body("Extract invoices.", {"name": "inv2",
                                                              "schema": {"type": "object"}}))[0] != sig
    assert len(sig) == 64


def test_header_wins_and_fits_column():
    sig, name = workflow_signature(1, _body("x"), header="invoice-extract")
    assert (sig, name) == ("invoice-extract", "invoice-extract")
    sig, name = workflow_signature(1, _body("x"), header="Invoice extraction (EU) " * 5)
    assert len(sig) == 64 and sig.startswith("h:") and name.startswith("Invoice")


def test_static_prompt_stops_at_first_user_turn_and_reads_parts():
    msgs = [{"role": "system", "content": [{"type": "text", "text": "A 12:30"}]},
            {"role": "user", "content": "B"}, {"role": "system", "content": "C"}]
    assert static_system_prompt(msgs) == "A \x00"
