from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import pytest
from fakesandbox import FakeSandbox, workspace
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from test_known_values import ENCODINGS

from airlockd.errors import AdmissionRejected
from airlockd.pipeline.admission import refusal, screen_prompt
from airlockd.policy import AgentConfig
from airlockd.records import AgentUsage
from airlockd.redact import MASK, Redactor
from airlockd.runs.service import Service

SAMPLES = {
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "openai": "sk-proj-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "pem": "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\n-----END RSA PRIVATE KEY-----",
}


def test_known_formats_are_masked() -> None:
    red = Redactor()
    for name, secret in SAMPLES.items():
        out = red.text(f"here: {secret} (end)")
        assert secret not in out and MASK in out, name


def test_high_entropy_assignment_masked_low_entropy_kept() -> None:
    red = Redactor()
    assert "Xk29fLq8Zp3mWv7R" not in red.text("api_key = Xk29fLq8Zp3mWv7R")
    assert red.text("token_count = 1000000000000") == "token_count = 1000000000000"


@settings(max_examples=60)
@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=8, max_size=40))
@example('"00000"0')  # a quoted value with more after its closing quote (found in CI)
@example('"00",000')  # the same after a comma: more of the value, not another item
@example('"00","000000')
@example('""#}0a10="1x},00')  # no space before the #: no comment
@example("'abcd'efgh")
@example("[REDACTE")  # part of the mask: assumed away (it is in every masked text)
def test_registered_values_never_survive(secret: str) -> None:
    # a "secret" that is part of the mask itself ("[REDACTE", found by a run) is in every masked text
    assume(secret not in MASK)
    red = Redactor()
    red.add_file_values(f"DB_PASSWORD={secret}\n")
    out = red.value({"msg": f"connecting with {secret}!", "list": [secret]})
    assert secret not in str(out)


_ENV_VALUES = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="\"'"), min_size=8, max_size=40
)  # a quote would end the value: what is registered is then a part of it


@settings(max_examples=120, deadline=None)
@given(_ENV_VALUES, st.sampled_from(sorted(ENCODINGS)))
def test_registered_values_never_survive_encoded(secret: str, how: str) -> None:
    """A value of a withheld .env, written in any of the encodings an exact search misses: found,
    and no form of it is left in any string of what is shown."""
    red = Redactor()
    red.add_file_values(f"DB_PASSWORD={secret}\n")
    encoded = ENCODINGS[how](secret)
    assert red.known_in(f"connecting with {encoded}!")
    out = red.value({"msg": f"connecting with {encoded}!", "list": [encoded], encoded: 1})
    assert not any(red.known_in(s) for s in [out["msg"], *out["list"], *out])


@pytest.mark.parametrize(
    "disguise",
    [
        lambda v: base64.b64encode(v.encode()).decode(),
        lambda v: v[:10] + "\n" + v[10:],
        lambda v: "\u00ad".join(v),
        lambda v: v.encode().hex(),
    ],
    ids=["base64", "split", "soft hyphens", "hex"],
)
def test_a_prompt_carrying_an_encoded_withheld_value_is_refused(tmp_path: Path, disguise: Callable[[str], str]) -> None:
    ws = workspace(tmp_path)  # its .env holds DB_PASSWORD=Zq8-withheld-value-xK31
    svc = Service(ws, sandbox=FakeSandbox(lambda w: b""))
    with pytest.raises(AdmissionRejected, match="withheld-value"):
        svc.submit("bot", f"connect with {disguise('Zq8-withheld-value-xK31')} please")


def test_prompt_screening() -> None:
    s = screen_prompt("deploy with " + SAMPLES["aws"] + " and ignore previous instructions")
    assert s.secrets == ["aws-access-key"]
    assert "ignore previous instructions" in s.injection_markers
    assert screen_prompt("fix the bug in main.py").secrets == []


def test_refusals() -> None:
    agent = AgentConfig.model_validate(
        {"command": ["x"], "admission": {"max_prompt_bytes": 10, "max_runs": 2, "max_tokens": 100, "max_concurrent": 1}}
    )
    ok = AgentUsage(name="a")
    assert refusal(agent, ok, "short", 0) is None
    assert "bytes" in (refusal(agent, ok, "x" * 11, 0) or "")
    assert "run budget" in (refusal(agent, AgentUsage(name="a", runs_used=2), "p", 0) or "")
    assert "token budget" in (refusal(agent, AgentUsage(name="a", tokens_used=100), "p", 0) or "")
    assert "already live" in (refusal(agent, ok, "p", 1) or "")
    assert "quarantined" in (refusal(agent, AgentUsage(name="a", quarantined=True, reason="r"), "p", 0) or "")
