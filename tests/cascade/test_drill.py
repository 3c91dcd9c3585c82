"""CD-28B against a small stand-in gateway on 127.0.0.1 (the real one's margin escalation is
wired by the gateway area); the stand-in escalates the legal prompts and can leak."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.drills.models import DrillRun
from app.extensions import db


def make_server(leak: bool):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["model"] == "auto" and body["stream"] is True
            assert self.headers["Authorization"] == "Bearer sk-test"
            hard = "ISDA" in body["messages"][1]["content"] or "court" in body["messages"][1]["content"]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("x-sluice-request-id", "req_x")
            self.send_header("x-sluice-tier", "frontier" if hard else "small")
            self.send_header("x-sluice-escalated", "true" if hard else "false")
            self.end_headers()
            parts = ['{"invoice_number": ', '"none", "city": "", ', '"amount": 0}']
            for i, p in enumerate(parts):
                cid = "a" if not (leak and hard and i == 0) else "aborted"
                ev = {"id": cid, "model": "m", "choices": [{"index": 0, "delta": {"content": p}}]}
                self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("leak", [False, True])
def test_domain_shift_drill_records_run(app, runner, leak):
    srv = make_server(leak)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        res = runner.invoke(args=["drill", "domain-shift", "--url", url, "--key", "sk-test",
                                  "--n", "6", "--control", "4", "--ledger-wait", "0"])
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.exit_code == 0, res.output
    run = db.session.scalar(db.select(DrillRun).where(DrillRun.kind == "domain-shift"))
    r = run.result
    assert r["ood"]["escalation_rate"] == 1.0 and r["control"]["escalation_rate"] == 0.0
    assert r["ood"]["json_valid"] == 6 and r["errors"] == 0
    assert r["added_latency_ms"] is not None
    if leak:
        assert r["aborted_tier_bytes_to_client"] == 6 and run.status == "failed"
    else:
        assert r["aborted_tier_bytes_to_client"] == 0 and run.status == "passed"
    assert "aborted-tier bytes to client" in res.output


def test_unreachable_gateway_is_an_error_not_a_pass(app, runner):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    res = runner.invoke(args=["drill", "domain-shift", "--url", f"http://127.0.0.1:{port}",
                              "--key", "k", "--n", "2", "--control", "1", "--ledger-wait", "0",
                              "--timeout", "2"])
    assert res.exit_code == 0
    run = db.session.scalar(db.select(DrillRun).where(DrillRun.kind == "domain-shift"))
    assert run.status == "failed" and run.result["errors"] == 3
