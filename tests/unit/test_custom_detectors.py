"""A workspace's own detectors ([[withhold.custom]]): validated, used by staging and by the
service's Redactor; no workspace file removes, replaces or turns off a built-in detector."""

from __future__ import annotations

from pathlib import Path

import pytest

from airlockd.errors import PolicyError
from airlockd.policy import Level, load_policy
from airlockd.redact import MASK
from airlockd.runs.service import Service
from airlockd.staging.copy import stage

ACME = "acme_" + "Q7x" * 10 + "Zp"  # 32 characters after the prefix
CUSTOM = '[[withhold.custom]]\nname = "acme-token"\nregex = "acme_[A-Za-z0-9]{32}"\nmin_entropy = 2.0\n'


def _ws(tmp_path: Path, policy: str) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "policies.toml").write_text(policy)
    return ws


def test_a_custom_detector_withholds_and_masks(tmp_path: Path) -> None:
    ws = _ws(tmp_path, CUSTOM)
    (ws / "notes.txt").write_text(f"key {ACME}\n")
    (ws / "low.txt").write_text("acme_" + "a" * 32 + "\n")  # below the entropy floor
    policy = load_policy(ws).policy
    res = stage(ws, tmp_path / "copy", policy, Level.INTERNAL)
    assert [(w.path, w.rule) for w in res.withheld] == [("notes.txt", "detector:acme-token")]
    assert (tmp_path / "copy" / "low.txt").exists()
    svc = Service(ws)
    assert ACME not in svc.redactor.text(f"agent said {ACME}") and MASK in svc.redactor.text(ACME)


def test_a_custom_detector_without_a_prefix_uses_its_keywords(tmp_path: Path) -> None:
    ws = _ws(tmp_path, '[[withhold.custom]]\nname = "x"\nregex = "(?:foo|bar)key-[0-9]{6}"\nkeywords = ["KEY-"]\n')
    (ws / "a.txt").write_text("barkey-123456\n")
    res = stage(ws, tmp_path / "copy", load_policy(ws).policy, Level.INTERNAL)
    assert [w.rule for w in res.withheld] == ["detector:x"]


def test_a_workspace_cannot_remove_a_default_detector(tmp_path: Path) -> None:
    default = load_policy(tmp_path / "none").policy.withhold.detectors
    ws = _ws(tmp_path, "[withhold]\ndetectors = []\n")
    assert load_policy(ws).policy.withhold.detectors == default


@pytest.mark.parametrize(
    ("custom", "says"),
    [
        ('name = "jwt"\nregex = "x{3}"', "built-in"),
        ('name = "private-key-der"\nregex = "x{3}"', "built-in"),
        ('name = "a"\nregex = "("', "not a regular expression"),
        ('name = "a"\nregex = "(a+)+b"', "exponential"),
        ('name = "a"\nregex = "a*"', "empty string"),
        ('name = "a"\nregex = "ab{3}"\nmin_entropy = 9', "min_entropy"),
    ],
)
def test_bad_custom_detectors_are_refused_naming_file_and_key(tmp_path: Path, custom: str, says: str) -> None:
    ws = _ws(tmp_path, f"[[withhold.custom]]\n{custom}\n")
    with pytest.raises(PolicyError) as err:
        load_policy(ws)
    assert "policies.toml" in err.value.message and "withhold.custom" in err.value.message
    assert says in err.value.message


def test_two_custom_detectors_of_one_name_are_refused(tmp_path: Path) -> None:
    ws = _ws(tmp_path, CUSTOM + CUSTOM.replace("{32}", "{40}"))
    with pytest.raises(PolicyError, match="given twice"):
        load_policy(ws)
