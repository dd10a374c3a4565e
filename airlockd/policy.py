"""policies.toml -> validated, merged policy models.

The default policy ships with airlockd; a workspace's own `policies.toml` is merged over it.
Validation errors name the file, the key, what is wrong and how to fix it. Built-in invariants are
not here (see `pipeline.classify`): no file can weaken them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pathspec
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from airlockd.errors import PolicyError
from airlockd.hostallow import HostEntry, parse_entry
from airlockd.pathmatch import AnyPattern, gitignore_spec, matcher, withhold_matcher
from airlockd.resources import resource

if TYPE_CHECKING:
    from airlockd.redact import ExtraDetector

POLICY_FILE = "policies.toml"


class Mode(StrEnum):
    REVIEW = "review"
    AUTO = "auto"


class Decision(StrEnum):
    AUTO = "auto"
    REVIEW = "review"
    DENY = "deny"

    @property
    def rank(self) -> int:
        return _DECISION_RANK[self]


_DECISION_RANK = {Decision.AUTO: 0, Decision.REVIEW: 1, Decision.DENY: 2}


class Level(StrEnum):
    PUBLIC = "public"
    INTERNAL = "internal"
    CONFIDENTIAL = "confidential"
    SECRET = "secret"

    @property
    def rank(self) -> int:
        return list(Level).index(self)


def _check_patterns(patterns: list[str]) -> list[str]:
    for p in patterns:
        if not p.strip():
            raise ValueError("empty pattern; remove it")
        if (why := _pattern_error(p)) is not None:
            raise ValueError(f"{p!r} is not a gitignore-style pattern: {why}")
    return patterns


@lru_cache(maxsize=8192)
def _pattern_error(pattern: str) -> str | None:
    """Why pathspec refuses `pattern`, or None. Kept per pattern: a policy has hundreds (the
    default withhold list), and a run's process forked by the launcher, which loaded the policy
    once, then checks them for nothing (runs/launcher.py)."""
    try:
        gitignore_spec([pattern])
    except Exception as exc:  # pathspec raises several types for a bad pattern
        return str(exc)
    return None


Patterns = Annotated[list[str], AfterValidator(_check_patterns)]


def _no_negation(patterns: list[str]) -> list[str]:
    bad = [p for p in patterns if p.lstrip().startswith("!")]
    if bad:
        raise ValueError(
            f"{bad} would un-withhold or un-protect files; a policy can add to these lists, never subtract"
        )
    return patterns


# Withheld and protected lists only ever grow: a "!pattern" would re-include what a default keeps out.
FloorPatterns = Annotated[list[str], AfterValidator(_check_patterns), AfterValidator(_no_negation)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Model):
    wall_time_s: float = Field(900, gt=0, le=7 * 24 * 3600)
    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(1024, ge=16)
    pids: int = Field(256, ge=8)
    output_bytes: int = Field(10_000_000, ge=1024)
    tmpfs_mb: int = Field(256, ge=1)
    workspace_growth_mb: int = Field(512, ge=1)
    grace_s: float = Field(10, ge=0, le=600)
    # what inspection reads of the agent's change set before it stops (staging/bounds.py)
    changed_files: int = Field(10_000, ge=1)  # entries created or modified, directories included
    change_depth: int = Field(100, ge=2)  # path components of a path the base does not have
    changed_mb: int = Field(1024, ge=1)  # bytes of changed files, by allocated blocks

    @field_validator("cpus")
    @classmethod
    def _cpus_fit(cls, v: float) -> float:
        cores = os.cpu_count() or 1
        if v > cores:
            raise ValueError(f"{v} cores asked but this machine has {cores}; use at most {cores}")
        return v


class Admission(_Model):
    max_prompt_bytes: int = Field(32_768, ge=0)
    max_runs: int = Field(0, ge=0)
    max_tokens: int = Field(0, ge=0)
    max_concurrent: int = Field(2, ge=0)
    quarantine_after: int = Field(3, ge=1)
    prompt_secrets: Literal["reject", "redact"] = "reject"  # a secret found in a prompt


#: The container runtimes an agent may ask for: the engine's default `runc`, or gVisor's `runsc`
#: (a kernel of its own between the agent and the host's; docs/containment.md).
Runtime = Literal["runc", "runsc"]


class Defaults(_Model):
    mode: Mode = Mode.REVIEW
    runtime: Runtime = "runc"
    clearance: Level = Level.INTERNAL
    proposal_ttl_s: float = Field(86400, gt=0)
    max_file_bytes: int = Field(5_000_000, ge=1)
    protected_files: FloorPatterns = Field(default_factory=list)
    limits: Limits = Limits()
    admission: Admission = Admission()


class Broker(_Model):
    """`[broker]`: the hosts a run may open HTTPS tunnels to (package registries), through the
    gateway's socket (gateway/broker.py), and the caps of one run's tunnels. An agent's own
    `[agents.NAME.broker]` replaces what it sets. No entry in `allow`: no tunnel at all."""

    allow: list[str] = Field(default_factory=list)
    max_bytes: int = Field(2 * 1024**3, ge=0)  # both ways, all the run's tunnels together
    max_connections: int = Field(1000, ge=1)  # tunnels opened over the whole run
    concurrent: int = Field(16, ge=1, le=64)  # tunnels open at once
    idle_timeout_s: float = Field(120, gt=0)  # a tunnel with no byte either way for this long ends
    connect_timeout_s: float = Field(15, gt=0)  # resolving and connecting to the host

    @field_validator("allow")
    @classmethod
    def _entries(cls, v: list[str]) -> list[str]:
        for entry in v:
            parse_entry(entry)  # ValueError says which entry and why
        return v

    @cached_property
    def entries(self) -> tuple[HostEntry, ...]:
        return tuple(parse_entry(e) for e in self.allow)


class AgentBroker(_Model):
    """`[agents.NAME.broker]`: what this agent's runs get instead of `[broker]`'s own."""

    allow: list[str] | None = None
    max_bytes: int | None = Field(None, ge=0)
    max_connections: int | None = Field(None, ge=1)
    concurrent: int | None = Field(None, ge=1, le=64)
    idle_timeout_s: float | None = Field(None, gt=0)
    connect_timeout_s: float | None = Field(None, gt=0)

    @field_validator("allow")
    @classmethod
    def _entries(cls, v: list[str] | None) -> list[str] | None:
        for entry in v or []:
            parse_entry(entry)
        return v


class AgentConfig(_Model):
    adapter: Literal["command", "codex", "claude", "opencode", "gemini", "aider"] = "command"
    command: list[str] = Field(default_factory=list)
    prompt: Literal["stdin", "argv"] = "stdin"
    # an image tag, or the project's own: "devcontainer", "./path/Dockerfile" (docs/broker.md)
    image: str | None = None
    # the network of a project image's build (its RUN steps): none, or the engine's default; the
    # agent's container has none either way. A build runs the project's files: with a network, what
    # an agent wrote and a person approved runs there with it.
    build_network: Literal["none", "default"] = "none"
    runtime: Runtime | None = None  # None: `[defaults] runtime`
    mode: Mode | None = None
    clearance: Level | None = None
    network: Literal["none", "gateway"] = "none"
    broker: AgentBroker = AgentBroker()
    env: dict[str, str] = Field(default_factory=dict)
    limits: Limits = Limits()
    admission: Admission = Admission()

    @model_validator(mode="after")
    def _command_fits_adapter(self) -> AgentConfig:
        if self.adapter == "command" and not self.command:
            raise ValueError('adapter "command" needs `command = ["program", "arg", ...]`')
        if self.prompt == "argv" and not any("{prompt}" in a for a in self.command):
            raise ValueError('prompt = "argv" needs a "{prompt}" placeholder in `command`')
        return self


def _backtracks(items: Any, under_repeat: bool = False) -> str | None:
    """Why this parsed regex could backtrack without bound (a repeat inside a repeat, an
    alternation inside a repeat, a backreference), or None."""
    from re import _constants as c  # type: ignore[attr-defined]

    for op, arg in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            lo, hi, body = arg
            if under_repeat and hi != lo:
                return "a repeated group holds another repeat"
            reason = _backtracks(body, under_repeat or hi > 1)
            if reason:
                return reason
        elif op is c.BRANCH:
            if under_repeat:
                return "a repeated group holds an alternation"
            for alt in arg[1]:
                reason = _backtracks(alt, under_repeat)
                if reason:
                    return reason
        elif op is c.SUBPATTERN:
            reason = _backtracks(arg[3], under_repeat)
            if reason:
                return reason
        elif op in (c.ASSERT, c.ASSERT_NOT):
            reason = _backtracks(arg[1], under_repeat)
            if reason:
                return reason
        elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
            return "a backreference"
    return None


class CustomDetector(_Model):
    """A content detector a workspace adds (`[[withhold.custom]]`); it adds to the built-in
    ones, never replaces or turns one off."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    regex: str = Field(min_length=1, max_length=1000)
    min_entropy: float = Field(0.0, ge=0.0, le=8.0)  # bits per character of what the regex finds
    # one of them is in every match (any case); bounded: each is searched for in every file
    keywords: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("name")
    @classmethod
    def _not_builtin(cls, v: str) -> str:
        from airlockd.redact import known_detectors

        if v in known_detectors():
            raise ValueError(f"{v!r} is a built-in detector's name (a built-in cannot be replaced); name it otherwise")
        return v

    @field_validator("regex")
    @classmethod
    def _linear_regex(cls, v: str) -> str:
        import re
        from re import _parser  # type: ignore[attr-defined]

        try:
            compiled = re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        if compiled.search(""):
            raise ValueError("the regex matches the empty string, so every file would be withheld")
        reason = _backtracks(_parser.parse(v))
        if reason:
            raise ValueError(f"the regex could take exponential time ({reason}); write it without nesting")
        return v

    @field_validator("keywords")
    @classmethod
    def _keywords(cls, v: list[str]) -> list[str]:
        if any(not k for k in v):
            raise ValueError("an empty keyword; remove it")
        long = [k[:20] + "..." for k in v if len(k) > 200]
        if long:
            raise ValueError(f"keyword(s) {long} longer than 200 characters; a keyword is a word every match holds")
        return v

    @cached_property
    def detector(self) -> ExtraDetector:
        import re

        from airlockd.redact import ExtraDetector

        return ExtraDetector(self.name, re.compile(self.regex), self.min_entropy, tuple(self.keywords))


