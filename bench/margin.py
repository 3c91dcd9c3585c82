"""Margin benchmark: does the logprob margin of SmolLM2 predict a correct extraction?

Runs the project's CPU reference engine (``python -m app.engine --model smollm2``, started
here on a free 127.0.0.1 port unless --url is given) on bench/data/extraction_gold.jsonl,
greedy, with ``response_format`` = a JSON schema {"answer": string} and
``logprobs=true, top_logprobs=2``. For each item it computes the margin the S04 monitor
would see (mean over the first N JSON value tokens, N = policy margin_window_tokens) and
over all value tokens / all tokens, and prints the AUROC of the margin for predicting a
correct answer and the accuracy/escalation trade-off as γ varies.

    .venv/bin/python bench/margin.py [--url http://127.0.0.1:8500] [--limit 50]
    .venv/bin/python bench/margin.py --recorded bench/data/margin_results_smollm2.jsonl

``--recorded`` reports from per-item results an earlier run wrote with ``--out`` (no engine
is started; the answers and margins are the ones that run measured).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core import margin_calibration as mc  # noqa: E402
from app.core.margin import MarginMonitor, logprob_items, margin, value_token_mask  # noqa: E402

DATA = Path(__file__).with_name("data") / "extraction_gold.jsonl"
SYSTEM = ("You answer with the exact value only (a few words copied from the text, never a "
          'sentence), as JSON: {"answer": "<value>"}.')
SCHEMA = {"type": "json_schema", "json_schema": {"name": "extraction", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
    "additionalProperties": False}}}
GAMMAS = (0.25, 0.5, 0.78, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.engine", "--model", "smollm2",
                             "--port", str(port), "--threads", str(threads)],
                            cwd=Path(__file__).resolve().parent.parent, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise RuntimeError("engine did not become healthy in 300 s")


def normalise(s: str) -> str:
    return re.sub(r"[^\w@.\-]", "", str(s).casefold()).strip(".")


def correct(answer: str, item: dict) -> bool:
    if item["kind"] == "number":
        try:
            return abs(float(str(answer).replace(",", "").replace("EUR", "").strip())
                       - float(item["gold"])) < 1e-6
        except ValueError:
            return False
    return normalise(answer) == normalise(item["gold"])


def ask(client: httpx.Client, url: str, item: dict) -> dict:
    body = {"model": "smollm2", "temperature": 0, "max_tokens": 32, "logprobs": True,
            "top_logprobs": 2, "response_format": SCHEMA,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Text: {item['text']}\n"
                                                     f"What is the {item['field']}?"}]}
    r = client.post(url + "/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()


def measure(resp: dict, item: dict, window: int) -> dict:
    lps = logprob_items(resp)
    text = resp["choices"][0]["message"]["content"] or ""
    try:
        answer = json.loads(text).get("answer", "")
    except (ValueError, AttributeError):
        answer = ""
    mask = value_token_mask([x["token"] for x in lps])
    mon = MarginMonitor(gamma=0.0, window_tokens=window, schema=True)
    mon.feed(lps)
    return {"id": item["id"], "field": item["field"], "gold": item["gold"], "answer": answer,
            "correct": correct(answer, item),
            "margin_window": mon.margin if mon.value_tokens else margin(lps),
            "margin_values": margin(lps, mask), "margin_all": margin(lps),
            "value_tokens": sum(mask), "tokens": len(lps)}


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability a random correct item has a higher margin than a random wrong one."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a running reference engine; else one is started")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--window", type=int, default=12, help="policy margin_window_tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="per-item results (JSONL), appended as they come; a rerun "
                                  "with the same file resumes")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--recorded", help="report from this per-item results file (JSONL "
                                       "written by --out); nothing is run")
    args = ap.parse_args()
    items = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    if args.limit:
        items = items[:args.limit]
    if args.recorded:
        return report_recorded(Path(args.recorded), items, args.window)
    proc = None
    url = args.url
    if not url:
        proc, url = start_engine(args.threads)
    rows, failed = [], 0
    out = Path(args.out) if args.out else None
    if out is not None and out.exists():  # resume: keep what an earlier run measured
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    done = {r["id"] for r in rows}
    t0 = time.perf_counter()
    try:
        with httpx.Client(timeout=httpx.Timeout(args.timeout, connect=5)) as client:
            for n, it in enumerate(items):
                if it["id"] in done:
                    continue
                try:
                    resp = ask(client, url, it)
                except httpx.HTTPError as exc:
                    failed += 1
                    print(f"{it['id']}: {type(exc).__name__}, skipped", file=sys.stderr, flush=True)
                    continue
                row = measure(resp, it, args.window)
                rows.append(row)
                if out is not None:
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                if n % 20 == 0:
                    print(f"{n}/{len(items)} items, {time.perf_counter() - t0:.0f} s",
                          file=sys.stderr, flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    elapsed = time.perf_counter() - t0
    if failed:
        print(f"{failed} items failed (timeouts) and are not counted")
    report(rows, args.window, elapsed, url if args.url else "started python -m app.engine")
    return 0


def report_recorded(path: Path, items: list[dict], window: int) -> int:
    """Report from recorded per-item results; correctness is re-scored against the gold file."""
    gold = {it["id"]: it for it in items}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["id"] in gold]
    for r in rows:
        r["correct"] = correct(r["answer"], gold[r["id"]])
    missing = len(gold) - len({r["id"] for r in rows})
    if missing:
        print(f"{missing} gold items have no recorded result and are not counted")
    report(rows, window, None, f"recorded results {path.name}")
    return 0


def report(rows: list[dict], window: int, elapsed: float | None, engine: str) -> None:
    y = np.array([r["correct"] for r in rows], dtype=int)
    took = "" if elapsed is None else f" in {elapsed:.0f} s"
    print(f"engine: {engine} (SmolLM2-135M-Instruct Q4_1 GGUF, greedy, json_schema, "
          f"top_logprobs=2); {len(rows)} items{took}")
    print(f"accuracy (no escalation): {y.mean():.1%} ({y.sum()}/{len(y)})")
    for key, label in (("margin_window", f"margin, first {window} value tokens (the monitor)"),
                       ("margin_values", "margin, all value tokens"),
                       ("margin_all", "margin, all tokens (keys/punctuation too)")):
        s = np.nan_to_num(np.array([r[key] for r in rows], dtype=float), nan=0.0)
        print(f"AUROC {label:52s} {auroc(s, y):.3f}")
    s = np.nan_to_num(np.array([r["margin_window"] for r in rows], dtype=float), nan=0.0)
    print("\n gamma  escalated  accepted-accuracy  wrong-caught  right-escalated")
    for g in GAMMAS:
        esc = s < g
        kept = ~esc
        acc = y[kept].mean() if kept.any() else float("nan")
        caught = (esc & (y == 0)).sum() / max(1, (y == 0).sum())
        wasted = (esc & (y == 1)).sum() / max(1, (y == 1).sum())
        print(f" {g:5.2f}  {esc.mean():8.1%}  {acc:16.1%}  {caught:11.1%}  {wasted:14.1%}")
    print("\nγ calibration (app.core.margin_calibration, what `flask sluice calibrate-gamma "
          "--traces` fits):")
    print(" target            gamma  escalated  recall  precision  accepted-accuracy")
    margins, correct = mc.labelled((r["margin_window"], bool(r["correct"])) for r in rows)
    for kind, target in (("recall", 0.25), ("recall", 0.5), ("recall", 0.75),
                         ("precision", 0.6), ("precision", 0.7), ("precision", 0.8)):
        fit = mc.fit_gamma(margins, correct, kind, target)
        p = fit["point"]
        if p is None:
            print(f" {kind} {target:.0%}: {fit['reason']}")
            continue
        prec = "—" if p["precision"] is None else f"{p['precision']:.1%}"
        kept = "—" if p["kept_accuracy"] is None else f"{p['kept_accuracy']:.1%}"
        print(f" {kind:9s} {target:4.0%}  {fit['gamma']:7.4f}  {p['escalation_rate']:8.1%}  "
              f"{p['recall']:6.1%}  {prec:>9}  {kept:>17}")
    by_field: dict[str, list[int]] = {}
    for r in rows:
        by_field.setdefault(r["field"], []).append(int(r["correct"]))
    print("\naccuracy by field: " + ", ".join(f"{f} {np.mean(v):.0%}" for f, v in by_field.items()))


if __name__ == "__main__":
    sys.exit(main())
