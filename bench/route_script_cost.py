"""Instructions Redis executes per call of S03's scripts: the loads script today's policy
(``sluice``) runs, and the route script ``kv_events`` runs instead (loads, the KV-block
index match and the requests sent, in one call), counted by valgrind's callgrind on a
private ``redis-server`` (only ``evalShaCommand`` is counted, so neither the network nor
the server's cron is): a count, not a time, so the box's noise does not move it.

    .venv/bin/python bench/route_script_cost.py [--calls 3000] [--rounds 2]

Needs valgrind and redis-server on the PATH (Debian: ``apt-get install valgrind
redis-server``); about two minutes.

Each script is run ``--calls`` times unmeasured first, then counted over ``--calls`` calls
per round, the scripts taking turns: a count over a few hundred calls right after a
script's first use read up to 50% over its steady cost (Lua's heap and collector settling:
Redis steps the collector every 50 calls), and one over 3,000 calls after the warm-up moves
by ~2% between rounds.

The state is bench/gateway_overhead.py's ``--s03``: four replicas with fresh index entries,
one of them holding the blocks of the ~330-token system prompt (19 blocks of 16 tokens),
and a request with that system prompt and a new short question (its keys from the
gateway's own ``kv_route.request_ids``). The route script is counted without a tally,
with the one-row tally most calls carry (the requests sent to the replica the previous
choice took) and with a row whose token counts are due (once a second per replica).
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def count(redis_pid: int, out_dir: str, call, n: int) -> float:
    """Instructions a call of ``call`` costs the server (zeroed, run ``n`` times, dumped)."""
    for f in glob.glob(f"{out_dir}/cg.*.*"):
        os.remove(f)
    subprocess.run(["callgrind_control", "-z", str(redis_pid)], check=True,
                   capture_output=True)
    for _ in range(n):
        call()
    subprocess.run(["callgrind_control", "-d", str(redis_pid)], check=True,
                   capture_output=True)
    for _ in range(100):
        dumps = glob.glob(f"{out_dir}/cg.*.*")
        if dumps:
            text = Path(max(dumps, key=os.path.getmtime)).read_text()
            totals = [line for line in text.splitlines() if line.startswith("totals:")]
            if totals:
                return int(totals[-1].split()[1]) / n
        time.sleep(0.1)
    raise SystemExit("callgrind wrote no dump")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for tool in ("valgrind", "redis-server", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} on the PATH")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import redis

    from app.contract import inflight, kv_index
    from app.contract.keys import Keys
    from app.contract.tokenizers import chat_tokenizer
    from app.gateway.kv_route import BLOCK_TOKENS, PromptTokens, request_chain, request_ids
    from bench.gateway_overhead import S03_MESSAGES, free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--toggle-collect=evalShaCommand",
             f"--callgrind-out-file={tmp}/cg.%p", "redis-server", "--port", str(port),
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            r = redis.Redis(port=port)
            for _ in range(300):
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.1)
            keys = Keys("route-cost")
            tokens = PromptTokens(chat_tokenizer("smollm2"))
            chain, _ = request_chain(tokens, {"messages": S03_MESSAGES}, None, "")
            ids = [70, 71, 72, 73]
            kv_index.apply_events(r, keys, 70, [("BlockStored", chain)], seq=0)
            kv_index.heartbeat(r, keys, ids)
            body = {"messages": [S03_MESSAGES[0],
                                 {"role": "user", "content": "What is new question 17?"}]}
            blob, _ = request_ids(tokens, body, None, "")
            rows = {
                "loads (sluice)": lambda: inflight.read_loads(r, ids, keys),
                "route, no tally": lambda: kv_index.read_route_inputs(
                    r, keys, ids, blob, BLOCK_TOKENS),
                "route, requests sent": lambda: kv_index.read_route_inputs(
                    r, keys, ids, blob, BLOCK_TOKENS, tally={70: (1, 0, 0)}),
                "route, with token counts": lambda: kv_index.read_route_inputs(
                    r, keys, ids, blob, BLOCK_TOKENS, tally={70: (1, 304, 335)}),
            }
            for call in rows.values():          # warm: scripts loaded, Lua's heap settled
                for _ in range(args.calls):
                    call()
            got: dict[str, list[float]] = {name: [] for name in rows}
            for _ in range(args.rounds):
                for name, call in rows.items():
                    got[name].append(count(server.pid, tmp, call, args.calls))
        finally:
            server.terminate()
            server.wait(30)
    base = min(got["loads (sluice)"])
    print(f"Redis instructions a call (callgrind, evalShaCommand; {args.calls} calls a round "
          f"after as many unmeasured; 4 replicas, one holding the {len(blob) // 8}-block "
          "system prompt); the fewest of the rounds, then each round")
    for name, runs in got.items():
        print(f"{name:>26} {min(runs):10,.0f}  {min(runs) / base:5.2f}x   "
              + " ".join(f"{n:,.0f}" for n in runs))


if __name__ == "__main__":
    main()
