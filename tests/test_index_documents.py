"""Your own documents: a folder of real .md/.txt/.html/.pdf files indexed, updated with `add`
(only changed files re-chunked, removed files' passages deleted, an interrupted add resumed), and
searched beside a Wikipedia index with the file path (and PDF page) cited."""

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from targ_mlx.index import IndexMismatchError, add_documents, build_index, open_indexes, open_retriever
from targ_mlx.index.__main__ import main as index_main
from targ_mlx.index.store import PASSAGES, partial_dir


def _rows(index: Path) -> dict[int, tuple[str, str, str]]:
    with closing(sqlite3.connect(index / PASSAGES)) as db:
        return {k: (t, x, a) for k, t, x, a in db.execute("SELECT key, title, text, article FROM passages")}


def _vectors(index: Path, keys) -> np.ndarray:
    from usearch.index import Index

    return np.stack(Index.restore(str(index / "vectors.usearch"), view=True).get(np.asarray(sorted(keys), dtype=np.uint64)))


def test_a_folder_of_documents_is_indexed_and_cited_by_path_and_page(notes_folder, tmp_path):
    folder, rows = notes_folder
    out = build_index([str(folder)], tmp_path / "idx")
    titles = sorted({t for t, _, _ in _rows(out).values()})
    pdf = [t for t in titles if "report.pdf" in t]
    assert [t for t in titles if t not in pdf] == ["notes/lecture.md", "notes/page.html", "notes/sub/memo.txt"]
    # each PDF chunk names the pages it spans, and together they cover both pages
    assert pdf and all(re.fullmatch(r"notes/report\.pdf p\. [12](-2)?", t) for t in pdf), pdf
    assert {"1", "2"} <= set("".join(t.rsplit(" ", 1)[1] for t in pdf))
    assert not any("hidden" in x for _, x, _ in _rows(out).values())  # script text is not content
    r = open_retriever(out)
    hit = r.search(rows[4]["question"], 5)  # its passage is the PDF's page 2
    assert re.fullmatch(r"notes/report\.pdf p\. (2|1-2)", hit[0].title), [p.title for p in hit]
    assert rows[4]["passages"][0]["text"][:60] in " ".join(hit[0].text.split())
    assert hit[0].format().startswith(f"[{hit[0].title}] ")
    manifest = r.manifest
    assert set(manifest["build"]["documents"][str(folder.resolve())]) == {
        "lecture.md", "page.html", "report.pdf", "sub/memo.txt"}
    with pytest.raises(IndexMismatchError, match="add"):
        (folder / "lecture.md").write_text("changed " * 60, encoding="utf-8")
        build_index([str(folder)], out)


def test_add_rechunks_only_the_changed_file_and_drops_removed_ones(gold_rows, notes_folder, tmp_path):
    folder, rows = notes_folder
    out = build_index([str(folder)], tmp_path / "idx")
    before = _rows(out)
    others = {k: v for k, v in before.items() if v[2] != "sub/memo.txt"}
    others_vecs = _vectors(out, others)
    extra = gold_rows(6)[5]["passages"][0]["text"]
    (folder / "sub" / "memo.txt").write_text(extra + "\n\n" + rows[1]["passages"][0]["text"], encoding="utf-8")

    plan = add_documents(out, [str(folder)])
    assert plan.changed == {str(folder.resolve()): {"sub/memo.txt": plan.changed[str(folder.resolve())]["sub/memo.txt"]}}
    after = _rows(out)
    assert {k: v for k, v in after.items() if v[2] != "sub/memo.txt"} == others  # untouched rows
    np.testing.assert_array_equal(_vectors(out, others), others_vecs)  # and untouched vectors
    memo = [x for _, x, a in after.values() if a == "sub/memo.txt"]
    assert any(extra[:100] in x for x in memo)
    r = open_retriever(out)
    assert len(r) == len(after) and r.manifest["counts"]["chunks_read"] == len(memo)
    assert r.search(gold_rows(6)[5]["question"], 5)[0].title == "notes/sub/memo.txt"
    r.close()

    (folder / "page.html").unlink()
    add_documents(out, [str(folder)])
    gone = {k for k, v in after.items() if v[2] == "page.html"}
    assert gone and not gone & set(_rows(out))
    r = open_retriever(out)
    assert not gone & {p.key for p in r.search(rows[2]["question"], 10)}
    assert "page.html" not in r.manifest["build"]["documents"][str(folder.resolve())]
    assert add_documents(out, [str(folder)]).empty  # nothing changed: nothing done


