"""dapbench never deletes what it did not write (issue #47, first cases): a folder it builds whole is replaced only
when it built it (a marker file), and a user's folder in its way is refused by name before any work."""

import pytest

from benchmark.cli import main
from benchmark.errors import DapbenchError
from benchmark.io import OWNED_MARKER, atomic_directory

TINY = ["--vocab-size", "120", "--hidden-size", "16", "--num-layers", "1", "--num-heads", "2"]
TINY += ["--intermediate-size", "32", "--seq-len", "16", "--steps", "2", "--batch-size", "4"]


def _user_folder(path):
    path.mkdir()
    (path / "thesis.tex").write_text("years of work\n")
    return path


def test_atomic_directory_refuses_a_folder_it_did_not_build_and_replaces_one_it_did(tmp_path):
    foreign = _user_folder(tmp_path / "docs")
    with pytest.raises(DapbenchError, match="was not written by dapbench"):
        atomic_directory(foreign, lambda tmp: (tmp / "model.bin").write_text("x"))
    assert (foreign / "thesis.tex").read_text() == "years of work\n" and not (tmp_path / "docs.tmp").exists()

    built = atomic_directory(tmp_path / "model", lambda tmp: (tmp / "v1").write_text("1"))
    assert (built / OWNED_MARKER).is_file()
    atomic_directory(built, lambda tmp: (tmp / "v2").write_text("2"))
    assert sorted(p.name for p in built.iterdir()) == [OWNED_MARKER, "v2"]


def test_a_foreign_temporary_folder_is_not_removed(tmp_path):
    foreign = _user_folder(tmp_path / "model.tmp")
    with pytest.raises(DapbenchError, match="temporary folder"):
        atomic_directory(tmp_path / "model", lambda tmp: None)
    assert (foreign / "thesis.tex").is_file()


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"the cat number {i} sat on the mat and looked at the dog {i % 7}\n" for i in range(200)))
    return path


@pytest.mark.parametrize("target", ["docs", "."])
def test_pretrain_base_into_a_users_folder_exits_2_before_work_and_deletes_nothing(
    corpus, tmp_path, monkeypatch, capsys, target
):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / target
    if target != ".":
        _user_folder(folder)
    (tmp_path / "notes.txt").write_text("keep me\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["pretrain-base", str(corpus), target, *TINY]) == 2
    assert "was not written by dapbench" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_pretrain_base_keeps_a_users_sibling_cache_folder(corpus, tmp_path, capsys):
    sibling = _user_folder(tmp_path / "mymodel.cache")
    assert main(["pretrain-base", str(corpus), str(tmp_path / "mymodel"), *TINY]) == 2
    assert "scratch folder" in capsys.readouterr().err
    assert (sibling / "thesis.tex").is_file() and not (tmp_path / "mymodel").exists()


def test_pretrain_base_replaces_its_own_model_and_cleans_its_own_scratch(corpus, tmp_path):
    out = tmp_path / "mymodel"
    assert main(["pretrain-base", str(corpus), str(out), *TINY]) == 0
    assert (out / OWNED_MARKER).is_file() and (out / "config.json").is_file()
    assert main(["pretrain-base", str(corpus), str(out), *TINY, "--seed", "2"]) == 0
    assert not (tmp_path / "mymodel.cache").exists() and not (tmp_path / "mymodel.tmp").exists()


def test_pretrain_base_writes_its_files_with_the_umasks_mode(corpus, tmp_path):
    import os

    out = tmp_path / "mymodel"
    assert main(["pretrain-base", str(corpus), str(out), *TINY]) == 0
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == 0o666 & ~mask, modes  # transformers writes it 0600
    assert set(modes.values()) == {0o666 & ~mask}
