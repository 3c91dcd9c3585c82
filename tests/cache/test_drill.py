"""CD-28A through the CLI and the Drills page, on the real store, recorded as DrillRuns."""
import io
import json
from pathlib import Path

from app.drills.service import list_runs
from tests.console.web import browser, csrf_from, login
from tests.factories import UserFactory

SAMPLE = Path(__file__).resolve().parents[2] / "app" / "cache" / "data" / "cache_pairs_sample.jsonl"
HELDOUT = Path(__file__).resolve().parent / "data" / "pairs_heldout.jsonl"


def run_cli(runner, path):
    res = runner.invoke(args=["drill", "cache-poisoning", "--pairs", str(path), "--json"])
    assert res.exit_code == 0, res.output
    # stdout and stderr are mixed here (the model loader draws a progress bar on stderr)
    return json.JSONDecoder().raw_decode(res.output[res.output.index('{"pairs"'):])[0]


def test_sample_has_no_false_hits_and_catches_light_paraphrases(app, runner):
    out = run_cli(runner, SAMPLE)
    assert set(out) == {"pairs", "false_hits", "false_hit_rate", "true_hits", "true_hit_rate", "by_kind"}
    assert out["pairs"] == 500
    assert out["false_hits"] == 0 and out["false_hit_rate"] == 0.0
    assert out["by_kind"]["paraphrase"]["true_hits"] / out["by_kind"]["paraphrase"]["pairs"] >= 0.9
    runs = list_runs("cache-poisoning")
    assert runs[0].status == "passed" and runs[0].result["false_hits"] == 0


def test_heldout_pairs_have_no_false_hits(app, runner):
    out = run_cli(runner, HELDOUT)
    assert out["pairs"] >= 150 and out["false_hits"] == 0
    print("held-out:", json.dumps(out))


def test_bad_file_is_a_clear_error(app, runner, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": "x"}\n')
    res = runner.invoke(args=["drill", "cache-poisoning", "--pairs", str(bad)])
    assert res.exit_code != 0 and "line 1" in res.output


def test_drills_page_runs_an_uploaded_file_and_lists_history(app):
    client = browser(app)
    user = UserFactory(role="admin")
    login(client, user.email)
    page = client.get("/drills")
    assert page.status_code == 200
    token = csrf_from(page.get_data(as_text=True))
    lines = "\n".join(l for l in SAMPLE.read_text().splitlines()[:40])
    resp = client.post("/drills/cache-poisoning", data={
        "csrf_token": token, "pairs": (io.BytesIO(lines.encode()), "mine.jsonl")},
        content_type="multipart/form-data")
    assert resp.status_code == 303
    html = client.get("/drills").get_data(as_text=True)
    assert "cache-poisoning" in html and "40 pairs" in html and "mine.jsonl" in html
    run = list_runs("cache-poisoning")[0]
    assert run.actor_email == user.email and run.result["pairs"] == 40


def test_drills_page_needs_drill_run_and_csrf(app):
    client = browser(app)
    viewer = UserFactory(role="viewer")
    login(client, viewer.email)
    assert client.get("/drills").status_code == 403
    admin_client = browser(app)
    login(admin_client, UserFactory(role="admin").email)
    assert admin_client.post("/drills/cache-poisoning", data={"csrf_token": "forged"}).status_code == 400
    assert list_runs("cache-poisoning") == []