def test_an_interrupted_add_resumes_to_the_same_index(gold_rows, notes_folder, tmp_path):
    folder, rows = notes_folder
    a = build_index([str(folder)], tmp_path / "a")
    b = build_index([str(folder)], tmp_path / "b")
    new = folder / "more.md"
    new.write_text("\n\n".join(r["passages"][0]["text"] for r in gold_rows(8)[5:]), encoding="utf-8")
    add_documents(a, [str(folder)])

    class Stop(Exception):
        pass

    calls = []

    def stop_after_first_commit(done, total):
        calls.append(done)
        if done > 0:
            raise Stop

    with pytest.raises(Stop):
        add_documents(b, [str(folder)], progress=stop_after_first_commit, commit_every=1)
    assert partial_dir(b).exists() and (b / "manifest.json").is_file()  # the old index still served
    assert add_documents(b, [str(folder)]).changed  # resumes the plan it began
    assert not partial_dir(b).exists()
    assert _rows(a) == _rows(b)
    np.testing.assert_allclose(_vectors(a, _rows(a)), _vectors(b, _rows(b)), atol=1e-3)


def test_several_indexes_are_searched_at_once(notes_folder, tmp_path, small_index_dir, small_index_questions):
    folder, rows = notes_folder
    notes = build_index([str(folder)], tmp_path / "idx")
    both = open_indexes([small_index_dir, notes])
    assert len(both) == len(open_retriever(small_index_dir)) + len(open_retriever(notes))
    assert both.search(rows[0]["question"], 5)[0].title == "notes/lecture.md"
    wiki_q = small_index_questions[0]
    assert wiki_q["gold_title"] in [p.title for p in both.search(wiki_q["question"], 5)]
    assert both.manifest_id not in (open_retriever(notes).manifest_id, open_retriever(small_index_dir).manifest_id)


def test_add_cli_reports_and_rejects_a_non_folder(gold_rows, notes_folder, tmp_path, capsys):
    folder, _ = notes_folder
    out = build_index([str(folder)], tmp_path / "idx")
    (folder / "new.txt").write_text(gold_rows(6)[5]["passages"][0]["text"], encoding="utf-8")
    index_main(["add", str(out), "--corpus", str(folder), "--quiet"])
    assert "1 new or changed file(s), 0 removed" in capsys.readouterr().out
    assert index_main(["add", str(out), "--corpus", str(folder / "new.txt"), "--quiet"]) == 2  # one CLI error code
    assert "not a folder" in capsys.readouterr().err


