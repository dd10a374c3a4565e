from __future__ import annotations

from pathlib import Path

import pytest

from airlockd.errors import PolicyError
from airlockd.policy import Decision, Level, Mode, load_policy


def write(ws: Path, text: str) -> Path:
    (ws / "policies.toml").write_text(text)
    return ws / "policies.toml"


def test_default_policy_loads_with_commented_defaults(tmp_path: Path) -> None:
    lp = load_policy(tmp_path)
    p = lp.policy
    assert p.defaults.mode is Mode.REVIEW
    assert ".env" in p.withhold.patterns and ".ssh/" in p.withhold.patterns
    assert "AGENTS.md" in p.defaults.protected_files
    assert len(lp.revision) == 16 and len(lp.sources) == 1


def test_workspace_overrides_merge_key_by_key(tmp_path: Path) -> None:
    write(
        tmp_path,
        """
[defaults]
mode = "auto"
[agents.bot]
command = ["python3", "bot.py"]
[agents.bot.limits]
memory_mb = 64
[[rules]]
match = ["*.py"]
action = "deny"
reason = "no python here"
[withhold]
patterns = ["private/"]
""",
    )
    lp = load_policy(tmp_path)
    p = lp.policy
    assert p.defaults.mode is Mode.AUTO
    assert p.defaults.max_file_bytes == 5_000_000  # untouched keys keep the default
    bot = p.agent("bot")
    assert bot.limits.memory_mb == 64 and bot.limits.pids == 256  # per-field over [defaults.limits]
    assert p.rules[0].action is Decision.DENY  # workspace rules are checked first
    assert "private/" in p.withhold.patterns and ".env" in p.withhold.patterns  # can add, never remove
    assert len(lp.sources) == 2


def test_workspace_cannot_drop_protected_files(tmp_path: Path) -> None:
    write(tmp_path, '[defaults]\nprotected_files = ["MINE.md"]\n')
    p = load_policy(tmp_path).policy
    assert {"AGENTS.md", "CLAUDE.md", "MINE.md"} <= set(p.defaults.protected_files)


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[defaults]\nmdoe = 'auto'\n", "defaults.mdoe", "remove it or check its spelling"),
        ("[defaults]\nmode = 'yolo'\n", "defaults.mode", "review"),
        ("[defaults.limits]\nmemory_mb = 'lots'\n", "defaults.limits.memory_mb", "integer"),
        ("[defaults.limits]\npids = 0\n", "defaults.limits.pids", "greater than or equal to 8"),
        ("[defaults.limits]\ncpus = 512\n", "defaults.limits.cpus", "this machine has"),
        ("[agents.x]\nadapter = 'command'\n", "agents.x", "needs `command"),
        ("[agents.x]\ncommand = ['run']\nprompt = 'argv'\n", "agents.x", "{prompt}"),
        ("[[rules]]\nmatch = ['*.py']\naction = 'allow'\nreason = 'r'\n", "rules.0.action", "auto"),
        ("[withhold]\ndetectors = ['psychic']\n", "withhold.detectors", "unknown detector"),
        ("[withhold]\npatterns = ['!.env']\n", "withhold.patterns", "never subtract"),
        ("[defaults]\nprotected_files = ['!AGENTS.md']\n", "defaults.protected_files", "never subtract"),
    ],
)
def test_bad_policy_names_file_key_and_fix(tmp_path: Path, text: str, key: str, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as err:
        load_policy(tmp_path)
    msg = str(err.value)
    assert str(path) in msg and f"`{key}" in msg and words in msg


def test_toml_syntax_error_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[defaults\nmode=1\n")
    with pytest.raises(PolicyError, match=str(path)):
        load_policy(tmp_path)


def test_labels_take_the_highest(tmp_path: Path) -> None:
    write(tmp_path, '[labels]\n"docs/" = "public"\n"docs/secret.md" = "secret"\n')
    p = load_policy(tmp_path).policy
    assert p.label_of("docs/readme.md") is Level.PUBLIC
    assert p.label_of("docs/secret.md") is Level.SECRET
    assert p.label_of("src/main.py") is Level.INTERNAL
    assert p.label_of("secrets/db.txt") is Level.SECRET  # from the default policy


def test_revision_changes_with_content(tmp_path: Path) -> None:
    a = load_policy(tmp_path).revision
    write(tmp_path, "[defaults]\nproposal_ttl_s = 60\n")
    assert load_policy(tmp_path).revision != a
