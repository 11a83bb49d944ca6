"""``serving-core init``: the skeleton it writes serves and passes the contract check as written."""

from __future__ import annotations

import ast
import json
import subprocess

import pytest

from serving_core import InvalidInput
from serving_core.commands.init import ScaffoldError, create
from serving_core.loading import load_handler
from tests.servers import ROOT, SERVING_CORE, base_env


def init(*args, cwd):
    return subprocess.run(
        [str(SERVING_CORE), "init", *args],
        cwd=cwd,
        env=base_env({}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_init_writes_a_handler_folder_and_says_how_to_serve_it(tmp_path):
    result = init("sentiment", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "handlers" / "sentiment"
    assert sorted(p.name for p in folder.iterdir()) == [
        "handler.py",
        "requirements.txt",
        "sample.json",
    ]
    assert "SERVING_HANDLER=handlers/sentiment make serve" in result.stdout
    assert "make image HANDLER_DIR=handlers/sentiment" in result.stdout


def test_the_skeleton_has_every_hook_a_user_edits(tmp_path):
    source = (create("image-tagger", tmp_path) / "handler.py").read_text()
    tree = ast.parse(source)
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assert cls.name == "ImageTagger"
    members = {
        target.id
        for node in cls.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    } | {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}
    assert {"name", "version", "input_schema", "setup", "predict_batch"} <= members


def test_the_skeleton_passes_check_as_written(tmp_path):
    folder = create("sentiment", tmp_path)
    result = subprocess.run(
        [str(SERVING_CORE), "check", str(folder)],
        cwd=ROOT,
        env=base_env({}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    sample = json.loads((folder / "sample.json").read_text())
    assert json.loads(result.stdout) == {"length": len(sample["text"])}


def test_the_skeleton_refuses_blank_text_with_invalid_input(tmp_path):
    loaded = load_handler(str(create("sentiment", tmp_path)))
    loaded.handler.setup()
    outputs = loaded.handler.predict_batch([{"text": "fine"}])
    assert outputs == [{"length": 4}]
    with pytest.raises(InvalidInput, match="more than whitespace"):
        loaded.handler.predict_batch([{"text": "  "}])


@pytest.mark.parametrize("name", ["Sentiment", "1st", "a b", "../up", "", "x" * 64])
def test_a_bad_name_is_refused_with_what_is_accepted(tmp_path, name):
    with pytest.raises(ScaffoldError, match="lower case letters"):
        create(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_init_never_overwrites_an_existing_handler(tmp_path):
    create("sentiment", tmp_path)
    (tmp_path / "sentiment" / "handler.py").write_text("# my work\n")
    result = init("sentiment", "--dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "already exists" in result.stderr
    assert (tmp_path / "sentiment" / "handler.py").read_text() == "# my work\n"