def test_a_bad_file_is_skipped_and_reported_and_the_rest_is_indexed(notes_folder, tmp_path, caplog, capsys):
    """One corrupt PDF and one file that is not UTF-8 among the notes: both skipped with one
    warning line each, listed in the manifest and the build summary; every good file indexed.
    Removing the bad file afterwards leaves the same build (nothing to redo, nothing refused)."""
    folder, rows = notes_folder
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\n" + b"\x00garbage" * 50)
    (folder / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e ".encode("latin-1") * 20)
    out = tmp_path / "idx"
    assert index_main(["build", "--corpus", str(folder), "--out", str(out), "--quiet"]) == 0
    shown = capsys.readouterr().out
    assert "skipped      " in shown and "broken.pdf" in shown and "latin1.txt: not UTF-8" in shown
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("broken.pdf" in w for w in warned) and any("latin1.txt" in w for w in warned)
    manifest = open_retriever(out).manifest
    assert set(manifest["build"]["skipped"][str(folder.resolve())]) == {"broken.pdf", "latin1.txt"}
    assert set(manifest["build"]["documents"][str(folder.resolve())]) == {
        "lecture.md", "page.html", "report.pdf", "sub/memo.txt"}
    (folder / "broken.pdf").unlink()
    assert build_index([str(folder)], out) == out  # the same build: found finished, not refused


def test_a_short_note_becomes_one_passage(tmp_path):
    """A 195-character memo, below the 200-character chunk minimum, is one passage of your notes (it used to be
    none, silently); Wikipedia articles that short are still skipped."""
    folder = tmp_path / "memos"
    folder.mkdir()
    memo = ("The spare key to the bike shed is taped under the blue flowerpot by the back door. "
            "Ask Dana before moving it. The padlock code is 4172; we change it every spring, so check the note on the fridge.")
    assert len(memo) == 195  # the memo of the issue: below the 200-character minimum
    (folder / "memo.txt").write_text(memo, encoding="utf-8")
    out = build_index([str(folder)], tmp_path / "idx")
    [(title, text, _)] = _rows(out).values()
    assert title == "memos/memo.txt" and text == memo
    hit = open_retriever(out).search("where is the spare key to the bike shed", 1)
    assert hit[0].title == "memos/memo.txt"
    from targ_mlx.index.chunking import chunk_article

    assert list(chunk_article("wiki", "1", "Stub", memo)) == []  # not your notes: still below the minimum


def test_strict_turns_a_skipped_file_into_a_one_line_error(notes_folder, tmp_path, capsys):
    """--strict: the unreadable file is named in one line, nothing is built or changed."""
    folder, _ = notes_folder
    out = build_index([str(folder)], tmp_path / "idx")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\n" + b"\x00garbage" * 50)
    for argv in (["build", "--corpus", str(folder), "--out", str(tmp_path / "strict")],
                 ["add", str(out), "--corpus", str(folder)]):
        assert index_main([*argv, "--strict", "--quiet"]) == 2
        err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error")]
        assert len(err) == 1 and "--strict: 1 file(s) cannot be read" in err[0] and "broken.pdf" in err[0], err
    assert not (tmp_path / "strict").exists() and not partial_dir(tmp_path / "strict").exists()
    assert "broken.pdf" not in json.dumps(open_retriever(out).manifest)  # the index is unchanged
    assert index_main(["add", str(out), "--corpus", str(folder), "--quiet"]) == 0  # without: skipped, shown
    shown = capsys.readouterr().out
    assert "up to date" in shown and f"skipped      {folder.resolve()}/broken.pdf: unreadable PDF" in shown


def test_a_corpus_without_passages_is_a_one_line_error_and_publishes_nothing(tmp_path, capsys):
    folder = tmp_path / "empty-notes"
    folder.mkdir()
    (folder / "scan.pdf").write_bytes(b"%PDF-1.4\n" + b"\x00garbage" * 50)
    (folder / "blank.md").write_text("  \n\n ", encoding="utf-8")
    out = tmp_path / "idx"
    assert index_main(["build", "--corpus", str(folder), "--out", str(out), "--quiet"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error")]
    assert len(err) == 1 and "yielded no passages (1 file(s) skipped" in err[0], err
    assert not out.exists() and not partial_dir(out).exists()


def test_documents_changed_between_attempts_reuse_the_partials_vectors(gold_rows, notes_folder, tmp_path,
                                                                        monkeypatch):
    """A build stopped part-way, then a file edited and one added: the rerun is not refused; it
    encodes only the new chunks, taking the others' vectors from the old partial, and ends equal
    to a clean build of the folder as it now is."""
    from targ_mlx.index import load_encoder
    from targ_mlx.index.encoder import DEFAULT_ENCODER, canonical_name, build_backend

    folder, rows = notes_folder
    out = tmp_path / "idx"

    class Stop(Exception):
        pass

    def stop_at(n):
        def progress(done, total):
            if done >= n:
                raise Stop
        return progress

    with pytest.raises(Stop):
        build_index([str(folder)], out, progress=stop_at(4), commit_every=1)
    kept = {x for _, x, a in _rows(partial_dir(out)).values() if a != "lecture.md"}  # committed, unchanged
    assert kept
    (folder / "lecture.md").write_text(gold_rows(7)[6]["passages"][0]["text"], encoding="utf-8")
    (folder / "new.md").write_text(gold_rows(8)[7]["passages"][0]["text"], encoding="utf-8")
    name = canonical_name(DEFAULT_ENCODER)
    enc = load_encoder(name, backend=build_backend(name))  # the build's own (cached) encoder
    encoded = []
    real = enc.encode_passages
    # a counting spy around the real encoder (it still encodes): which chunks were not reused
    monkeypatch.setattr(enc, "encode_passages", lambda titles, texts, *a: encoded.extend(texts) or real(titles, texts, *a))
    build_index([str(folder)], out, commit_every=1)  # not refused for the changed folder
    monkeypatch.undo()
    clean = build_index([str(folder)], tmp_path / "clean", commit_every=1)
    assert _rows(out) == _rows(clean)
    np.testing.assert_allclose(_vectors(out, _rows(out)), _vectors(clean, _rows(clean)), atol=1e-3)
    assert encoded and not set(encoded) & kept  # the unchanged committed chunks were not encoded again
    assert {x for _, x, a in _rows(out).values() if a in ("lecture.md", "new.md")} <= set(encoded)
    assert not partial_dir(out).exists() and not out.with_name("idx.partial.prev").exists()


def test_an_add_interrupted_then_files_changed_again_plans_afresh(gold_rows, notes_folder, tmp_path):
    """An `add` stopped part-way, then one more file edited: the rerun is not refused (it used to
    stop with "changed while the index was being updated"); it plans again and ends equal to a
    clean add of the folder as it now is."""
    folder, _ = notes_folder
    a = build_index([str(folder)], tmp_path / "a")
    b = build_index([str(folder)], tmp_path / "b")
    extra = gold_rows(10)
    for i, r in enumerate(extra[5:8]):
        (folder / f"new{i}.md").write_text(r["passages"][0]["text"], encoding="utf-8")

    class Stop(Exception):
        pass

    def stop_after_first_commit(done, total):
        if done > 0:
            raise Stop

    with pytest.raises(Stop):
        add_documents(b, [str(folder)], progress=stop_after_first_commit, commit_every=1)
    (folder / "new2.md").write_text(extra[8]["passages"][0]["text"], encoding="utf-8")  # edited meanwhile
    add_documents(b, [str(folder)], commit_every=1)
    add_documents(a, [str(folder)], commit_every=1)
    assert _rows(a) == _rows(b)
    np.testing.assert_allclose(_vectors(a, _rows(a)), _vectors(b, _rows(b)), atol=1e-3)
    assert not partial_dir(b).exists() and not b.with_name("b.partial.prev").exists()
