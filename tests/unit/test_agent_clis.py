"""The agent CLI adapters' one shape (agents/claude.py beside agents/codex.py): the command line,
the environment that keeps the CLI quiet and pointed at the gateway, the sessions found in its
home (never through a link), the file airlockd rewrites before every run, the gateway route each
provider gets, and the runtime build's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from airlockd.agents import aider, claude, codex, gemini, opencode, wiring
from airlockd.errors import EngineError
from airlockd.gateway import runs as gateway_runs
from airlockd.policy import AgentConfig, Gateway, load_policy

SID = "0123abcd-0123-4567-89ab-0123456789ab"


def test_claude_runs_headless_with_its_home_and_the_gateway_and_resumes_by_id(tmp_path: Path) -> None:
    cfg = AgentConfig(adapter="claude", command=["--model", "claude-sonnet-5"], env={"A": "1"})
    inv = claude.invocation(cfg, "-rf / is not an option", tmp_path, gateway_runs.ORIGIN, resume=SID)
    assert inv.argv[:2] == ["claude", "-p"] and "--dangerously-skip-permissions" in inv.argv
    assert "--strict-mcp-config" in inv.argv  # no MCP server an agent planted in its home starts
    assert inv.argv[-2:] == ["--", "-rf / is not an option"]  # a prompt is never read as an option
    assert inv.argv[inv.argv.index("--resume") + 1] == SID and "--model" in inv.argv
    assert inv.env["CLAUDE_CONFIG_DIR"] == claude.HOME_IN_CONTAINER and inv.env["A"] == "1"
    assert inv.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8181"  # it appends /v1/messages itself
    assert inv.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert "ANTHROPIC_API_KEY" not in inv.env  # the run's token comes with the gateway, never from here
    assert inv.mounts == [(tmp_path, claude.HOME_IN_CONTAINER, False)] and inv.stdin_file is None
    assert "--resume" not in claude.invocation(cfg, "p", tmp_path, gateway_runs.ORIGIN).argv


def test_claude_settings_are_rewritten_and_a_link_in_their_place_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.json"
    victim.write_text('{"hooks": "host file"}\n')
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").symlink_to(victim)
    claude.invocation(AgentConfig(adapter="claude"), "p", home, gateway_runs.ORIGIN)
    assert victim.read_text() == '{"hooks": "host file"}\n'
    assert not (home / "settings.json").is_symlink() and (home / "settings.json").read_text() == claude.SETTINGS
    (home / "settings.json").unlink()
    (home / "settings.json").mkdir()  # a directory an agent made there goes too
    (home / "settings.json" / "x").write_text("x")
    claude.invocation(AgentConfig(adapter="claude"), "p", home, gateway_runs.ORIGIN)
    assert (home / "settings.json").read_text() == claude.SETTINGS


def test_claude_sessions_are_one_level_under_projects_and_never_through_a_link(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "projects" / "-workspace").mkdir(parents=True)
    (home / "projects" / "-workspace" / f"{SID}.jsonl").write_text("{}\n")
    (home / "projects" / "-workspace" / "notes.jsonl").write_text("{}\n")
    elsewhere = tmp_path / "host"
    elsewhere.mkdir()
    other = "ffffffff-ffff-ffff-ffff-ffffffffffff"
    (elsewhere / f"{other}.jsonl").write_text("{}\n")
    (home / "projects" / "linked").symlink_to(elsewhere)
    (home / "projects" / "-workspace" / f"{'e' * 8}-eeee-eeee-eeee-{'e' * 12}.jsonl").symlink_to(
        elsewhere / f"{other}.jsonl"
    )
    assert set(claude.sessions(home)) == {SID}
    (home / "projects").rename(tmp_path / "real-projects")
    (home / "projects").symlink_to(tmp_path / "real-projects")
    assert claude.sessions(home) == {}


def test_a_follow_up_resumes_only_a_session_still_in_the_home(tmp_path: Path) -> None:
    home, prev = tmp_path / "home", tmp_path / "prev"
    (home / "projects" / "-workspace").mkdir(parents=True)
    prev.mkdir()
    (prev / wiring.SESSION_FILE).write_text(f'{{"session": "{SID}"}}')
    assert wiring.resumable(claude, home, prev) is None  # rolled back: a fresh session
    (home / "projects" / "-workspace" / f"{SID}.jsonl").write_text("{}\n")
    assert wiring.resumable(claude, home, prev) == SID
    assert wiring.resumable(codex, home, prev) is None  # another CLI's home has no such session


def test_each_agent_cli_gets_its_providers_route(tmp_path: Path) -> None:
    policy = load_policy(tmp_path).policy  # the shipped policy: [gateway] for OpenAI, a table for Anthropic
    assert policy.gateway.route_for(None) is policy.gateway
    assert policy.gateway.route_for(codex.PROVIDER) is policy.gateway
    anthropic = policy.gateway.route_for(claude.PROVIDER)
    assert anthropic is not None and anthropic.provider == "anthropic"
    assert anthropic.upstream == "https://api.anthropic.com" and anthropic.key_env == "ANTHROPIC_API_KEY"
    assert anthropic.allowed == ["POST /v1/messages"]

    (tmp_path / "policies.toml").write_text(
        '[gateway.providers.anthropic]\nupstream = "http://127.0.0.1:9"\nkey_file = "~/.anthropic-key"\n'
    )
    anthropic = load_policy(tmp_path).policy.gateway.route_for("anthropic")
    assert anthropic is not None and anthropic.upstream == "http://127.0.0.1:9"  # the rest as shipped
    assert anthropic.key_file == "~/.anthropic-key" and anthropic.allowed == ["POST /v1/messages"]

    only_openai = Gateway()
    assert only_openai.route_for("anthropic") is None  # open_for_run says what to add
    generic = Gateway(provider="generic")
    assert generic.route_for("anthropic") is generic and generic.route_for("openai") is generic
    assert Gateway(provider="anthropic").route_for("anthropic") is not None


def test_a_provider_table_cannot_claim_another_provider(tmp_path: Path) -> None:
    from airlockd.errors import PolicyError

    (tmp_path / "policies.toml").write_text('[gateway.providers.anthropic]\nprovider = "openai"\n')
    with pytest.raises(PolicyError, match="provider"):
        load_policy(tmp_path)


def test_the_runtime_build_refuses_an_unknown_agent_before_asking_the_engine() -> None:
    from airlockd.runs.runtime import build
    from airlockd.sandbox.image import AGENT_CLIS, agent_image_tag, image_tag

    with pytest.raises(EngineError, match="no agent CLI named 'goose'"):
        build(agents=["claude", "goose"], progress=lambda m: None)
    assert set(AGENT_CLIS) == {"codex", "claude", "opencode", "gemini", "aider"}
    assert agent_image_tag("claude") == f"{image_tag()}-claude-{AGENT_CLIS['claude'].version}"


def _opencode_db(home: Path, *ids: str, schema: str = "CREATE TABLE session (id TEXT, directory TEXT)") -> Path:
    import sqlite3

    db = home.joinpath(*opencode.DB)
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode = WAL")  # as opencode keeps it: the newest rows in the -wal file
    con.execute(schema)
    if ids:
        con.executemany("INSERT INTO session (id) VALUES (?)", [(i,) for i in ids])
    con.commit()
    return db  # left open: what a crashed agent leaves (the WAL not checkpointed)


def test_opencode_gets_its_whole_config_from_the_environment_and_the_model_from_the_policy(tmp_path: Path) -> None:
    import json

    cfg = AgentConfig(adapter="opencode", command=["--model", "airlock/mock-model", "--variant", "high"])
    inv = opencode.invocation(cfg, "--help", tmp_path, gateway_runs.BASE_URL, resume="ses_abcdefgh12345678")
    assert inv.argv[:4] == ["opencode", "run", "--format", "json"] and "--auto" in inv.argv
    assert inv.argv[-2:] == ["--", "--help"] and inv.argv[inv.argv.index("-m") + 1] == "airlock/mock-model"
    assert inv.argv[inv.argv.index("--session") + 1] == "ses_abcdefgh12345678" and "--variant" in inv.argv
    doc = json.loads(inv.env["OPENCODE_CONFIG_CONTENT"])
    provider = doc["provider"]["airlock"]
    assert provider["options"] == {"baseURL": "http://127.0.0.1:8181/v1", "apiKey": "{env:AIRLOCK_RUN_TOKEN}"}
    assert doc["model"] == doc["small_model"] == "airlock/mock-model" and list(provider["models"]) == ["mock-model"]
    assert doc["share"] == "disabled" and doc["autoupdate"] is False
    assert inv.env["XDG_DATA_HOME"] == opencode.HOME_IN_CONTAINER and inv.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    plain = opencode.invocation(AgentConfig(adapter="opencode"), "p", tmp_path, gateway_runs.BASE_URL)
    assert "--session" not in plain.argv and plain.argv[plain.argv.index("-m") + 1] == "airlock/gpt-5"


def test_opencode_sessions_are_read_from_a_copy_of_its_database(tmp_path: Path) -> None:
    home = tmp_path / "home"
    db = _opencode_db(home, "ses_aaaaaaaaaaaa1111", "ses_bbbbbbbbbbbb2222", "not-a-session-id")
    before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in db.parent.iterdir()}
    assert set(opencode.sessions(home)) == {"ses_aaaaaaaaaaaa1111", "ses_bbbbbbbbbbbb2222"}
    assert {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in db.parent.iterdir()} == before  # untouched
    assert opencode.sessions(tmp_path / "nothing") == {}


def test_a_hostile_opencode_database_yields_nothing_and_never_hangs_the_reader(tmp_path: Path) -> None:
    import os
    import sqlite3
    import time

    victim = tmp_path / "victim.db"
    _opencode_db(tmp_path / "elsewhere", "ses_cccccccccccc3333").rename(victim)
    home = tmp_path / "home"
    (home / "opencode").mkdir(parents=True)
    (home / "opencode" / "opencode.db").symlink_to(victim)  # never followed
    assert opencode.sessions(home) == {}

    slow = tmp_path / "slow"
    endless = (
        "CREATE VIEW session AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)"
        " SELECT 'ses_' || printf('%016d', i) AS id FROM n WHERE i < 0"
    )
    _opencode_db(slow, schema=endless)
    t0 = time.monotonic()
    assert opencode.sessions(slow) == {}  # the step budget ends it
    assert time.monotonic() - t0 < 10

    garbage = tmp_path / "garbage"
    (garbage / "opencode").mkdir(parents=True)
    (garbage / "opencode" / "opencode.db").write_bytes(b"SQLite format 3\0" + b"\xff" * 8192)
    assert opencode.sessions(garbage) == {}

    # a link in place of its folder is never followed, to a database elsewhere on the host
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "opencode").symlink_to(tmp_path / "elsewhere" / "opencode")
    (tmp_path / "elsewhere" / "opencode" / "opencode.db").write_bytes(victim.read_bytes())
    assert opencode.sessions(linked) == {}

    # a fifo in place of its write-ahead log never blocks the read
    fifo = tmp_path / "fifo"
    _opencode_db(fifo, "ses_dddddddddddd4444")
    (fifo / "opencode" / "opencode.db-wal").unlink(missing_ok=True)
    os.mkfifo(fifo / "opencode" / "opencode.db-wal")
    t0 = time.monotonic()
    opencode.sessions(fifo)
    assert time.monotonic() - t0 < 5

    # a sparse file costs the home nothing: it is not copied
    sparse = tmp_path / "sparse"
    (sparse / "opencode").mkdir(parents=True)
    with open(sparse / "opencode" / "opencode.db", "wb") as fh:
        fh.truncate(200 * 2**20)
    assert opencode.sessions(sparse) == {}

    # a column computed at every read, built to be slow: the reader's own CPU limit ends it
    heavy = tmp_path / "heavy"
    pattern = "printf('%.*c', 900000, 'a') LIKE '%' || printf('%.*c', 40000, 'a') || 'b'"
    db = _opencode_db(heavy, schema="CREATE TABLE session (x INT)")
    with sqlite3.connect(db) as con:  # rows first, then the column (computed only when read)
        con.executemany("INSERT INTO session (x) VALUES (?)", [(i,) for i in range(5)])
        con.execute(f"ALTER TABLE session ADD COLUMN id TEXT GENERATED ALWAYS AS (CASE WHEN {pattern} THEN 'x' END)")
    t0 = time.monotonic()
    assert opencode.sessions(heavy) == {}
    assert time.monotonic() - t0 < opencode.READ_S + 2


def test_gemini_runs_headless_with_its_settings_written_afresh_never_through_a_link(tmp_path: Path) -> None:
    import json

    home = tmp_path / "home"
    home.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "settings.json").write_text('{"host": true}\n')
    (home / ".gemini").symlink_to(victim)  # an agent's link where the settings folder was
    cfg = AgentConfig(adapter="gemini", command=["-m", "gemini-3-pro", "--debug"])
    inv = gemini.invocation(cfg, "--yolo=false; rm -rf /", home, gateway_runs.ORIGIN, resume=SID)
    assert (victim / "settings.json").read_text() == '{"host": true}\n' and not (home / ".gemini").is_symlink()
    settings = json.loads((home / ".gemini" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert inv.argv[-1] == "--prompt=--yolo=false; rm -rf /"  # one word, whatever it holds
    assert inv.argv[inv.argv.index("--model") + 1] == "gemini-3-pro" and "--debug" in inv.argv
    assert inv.argv[inv.argv.index("--resume") + 1] == SID and "--yolo" in inv.argv and "--skip-trust" in inv.argv
    assert inv.env["HOME"] == gemini.HOME_IN_CONTAINER and inv.env["GOOGLE_GEMINI_BASE_URL"] == gateway_runs.ORIGIN
    plain = gemini.invocation(AgentConfig(adapter="gemini"), "p", home, gateway_runs.ORIGIN)
    assert plain.argv[plain.argv.index("--model") + 1] == gemini.DEFAULT_MODEL and "--resume" not in plain.argv


def test_gemini_sessions_are_named_by_their_first_line_and_never_found_through_a_link(tmp_path: Path) -> None:
    home = tmp_path / "home"
    chats = home / ".gemini" / "tmp" / "workspace" / "chats"
    chats.mkdir(parents=True)
    (chats / "session-2026-12-06T03-59-01234abc.jsonl").write_text(f'{{"sessionId": "{SID}"}}\n{{"$set": {{}}}}\n')
    (chats / "session-2026-12-06T04-00-ffffffff.jsonl").write_text('{"sessionId": "../../etc"}\n')
    (chats / "session-2026-12-06T04-01-eeeeeeee.jsonl").write_bytes(b"x" * 100_000)  # no line: nothing
    elsewhere = tmp_path / "host"
    elsewhere.mkdir()
    other = "ffffffff-ffff-ffff-ffff-ffffffffffff"
    (elsewhere / "session-x.jsonl").write_text(f'{{"sessionId": "{other}"}}\n')
    (home / ".gemini" / "tmp" / "linked").mkdir()
    (home / ".gemini" / "tmp" / "linked" / "chats").symlink_to(elsewhere)
    (chats / "session-2026-12-06T04-02-aaaaaaaa.jsonl").symlink_to(elsewhere / "session-x.jsonl")
    assert set(gemini.sessions(home)) == {SID}


def test_a_gemini_route_allows_its_models_by_name_and_nothing_around_them() -> None:
    from airlockd.gateway.server import Route

    route = Route.from_policy(
        Gateway(
            provider="gemini",
            key_env=None,
            key_file=None,
            allowed=["POST /v1beta/models/*:streamGenerateContent", "POST /v1beta/models/*:generateContent"],
        ).model_copy(update={"key_env": "PATH"})
    )
    assert route.allows("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent")
    assert route.allows("POST", "/v1beta/models/gemini-3.0-pro-preview_1:generateContent")
    assert not route.allows("GET", "/v1beta/models/gemini-2.5-flash:generateContent")
    assert route.knows("/v1beta/models/gemini-2.5-flash:generateContent")  # a 405, not a 404
    for path in (
        "/v1beta/models/a/b:generateContent",
        "/v1beta/models/..:generateContent",
        "/v1beta/models/%2e%2e:generateContent",
        "/v1beta/models/:generateContent",
        "/v1beta/models/x:generateContentX",
        "/v1beta/files/x:generateContent",
        "/v1beta/models/x:countTokens",
    ):
        assert not route.allows("POST", path), path


def test_aider_keeps_its_history_in_its_home_and_its_model_metadata_is_written_afresh(tmp_path: Path) -> None:
    import json

    home = tmp_path / "home"
    home.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text("host\n")
    (home / aider.METADATA).symlink_to(victim)
    (home / aider.CHATS).symlink_to(tmp_path)  # an agent's link where its chats were
    cfg = AgentConfig(adapter="aider", command=["--model", "openai/gpt-5-mini", "--edit-format", "diff"])
    inv = aider.invocation(cfg, "--yes-always; /run rm -rf /", home, gateway_runs.BASE_URL)
    assert victim.read_text() == "host\n" and not (home / aider.CHATS).is_symlink() and (home / aider.CHATS).is_dir()
    meta = json.loads((home / aider.METADATA).read_text())
    assert list(meta) == ["openai/gpt-5-mini"] and meta["openai/gpt-5-mini"]["litellm_provider"] == "openai"
    assert inv.argv[-1] == "--message=--yes-always; /run rm -rf /"  # one word, whatever it holds
    assert inv.argv[inv.argv.index("--model") + 1] == "openai/gpt-5-mini" and "--edit-format" in inv.argv
    history = inv.argv[inv.argv.index("--chat-history-file") + 1]
    assert history.startswith(f"{aider.HOME_IN_CONTAINER}/chats/") and "--restore-chat-history" not in inv.argv
    assert {"--no-git", "--no-check-update", "--analytics-disable", "--yes-always"} <= set(inv.argv)
    assert inv.env["OPENAI_API_BASE"] == gateway_runs.BASE_URL and inv.env["HOME"] == aider.HOME_IN_CONTAINER
    assert "PYTHONPATH" not in inv.env
    sid = "ab" * 16
    (home / aider.CHATS / f"{sid}.md").write_text("# aider chat\n")
    (home / aider.CHATS / "notes.md").write_text("x\n")
    (home / aider.CHATS / f"{'cd' * 16}.md").symlink_to(victim)
    assert set(aider.sessions(home)) == {sid}
    again = aider.invocation(cfg, "more", home, gateway_runs.BASE_URL, resume=sid)
    assert again.argv[again.argv.index("--chat-history-file") + 1] == f"{aider.HOME_IN_CONTAINER}/chats/{sid}.md"
    assert "--restore-chat-history" in again.argv


def test_undoing_an_applied_run_rolls_its_conversation_back_when_no_later_run_continued_it(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from airlockd.agents import sessions
    from airlockd.records import RunState

    events: list[tuple[str, dict[str, object]]] = []
    svc = SimpleNamespace(
        state=SimpleNamespace(root=tmp_path, run_dir=lambda run_id: tmp_path / "runs" / run_id),
        audit=SimpleNamespace(append=lambda kind, **data: events.append((kind, data))),
    )
    home = sessions.home(tmp_path, "claude", None)
    (home / "turns").write_text("before\n")

    def run(run_id: str, turn: str) -> SimpleNamespace:
        rec = SimpleNamespace(id=run_id, agent="claude", policy_revision="p")
        svc.state.run_dir(run_id).mkdir(parents=True)
        sessions.snapshot(tmp_path, rec, svc.state.run_dir(run_id))
        (home / "turns").write_text(turn)
        return rec

    r1 = run("r1", "after r1\n")
    sessions.settle(svc, r1, RunState.APPLIED)
    assert (home / "turns").read_text() == "after r1\n" and events[-1][0] == "session.committed"
    sessions.settle(svc, r1, RunState.UNDONE)
    assert (home / "turns").read_text() == "before\n"
    assert events[-1][0] == "session.rolled_back" and events[-1][1]["to_state"] == "undone"
    assert not (svc.state.run_dir("r1") / sessions.APPLIED).exists()

    r2 = run("r2", "after r2\n")
    sessions.settle(svc, r2, RunState.APPLIED)
    run("r3", "after r3\n")  # continued from r2's conversation
    sessions.settle(svc, r2, RunState.UNDONE)
    assert (home / "turns").read_text() == "after r3\n"  # r3's turns are not erased
    assert events[-1][0] == "session.rollback_skipped" and "r3" in str(events[-1][1]["why"])
