"""What ``serve --reload`` watches (serving_core.process.handlerfiles): the handler's folder,
its source files only."""

from __future__ import annotations

import os

import pytest

from serving_core.process.handlerfiles import HandlerFiles, changed, handler_folder
from serving_core.settings import SettingsError


@pytest.mark.parametrize(
    "spec", ["h/handler.py", "h/handler.py:Echo", "h", "h/pipeline.yaml", "pkg.h.handler"]
)
def test_the_folder_is_the_handlers_whatever_form_names_it(tmp_path, monkeypatch, spec):
    folder = tmp_path / "pkg" / "h" if spec.startswith("pkg") else tmp_path / "h"
    folder.mkdir(parents=True)
    (folder / "handler.py").write_text("")
    (folder / "pipeline.yaml").write_text("")
    monkeypatch.chdir(tmp_path)
    # A module path is found on the search path, never imported.
    assert handler_folder(spec, [str(tmp_path)]) == folder


def test_a_handler_found_nowhere_is_refused_naming_it(tmp_path):
    with pytest.raises(SettingsError, match=r"'nowhere\.handler' is not a file, a folder"):
        handler_folder("nowhere.handler", [str(tmp_path)])


def test_a_source_file_changed_anywhere_below_is_seen(tmp_path):
    (tmp_path / "lib").mkdir()
    for name in ("handler.py", "sample.json", "lib/tokens.py", "config.yaml"):
        (tmp_path / name).write_text("1")
    files = HandlerFiles([tmp_path])
    before = files.snapshot()
    (tmp_path / "lib" / "tokens.py").write_text("22")
    assert changed(before, files.snapshot()) == [str(tmp_path / "lib" / "tokens.py")]


def test_a_save_by_rename_is_seen_even_with_the_same_size_and_time(tmp_path):
    path = tmp_path / "handler.py"
    path.write_text("a = 1\n")
    files = HandlerFiles([tmp_path])
    before = files.snapshot()
    stat = path.stat()
    # What an editor does: write a new file, then rename it over the old one.
    (tmp_path / "handler.py.new").write_text("a = 2\n")
    os.utime(tmp_path / "handler.py.new", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(tmp_path / "handler.py.new", path)
    assert changed(before, files.snapshot()) == [str(path)]


def test_caches_hidden_folders_and_other_files_are_not_watched(tmp_path):
    (tmp_path / "handler.py").write_text("")
    files = HandlerFiles([tmp_path])
    before = files.snapshot()
    for name in ("__pycache__/handler.cpython-311.pyc", ".git/HEAD", ".venv/x.py", "model.onnx"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / ".handler.py.swp").write_text("x")
    assert files.snapshot() == before