class Withhold(_Model):
    patterns: FloorPatterns = Field(default_factory=list)
    detectors: list[str] = Field(default_factory=list)
    custom: list[CustomDetector] = Field(default_factory=list)
    # archives are opened and scanned up to these bounds; one that does not fit is withheld
    archive_scan_mb: int = Field(64, ge=1, le=4096)  # uncompressed bytes scanned per archive
    archive_max_members: int = Field(10_000, ge=1, le=1_000_000)  # members per archive, nested included

    @field_validator("detectors")
    @classmethod
    def _known_detectors(cls, v: list[str]) -> list[str]:
        from airlockd.redact import known_detectors

        known = known_detectors()
        unknown = [d for d in v if d not in known]
        if unknown:
            raise ValueError(f"unknown detector(s) {unknown}; known: {sorted(known)}")
        return v

    @property
    def extra_detectors(self) -> list[ExtraDetector]:
        """The workspace's own detectors (`custom`), compiled."""
        return [d.detector for d in self.custom]

    @field_validator("custom")
    @classmethod
    def _unique_names(cls, v: list[CustomDetector]) -> list[CustomDetector]:
        names = [d.name for d in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"custom detector name(s) {twice} given twice; give each its own name")
        return v


class Rule(_Model):
    match: Patterns = Field(min_length=1)
    action: Decision
    reason: str = Field(min_length=1)
    id: str | None = None


