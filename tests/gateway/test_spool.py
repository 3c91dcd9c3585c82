"""The gateway's ledger spool: a live owner's file is never taken, a dead one's is
adopted whole (a torn last line skipped), and a drained spool starts over."""
from __future__ import annotations

import fcntl
import os

import orjson

from app.gateway.ledger_writer import Spool


def test_live_spool_is_left_alone_and_dead_one_is_adopted(tmp_path):
    live = Spool(tmp_path)
    live.append(orjson.dumps({"request_id": "live-1"}))
    dead = tmp_path / "ledger-999-deadbeef.spool"
    dead.write_bytes(b'{"request_id":"d1"}\n{"request_id":"d2"}\n{"request_id":"d')
    heir = Spool(tmp_path)
    adopted = heir.adopt_orphans()
    assert [e["request_id"] for e in adopted] == ["d1", "d2"]
    assert not dead.exists()
    assert live.path.exists()
    # the adopted events are in the heir's own spool until they reach the stream
    assert heir.path.read_bytes().count(b"\n") == 2
    live.close(remove=True)
    heir.close(remove=False)


def test_clear_truncates_and_close_keeps_what_is_unsent(tmp_path):
    s = Spool(tmp_path)
    s.append(b'{"request_id":"a"}')
    s.clear()
    assert s.path.read_bytes() == b""
    s.append(b'{"request_id":"b"}')
    s.close(remove=False)
    assert s.path.read_bytes() == b'{"request_id":"b"}\n'
    fd = os.open(s.path, os.O_RDWR)  # its lock went with the owner
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
