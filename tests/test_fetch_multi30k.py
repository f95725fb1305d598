"""scripts/fetch_multi30k.py, from a local mirror (file://) of the files."""
import gzip
import os

import pytest

from scripts import fetch_multi30k


def test_fetches_checks_and_keeps_valid_files(multi30k, tmp_path, capsys):
  out = tmp_path / "m30k"
  url = f"file://{multi30k}"
  assert fetch_multi30k.main(["--out", str(out), "--languages", "de,en",
                              "--base_url", url]) == 0
  names = sorted(os.listdir(out))
  assert names == sorted(f"{s}.{l}.gz" for s in fetch_multi30k.SPLITS
                         for l in ("de", "en"))
  for name in names:  # byte copies of the mirror
    assert (out / name).read_bytes() == (multi30k / name).read_bytes()
  assert "6 file(s) fetched, 0 already there" in capsys.readouterr().out
  # A second run downloads nothing; a damaged file is fetched again.
  (out / "val.de.gz").write_bytes(b"not gzip")
  assert fetch_multi30k.main(["--out", str(out), "--languages", "de,en",
                              "--base_url", url]) == 0
  assert "1 file(s) fetched, 5 already there" in capsys.readouterr().out
  assert (out / "val.de.gz").read_bytes() == (multi30k / "val.de.gz"
                                              ).read_bytes()


def test_a_wrong_file_is_refused_and_leaves_nothing(tmp_path, capsys):
  mirror = tmp_path / "mirror"
  mirror.mkdir()
  for split, lines in fetch_multi30k.SPLITS.items():
    count = lines - 1 if split == "val" else lines  # val is one line short
    with gzip.open(mirror / f"{split}.de.gz", "wt") as f:
      f.write("Ein Hund.\n" * count)
  out = tmp_path / "out"
  assert fetch_multi30k.main(["--out", str(out), "--languages", "de",
                              "--base_url", f"file://{mirror}"]) == 1
  err = capsys.readouterr().err.strip()
  assert err == (f"fetch_multi30k.py: file://{mirror}/val.de.gz has 1013 "
                 "lines, expected 1014.")
  assert sorted(os.listdir(out)) == ["train.de.gz"]  # no partial val file
  assert fetch_multi30k.main(["--out", str(out), "--languages", "xx"]) == 1
  assert "unknown language(s) ['xx']" in capsys.readouterr().err


def test_bad_flags_are_refused_and_leave_no_folder(tmp_path, capsys):
  # These used to end in a traceback (FileExistsError, FileNotFoundError,
  # ValueError) or do nothing with status 0, and left an empty --out.
  (tmp_path / "afile").write_text("x")
  cases = [
      (["--out", str(tmp_path / "afile")],
       f"--out={tmp_path / 'afile'} is a file, not a folder."),
      (["--out", str(tmp_path / "afile" / "m30k")],
       f"--out={tmp_path / 'afile' / 'm30k'}: cannot create the folder "
       "(Not a directory)."),
      (["--out", str(tmp_path / "new"), "--base_url", "notaurl"],
       "--base_url=notaurl: not a URL (expected https://..., http://..., "
       "ftp://... or file://...)."),
      (["--out", str(tmp_path / "new"), "--languages", ","],
       "--languages=',' names no language; Multi30k task 1 has de, en, fr."),
      (["--out", str(tmp_path / "new" / "m30k"), "--languages", "de",
        "--base_url", f"file://{tmp_path / 'nowhere'}"],
       f"Cannot download file://{tmp_path / 'nowhere'}/train.de.gz: <urlopen "
       f"error [Errno 2] No such file or directory: "
       f"'{tmp_path / 'nowhere'}/train.de.gz'>."),
  ]
  for args, message in cases:
    assert fetch_multi30k.main(args) == 1, args
    assert capsys.readouterr().err == f"fetch_multi30k.py: {message}\n"
  assert sorted(os.listdir(tmp_path)) == ["afile"]  # no folder left behind
  assert (tmp_path / "afile").read_text() == "x"


def test_a_url_urllib_refuses_is_a_fetch_error(tmp_path):
  with pytest.raises(fetch_multi30k.FetchError,
                     match="^Cannot download notaurl/val.de.gz: unknown url"):
    fetch_multi30k.fetch_file("notaurl/val.de.gz", str(tmp_path / "v.gz"), 1)
  assert os.listdir(tmp_path) == []


def test_a_folder_that_takes_no_file_is_named(tmp_path, monkeypatch):
  # A read-only or full --out: the temporary file cannot be made (root
  # ignores permission bits, so the refusal is made here).
  out = tmp_path / "out"
  out.mkdir()

  def refused(**kwargs):
    del kwargs
    raise PermissionError(13, "Permission denied")

  monkeypatch.setattr(fetch_multi30k.tempfile, "mkstemp", refused)
  with pytest.raises(fetch_multi30k.FetchError) as error:
    fetch_multi30k.fetch_file("file:///nowhere/val.de.gz",
                              str(out / "val.de.gz"), 1014)
  assert str(error.value) == f"Cannot write into {out}: Permission denied."
  assert not os.listdir(out)
