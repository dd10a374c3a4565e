"""The control socket's framing and errors, without a daemon: what the CLI and the daemon say to
each other survives the trip, bad frames are refused before they cost memory, and an error the
daemon answers comes back as the AirlockError it was (same exit code)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest

from airlockd import errors
from airlockd.lsp.client import Daemon, DaemonGone, RemoteError
from airlockd.lsp.control import MAX_MESSAGE, frame, read_message


def _read(raw: bytes) -> object:
    async def go() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_message(reader)

    return asyncio.run(go())


def test_a_frame_reads_back_as_the_message() -> None:
    msg = {"jsonrpc": "2.0", "id": 7, "method": "airlock/hello", "params": {"é": "ü" * 3}}
    assert _read(frame(msg)) == msg
    assert _read(b"") is None


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"Content-Length: %d\r\n\r\n{" % (MAX_MESSAGE + 1), "oversized"),
        (b"Content-Length: x\r\n\r\n{}", "bad Content-Length"),
        (b"\r\n{}", "missing"),
        (b"Content-Length: 2\r\n\r\n[]", "JSON object"),
        (b"X: " + b"y" * 9000 + b"\r\n\r\n", "too long"),
    ],
)
def test_bad_frames_are_refused(raw: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        _read(raw)


def test_every_error_comes_back_as_itself() -> None:
    for cls in [errors.AirlockError, *errors._subclasses(errors.AirlockError)]:
        if cls is errors.ConflictError:
            sent: errors.AirlockError = errors.ConflictError("moved", paths=["a.py"], hint="reject it")
        else:
            sent = cls("went wrong", hint="do this", run_id="r1")
        back = errors.from_json(str(sent), json.loads(json.dumps(sent.to_json())))
        assert type(back) is cls and back.exit_code == sent.exit_code
        assert back.message == sent.message and back.hint == sent.hint
        assert back.to_json() == sent.to_json()


def test_the_client_keeps_notifications_that_come_before_its_answer() -> None:
    mine, theirs = socket.socketpair()
    daemon = Daemon(mine)

    def serve() -> None:
        buf = theirs.recv(65536)
        req = json.loads(buf.split(b"\r\n\r\n", 1)[1])
        note = {"jsonrpc": "2.0", "method": "airlock/runDone", "params": {"runId": "r1", "state": "proposed"}}
        reply = {"jsonrpc": "2.0", "id": req["id"], "result": {"runId": "r1"}}
        data = frame(note) + frame(reply)
        for i in range(len(data)):  # byte by byte: framing must not assume whole reads
            theirs.send(data[i : i + 1])
        buf = theirs.recv(65536)
        req = json.loads(buf.split(b"\r\n\r\n", 1)[1])
        err = {"code": -32030, "message": "conflict", "data": {"error": "conflict", "message": "m", "paths": []}}
        theirs.sendall(frame({"jsonrpc": "2.0", "id": req["id"], "error": err}))
        theirs.close()

    t = threading.Thread(target=serve)
    t.start()
    assert daemon.command("airlock.runTask", {"agent": "a", "prompt": "p"}) == {"runId": "r1"}
    note = daemon.wait_for(lambda n: n["params"]["runId"] == "r1", timeout=5)
    assert note["method"] == "airlock/runDone"
    with pytest.raises(RemoteError) as got:
        daemon.command("airlock.approve", {"runId": "r1"})
    assert got.value.code == -32030 and got.value.data["error"] == "conflict"
    with pytest.raises(DaemonGone):
        daemon.command("airlock.approve", {"runId": "r1"})
    t.join()
    daemon.close()
