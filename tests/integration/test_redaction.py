"""Secrets planted in every channel of a real run appear in nothing airlockd wrote.

Each example: a fresh workspace whose withheld `.env` holds random values; prompts carrying a
known token format (refused at admission), a withheld value (refused), and a high-entropy key
assignment (admitted, masked); an agent that rebuilds every secret from pieces and prints it on
stdout and stderr, and fails with it; CLI errors that echo a secret; a background run. Then every
file under the state directory (names and bytes), and every CLI stdout / stderr, is searched.
"""

from __future__ import annotations

import base64
import json
import os
import string
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from daemons import end_daemons
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airlockd.redact import shannon_entropy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

AGENT = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    """
)
ALNUM = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits


def _s(alphabet: str, n: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=n, max_size=n)


TOKENS = st.one_of(
    _s(UPPER, 16).map(lambda s: "AKIA" + s),
    _s(ALNUM, 36).map(lambda s: "ghp_" + s),
    _s(ALNUM, 24).map(lambda s: "glpat-" + s),
    _s(ALNUM, 32).map(lambda s: "sk-ant-" + s),
    st.builds(
        lambda alg, sub, iat, sig: (
            f"{_b64url({'alg': alg, 'typ': 'JWT'})}.{_b64url({'sub': sub, 'iat': iat})}."
            + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()
        ),
        st.sampled_from(["HS256", "RS256", "ES256"]),
        _s(ALNUM, 10),
        st.integers(1_600_000_000, 1_900_000_000),
        st.binary(min_size=32, max_size=32),
    ),
)
RANDOM = _s(ALNUM, 24).filter(lambda s: shannon_entropy(s) >= 3.5)


def _b64url(obj: object) -> str:
    """A JWT part as an issuer writes one: base64url of compact JSON, unpadded."""
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).rstrip(b"=").decode()


def _cli(ws: Path, outputs: list[str], *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "airlockd", "--workspace", str(ws), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "AIRLOCK_STATE_DIR": str(ws.parent / "state")},
    )
    outputs += [proc.stdout, proc.stderr]
    return proc


def _split(secret: str) -> str:
    """Shell that prints `secret` without the prompt ever holding it whole."""
    h = len(secret) // 2
    return f"P1='{secret[:h]}'; P2='{secret[h:]}'; S=\"$P1$P2\""


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(token=TOKENS, assigned=RANDOM, env_value=RANDOM, env_token=TOKENS)
def test_planted_secrets_never_reach_anything_airlockd_wrote(
    _state_dir: Path, token: str, assigned: str, env_value: str, env_token: str
) -> None:
    # each example has its own workspace and state root (beside it), so one example's leftovers
    # are never blamed on the next
    root = Path(tempfile.mkdtemp(prefix="redact-", dir=_state_dir))
    try:
        _plant_and_search(root, token, assigned, env_value, env_token)
    finally:
        end_daemons(root / "state")


def _plant_and_search(root: Path, token: str, assigned: str, env_value: str, env_token: str) -> None:
    state_dir = root / "state"
    secrets = {"token": token, "assigned": assigned, "env_value": env_value, "env_token": env_token}
    ws = root / "project"
    ws.mkdir()
    (ws / "policies.toml").write_text(AGENT)
    (ws / "app.py").write_text("print('hi')\n")
    (ws / ".env").write_text(f"DB_PASSWORD={env_value}\nAPI_TOKEN={env_token}\n")
    out: list[str] = []

    # the prompt: a known token format and a withheld value are refused before anything runs
    assert _cli(ws, out, "--json", "run", "--agent", "bot", "--wait", f"echo {token}").returncode == 3
    assert _cli(ws, out, "run", "--agent", "bot", "--wait", f"deploy with {env_value}").returncode == 3
    # ... a high-entropy key assignment is admitted and masked; the agent echoes everything
    script = (
        f"echo api_key={assigned}; echo {assigned} >&2; "
        + "; ".join(f'{_split(v)}; echo "$S"; echo "$S" >&2' for v in (token, env_value, env_token))
        + f"; echo 'print(1)' > app.py; {_split(env_value)}; echo \"failed: $S\" >&2; exit 3"
    )
    proc = _cli(ws, out, "--json", "run", "--agent", "bot", "--wait", script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads(proc.stdout)
    assert run["state"] == "proposed" and [w["path"] for w in run["withheld"]] == [".env"]
    log = (state_dir.glob(f"*/runs/{run['id']}/output.log")).__next__().read_text()
    assert log.count("[REDACTED]") >= 8  # every echo was there, masked
    for argv in (["show", run["id"]], ["audit"], ["audit", "--verify"], ["diff", run["id"]]):
        assert _cli(ws, out, "--json", *argv).returncode == 0
        assert _cli(ws, out, *argv).returncode == 0
    # errors that echo a secret back
    assert _cli(ws, out, "show", token).returncode != 0
    assert _cli(ws, out, "--json", "approve", run["id"], "--path", env_value).returncode != 0
    assert _cli(ws, out, "run", "--agent", env_token, "x").returncode != 0
    assert _cli(ws, out, "reject", run["id"]).returncode == 0
    # a background run: its own process stages, runs and writes daemon.log
    proc = _cli(ws, out, "--json", "run", "--agent", "bot", f'{_split(env_token)}; echo "$S"; echo "$S" >&2')
    bg = json.loads(proc.stdout)["id"]
    deadline = time.time() + 90
    while time.time() < deadline:
        state = json.loads(_cli(ws, out, "--json", "show", bg).stdout)["state"]
        if state not in ("admitted", "staging", "running", "inspecting"):
            break
        time.sleep(0.5)
    assert state in ("applied", "rejected", "proposed"), state
    assert _cli(ws, out, "audit", "--verify").returncode == 0

    written = [p for p in state_dir.rglob("*")]
    for name, secret in secrets.items():
        for p in written:
            assert secret not in str(p), (name, p)
            if p.is_file() and not p.is_symlink():
                assert secret.encode() not in p.read_bytes(), (name, p)
        for i, text in enumerate(out):
            assert secret not in text, (name, i, text[:2000])