Provider = Literal["openai", "anthropic", "gemini", "generic"]
# What a `[gateway.providers.NAME]` table means when it leaves a key out.
PROVIDER_DEFAULTS: dict[str, dict[str, Any]] = {
    "openai": {"upstream": "https://api.openai.com", "key_env": "OPENAI_API_KEY", "allowed": ["POST /v1/responses"]},
    "anthropic": {
        "upstream": "https://api.anthropic.com",
        "key_env": "ANTHROPIC_API_KEY",
        "allowed": ["POST /v1/messages"],
    },
    "gemini": {
        "upstream": "https://generativelanguage.googleapis.com",
        "key_env": "GEMINI_API_KEY",
        "allowed": ["POST /v1beta/models/*:streamGenerateContent", "POST /v1beta/models/*:generateContent"],
    },
    "generic": {},
}


class GatewayRoute(_Model):
    """Where one provider's requests go, with which key, and which requests may go."""

    upstream: str = "https://api.openai.com"
    key_env: str | None = "OPENAI_API_KEY"
    key_file: str | None = None
    allowed: list[str] = Field(default_factory=lambda: ["POST /v1/responses"])
    # Which request headers of the agent pass upstream (see gateway/server.py PROVIDER_HEADERS).
    provider: Provider = "openai"
    # Set on every forwarded request, replacing whatever the agent sent (account, project, version).
    headers: dict[str, str] = Field(default_factory=dict)
    # More request headers the agent may send; credentials and hop headers never pass.
    pass_headers: list[str] = Field(default_factory=list)

    @field_validator("headers")
    @classmethod
    def _header_values(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not re.fullmatch(r"[A-Za-z0-9-]{1,100}", name):
                raise ValueError(f"header name {name!r} is not a token (letters, digits, '-')")
            if name.lower() in ("authorization", "x-api-key", "host", "content-length", "cookie"):
                raise ValueError(f"header {name!r} is set by the gateway itself; remove it")
            if any(ord(c) < 0x20 or ord(c) > 0x7E for c in value):
                raise ValueError(f"header {name!r} has a control or non-ASCII character in its value")
        return v


class Gateway(GatewayRoute):
    """`[gateway]`: the route of command agents and of the provider it names, the run tokens'
    lifetime, and a route per further provider (`[gateway.providers.anthropic]`: Claude Code's),
    each with that provider's upstream, key and requests unless it says otherwise."""

    token_ttl_s: float = Field(3600, gt=0)
    providers: dict[Provider, GatewayRoute] = Field(default_factory=dict)

    @field_validator("providers", mode="before")
    @classmethod
    def _provider_defaults(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for name, table in v.items():
            if isinstance(table, dict) and name in PROVIDER_DEFAULTS:
                if table.get("provider", name) != name:
                    raise ValueError(f"[gateway.providers.{name}] says provider = {table['provider']!r}; remove it")
                table = {**PROVIDER_DEFAULTS[name], **table, "provider": name}
            out[name] = table
        return out

    def route_for(self, provider: str | None) -> GatewayRoute | None:
        """The route of `provider` (None: a command agent's, this table's own): this table when
        it is for that provider, else the provider's own table, else this one when it is for any
        (`generic`); None when the policy has none for it."""
        if provider is None or self.provider == provider:
            return self
        own = {str(k): v for k, v in self.providers.items()}
        return own.get(provider) or (self if self.provider == "generic" else None)


class ClassifierConfig(_Model):
    """Model-assisted classification: may only raise a file's label or a change's decision."""

    enabled: bool = False
    endpoint: str = "http://127.0.0.1:8788/v1/responses"  # OpenAI-Responses-compatible
    model: str = "gpt-4.1-mini"
    key_env: str | None = None  # environment variable holding the endpoint's key, if it needs one
    timeout_s: float = Field(20, gt=0, le=600)
    max_bytes: int = Field(32_768, ge=256)  # of each file sent to the model
    max_files: int = Field(200, ge=0)  # staged files asked about per run (labels)
    labels: bool = True  # ask about each staged text file's sensitivity
    decisions: bool = True  # ask about each change not already denied
    on_error: Literal["keep", "review"] = "keep"  # a failed call: keep the decision, or raise it to review


class Retention(_Model):
    """How long finished runs keep everything (docs/state.md). A finished run older than
    `keep_days`, or not among the last `keep_runs` finished ones, is compacted: its record moves
    to a summary (what the evidence and the audit need) and its staging, backups and blobs go.
    An applied run can be undone for `undo_days` after it landed, and is kept whole until then."""

    keep_days: float = Field(30, gt=0)
    keep_runs: int = Field(1000, ge=1)
    undo_days: float = Field(7, gt=0)
    audit_days: float = Field(0, ge=0)  # sealed audit segments older than this are dropped (0: never)
    auto: bool = True  # the daemon compacts by itself (hourly and at start), as `airlockd gc --apply`


class Policy(_Model):
    defaults: Defaults = Defaults()
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    withhold: Withhold = Withhold()
    labels: dict[str, Level] = Field(default_factory=dict)
    rules: list[Rule] = Field(default_factory=list)
    gateway: Gateway = Gateway()
    broker: Broker = Broker()
    classifier: ClassifierConfig = ClassifierConfig()
    retention: Retention = Retention()

    @field_validator("labels")
    @classmethod
    def _label_patterns(cls, v: dict[str, Level]) -> dict[str, Level]:
        _check_patterns(list(v))
        return v

    def agent(self, name: str) -> AgentConfig:
        from airlockd.errors import NotFoundError

        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise NotFoundError(
                f"no agent named {name!r} in the policy (known: {known})",
                hint=f"add an [agents.{name}] table to {POLICY_FILE}",
            ) from None

    def mode_for(self, agent: str) -> Mode:
        return self.agent(agent).mode or self.defaults.mode

    def runtime_for(self, agent: str) -> Runtime:
        return self.agent(agent).runtime or self.defaults.runtime

    def broker_for(self, agent: str) -> Broker:
        """`[broker]` with what `[agents.NAME.broker]` sets in its place."""
        own = self.agent(agent).broker.model_dump(exclude_none=True)
        return Broker.model_validate({**self.broker.model_dump(), **own}) if own else self.broker

    def clearance_for(self, agent: str) -> Level:
        return self.agent(agent).clearance or self.defaults.clearance

    @cached_property
    def withhold_match(self) -> AnyPattern:
        """The withhold patterns' matcher: any case, any depth, negations ignored (pathmatch.py)."""
        return withhold_matcher(self.withhold.patterns)

    def above(self, clearance: Level) -> AnyPattern:
        """Matches the paths labelled above `clearance` (any label pattern ranked higher)."""
        return matcher(p for p, lvl in self.labels.items() if lvl.rank > clearance.rank)

    @cached_property
    def protected_spec(self) -> pathspec.PathSpec:
        return gitignore_spec(self.defaults.protected_files)

    @cached_property
    def label_specs(self) -> list[tuple[AnyPattern, Level]]:
        """Each label's matcher: case-insensitive, anchored as gitignore anchors (pathmatch.py)."""
        return [(matcher([p]), lvl) for p, lvl in self.labels.items()]

    @cached_property
    def rule_specs(self) -> list[tuple[pathspec.PathSpec, Rule]]:
        return [(gitignore_spec(r.match), r) for r in self.rules]

    def label_of(self, path: str) -> Level:
        """The highest label any pattern gives `path`; unlabelled files are internal."""
        found = [lvl for match, lvl in self.label_specs if match(path)]
        return max(found, key=lambda lvl: lvl.rank) if found else Level.INTERNAL


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy with the files it came from and the digest of its merged form."""

    policy: Policy
    revision: str
    sources: tuple[str, ...]
    text: str  # canonical JSON of the merged policy, kept per revision for replay


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(
            f"{path}: not valid TOML: {exc}",
            hint="fix the syntax at that line; the last good policy stays in force",
            file=str(path),
        ) from None
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror}", file=str(path)) from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Workspace over default: tables merge key by key, rules go first, withhold lists add up."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key == "rules" and isinstance(value, list):
            out["rules"] = [*value, *out.get("rules", [])]
        elif key == "withhold" and isinstance(value, dict) and isinstance(out.get(key), dict):
            merged = dict(out[key])
            for k, v in value.items():
                if isinstance(v, list) and isinstance(merged.get(k), list):
                    merged[k] = [*merged[k], *[x for x in v if x not in merged[k]]]
                else:
                    merged[k] = v
            out[key] = merged
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    # Protected instruction files are an invariant floor: a workspace may add, never remove.
    base_protected = base.get("defaults", {}).get("protected_files", [])
    protected = out.get("defaults", {}).get("protected_files")
    if isinstance(protected, list):
        out["defaults"]["protected_files"] = [
            *base_protected,
            *[p for p in protected if p not in base_protected],
        ]
    return out


def _fill_agent_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """Each agent's limits and admission start from [defaults.limits] / [defaults.admission]."""
    defaults = raw.get("defaults", {})
    agents = raw.get("agents", {})
    if not isinstance(defaults, dict) or not isinstance(agents, dict):
        return raw
    for agent in agents.values():
        if not isinstance(agent, dict):
            continue
        for section in ("limits", "admission"):
            base = defaults.get(section, {})
            own = agent.get(section, {})
            if isinstance(base, dict) and isinstance(own, dict):
                agent[section] = {**base, **own}
    return raw


_FIXES = {
    "extra_forbidden": "remove it or check its spelling",
    "missing": "add it",
    "literal_error": "use one of the values listed",
    "enum": "use one of the values listed",
}


def _has_key(raw: Any, loc: tuple[Any, ...]) -> bool:
    for part in loc:
        if (isinstance(raw, dict) and part in raw) or (
            isinstance(raw, list) and isinstance(part, int) and part < len(raw)
        ):
            raw = raw[part]
        else:
            return False
    return True


def _policy_error(exc: ValidationError, files: list[tuple[Path, dict[str, Any]]]) -> PolicyError:
    problems = []
    first_file: Path | None = None
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        # Name the file that holds the key: the workspace file if it has it, else the default.
        owner = next((f for f, raw in reversed(files) if _has_key(raw, loc)), files[-1][0])
        first_file = first_file or owner
        msg = err["msg"].removeprefix("Value error, ")
        fix = _FIXES.get(err["type"], "see the comments in the default policies.toml")
        problems.append(f"{owner}: key `{key}`: {msg} ({fix})")
    return PolicyError(
        "invalid policy:\n  " + "\n  ".join(problems),
        hint="correct the keys above; until then airlockd refuses to start runs under this policy",
        file=str(first_file),
        problems=problems,
    )


def load_policy(workspace: Path, default_file: Path | None = None) -> LoadedPolicy:
    """Read, merge and validate the default policy and the workspace's own, if any."""
    default_path = default_file or resource(POLICY_FILE)
    files = [(default_path, _read_toml(default_path))]
    own = workspace / POLICY_FILE
    if own.is_file() and own.resolve() != default_path.resolve():
        files.append((own, _read_toml(own)))
    merged: dict[str, Any] = {}
    for _, raw in files:
        merged = _merge(merged, raw) if merged else copy.deepcopy(raw)
    merged = _fill_agent_defaults(merged)
    try:
        policy = Policy.model_validate(merged)
    except ValidationError as exc:
        raise _policy_error(exc, files) from None
    text = json.dumps(policy.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    revision = hashlib.sha256(text.encode()).hexdigest()[:16]
    return LoadedPolicy(policy, revision, tuple(str(f) for f, _ in files), text)
