"""kge.rowstore: calibrated rows persisted on disk (checksummed, atomic, shared between processes, bounded).

Rows here are synthetic and a pure function of their key (:func:`rows_of`), so any row a store serves can be
checked against what it must be, whichever process wrote it.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kge import rowstore
from kge.rowstore import RowStore, default_store_folder, row_fingerprint

ROOT = Path(__file__).resolve().parents[1]
N, R = 300, 7
FP = row_fingerprint(np.ones((N, 4), np.complex64), np.ones((R, 4), np.complex64), np.zeros((0, 3), np.int64),
                     threshold=2e-4, delta=0.0)
FORK = multiprocessing.get_context("fork")


def rows_of(keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row ``k``: ``k % 9`` entries (row 0, 9, ... empty), columns ``j*31 + k % 31`` ascending, values in (0, 1]."""
    keys = np.asarray(keys, dtype=np.int64)
    lens = keys % 9
    indptr = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    key = np.repeat(keys, lens)
    j = np.arange(int(indptr[-1])) - np.repeat(indptr[:-1], lens)
    cols = (j * 31 + key % 31).astype(np.int32)
    vals = (((key * 7 + j) % 100 + 1) / 100).astype(np.float32)
    return indptr, cols, vals


def open_store(folder, **kw) -> RowStore:
    kw.setdefault("max_bytes", 1 << 30)
    return RowStore.open(folder, fingerprint=kw.pop("fingerprint", FP), num_entities=N, num_relations=R, **kw)


def check_rows(store: RowStore, keys, expect_found=None) -> np.ndarray:
    """Look ``keys`` up; every row served must equal :func:`rows_of`'s, bit for bit.  Returns ``found``."""
    keys = np.asarray(keys, dtype=np.int64)
    found, indptr, cols, vals = store.lookup(keys)
    assert found.shape == keys.shape and found.dtype == bool
    assert indptr.dtype == np.int64 and cols.dtype == np.int32 and vals.dtype == np.float32
    e_ip, e_cols, e_vals = rows_of(keys[found])
    np.testing.assert_array_equal(indptr, e_ip)
    np.testing.assert_array_equal(cols, e_cols)
    np.testing.assert_array_equal(vals, e_vals)
    if expect_found is not None:
        np.testing.assert_array_equal(found, expect_found)
    return found


def segments(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(rowstore.SEGMENT_SUFFIX))


def append(store: RowStore, keys) -> int:
    return store.append(np.asarray(keys, dtype=np.int64), *rows_of(keys))


# ------------------------------------------------------------------ round trip
def test_round_trip_in_the_order_asked_with_duplicates_and_empty_rows(tmp_path):
    store = open_store(tmp_path / "s")
    keys = np.array([5, 18, 0, 9, 100, 2 * N + 1, R * N - 1])  # 0 and 9 and 18: empty rows
    assert append(store, keys) == len(keys)
    assert len(store) == len(keys)
    ask = np.array([100, 3, 5, 100, 0, R * N - 1, 4, 18])
    check_rows(store, ask, [True, False, True, True, True, True, False, True])
    # a fresh instance on the same folder reads the same rows from disk
    check_rows(open_store(tmp_path / "s"), ask, [True, False, True, True, True, True, False, True])


@pytest.mark.parametrize("gather", ["csr_row_index", "public scipy indexing"])
def test_rows_from_many_segments_come_in_the_order_asked(tmp_path, monkeypatch, gather):
    if gather != "csr_row_index":
        monkeypatch.setattr(rowstore, "_csr_row_index", None)
    store = open_store(tmp_path / "s")
    rng = np.random.default_rng(1)
    batches = np.array_split(rng.permutation(R * N)[:900], 6)
    for b in batches:
        append(store, b)
    assert len(segments(tmp_path / "s")) == 6
    ask = rng.choice(R * N, 3000)  # from every segment, interleaved, some twice, some not stored
    found = check_rows(open_store(tmp_path / "s"), ask)
    assert 0 < found.sum() < len(ask)
    check_rows(store, np.sort(batches[2]), np.ones(len(batches[2]), dtype=bool))  # one segment only


def test_empty_lookups_and_appends(tmp_path):
    store = open_store(tmp_path / "s")
    found, indptr, cols, vals = store.lookup(np.zeros(0, dtype=np.int64))
    assert found.shape == (0,) and indptr.tolist() == [0] and cols.size == 0 and vals.size == 0
    assert store.lookup([])[1].tolist() == [0]  # a plain empty list works too
    assert append(store, []) == 0
    assert segments(tmp_path / "s") == []
    check_rows(store, [1, 2], [False, False])  # nothing stored yet: all misses


def test_keys_already_stored_or_repeated_are_written_once(tmp_path):
    store = open_store(tmp_path / "s")
    assert append(store, [3, 4, 3]) == 2
    assert append(store, [4, 5, 5, 3]) == 1
    assert append(store, [3, 4, 5]) == 0
    assert len(segments(tmp_path / "s")) == 2
    check_rows(store, [3, 4, 5], [True, True, True])


def test_keys_out_of_range_are_a_clear_error(tmp_path):
    store = open_store(tmp_path / "s")
    with pytest.raises(IndexError, match=rf"row key {R * N} out of range \[0, {R * N}\)"):
        store.lookup([1, R * N])
    with pytest.raises(IndexError, match=r"row key -1 out of range"):
        store.lookup(np.array([-1, 2]))
    with pytest.raises(ValueError, match="keys must be a 1-D integer array"):
        store.lookup(np.array([1.5]))
    with pytest.raises(ValueError, match="keys must be a 1-D integer array"):
        store.lookup(np.array([[1]]))
    with pytest.raises(ValueError, match=r"row keys must lie in \[0, 2100\)"):
        append(store, [R * N])


@pytest.mark.parametrize("damage, message", [
    (lambda ip, c, v: (ip, c[::-1].copy(), v), "strictly ascending within each row"),
    (lambda ip, c, v: (ip, c + N, v), r"columns must lie in \[0, 300\)"),
    (lambda ip, c, v: (ip, c, v * 2), r"finite and in \[0, 1\]"),
    (lambda ip, c, v: (ip, c, np.where(v > 0.5, np.float32("nan"), v)), r"finite and in \[0, 1\]"),
    (lambda ip, c, v: (ip, c, v.astype(np.float64)), "vals must be a 1-D float32 array"),
    (lambda ip, c, v: (ip[:-1], c, v), "indptr has"),
    (lambda ip, c, v: (ip, c[:-1], v), "indptr must ascend from 0 to len"),
])
def test_append_refuses_rows_that_are_not_calibrated_rows(tmp_path, damage, message):
    store = open_store(tmp_path / "s")
    keys = np.array([8, 17])  # 8 entries each: reversing them unsorts a row
    with pytest.raises(ValueError, match=message):
        store.append(keys, *damage(*rows_of(keys)))
    assert segments(tmp_path / "s") == []


def test_bad_open_arguments(tmp_path):
    with pytest.raises(ValueError, match="fingerprint must be 64 lower-case hex digits"):
        open_store(tmp_path, fingerprint="abc")
    with pytest.raises(ValueError, match="max_bytes must be an integer > 0"):
        open_store(tmp_path, max_bytes=0)


def test_fingerprint_covers_what_rows_depend_on(monkeypatch, tmp_path):
    rng = np.random.default_rng(0)
    e = (rng.standard_normal((5, 3)) + 1j * rng.standard_normal((5, 3))).astype(np.complex64)
    r = (rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3))).astype(np.complex64)
    obs = np.array([[0, 1, 2]])
    base = row_fingerprint(e, r, obs, threshold=2e-4, delta=0.0)
    assert row_fingerprint(e.astype(np.complex128), r, obs.astype(np.int32), threshold=2e-4, delta=0.0) == base
    e2 = e.copy()
    e2[4, 2] += np.float32(1e-3)
    others = {row_fingerprint(e2, r, obs, threshold=2e-4, delta=0.0),
              row_fingerprint(e, r[::-1], obs, threshold=2e-4, delta=0.0),
              row_fingerprint(e, r, np.array([[0, 1, 3]]), threshold=2e-4, delta=0.0),
              row_fingerprint(e, r, obs, threshold=3e-4, delta=0.0),
              row_fingerprint(e, r, obs, threshold=2e-4, delta=0.1),
              row_fingerprint(e, r, obs, threshold=2e-4, delta=0.0, variant="cuda")}
    assert len(others) == 6 and base not in others
    monkeypatch.setenv("KGREASON_HOME", str(tmp_path))
    assert default_store_folder(base) == tmp_path / "rows" / base


# ------------------------------------------------------------------ other processes
def test_a_second_process_reads_the_rows_of_the_first(tmp_path):
    folder = tmp_path / "s"
    keys = np.arange(0, R * N, 11)
    assert append(open_store(folder), keys) == len(keys)
    code = f"""
import numpy as np, sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from test_kge_rowstore import open_store, check_rows
found = check_rows(open_store({str(folder)!r}), np.arange(0, {R * N}, 11))
print(int(found.sum()))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(len(keys))]


def test_a_reader_picks_up_segments_written_after_it_opened(tmp_path):
    reader = open_store(tmp_path / "s", refresh_s=3600)
    writer = open_store(tmp_path / "s")
    append(writer, [1, 2, 3])
    check_rows(reader, [1, 2, 3], [False, False, False])  # not listed again yet (refresh_s)
    reader.refresh_s = 0.0
    reader._next_scan = 0.0
    check_rows(reader, [1, 2, 3], [True, True, True])


def test_segments_another_process_evicts_are_served_or_missed_never_wrong(tmp_path):
    reader = open_store(tmp_path / "s", refresh_s=0.0)
    writer = open_store(tmp_path / "s", max_bytes=4000)
    append(writer, range(100, 130))
    check_rows(reader, range(100, 130), np.ones(30, dtype=bool))
    for a in range(200, 600, 30):  # the budget holds ~2 batches: the reader's segments are removed under it
        append(writer, range(a, a + 30))
    found = check_rows(reader, range(100, 600))
    assert not found[:100].any() and found[-10:].all()


def test_threads_share_one_store(tmp_path):
    import threading

    store = open_store(tmp_path / "s", refresh_s=0.0)
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(20):
                append(store, rng.choice(R * N, 40, replace=False))
                check_rows(store, rng.choice(R * N, 100))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    check_rows(open_store(tmp_path / "s"), np.arange(R * N))


def test_appends_written_in_the_background(tmp_path):
    store = open_store(tmp_path / "s")
    keys = np.arange(40, 400, dtype=np.int64)
    indptr, cols, vals = rows_of(keys)
    assert store.append(keys, indptr, cols, vals, wait=False) == len(keys)
    keys[:] = 0  # the caller's arrays are its own again once append returns
    cols[:] = 0
    with pytest.raises(ValueError, match="columns must be strictly ascending"):
        store.append(np.array([8]), np.array([0, 8]), np.zeros(8, np.int32), np.zeros(8, np.float32), wait=False)
    store.flush()
    check_rows(store, np.arange(40, 400), np.ones(360, dtype=bool))
    assert store.append(np.arange(500, 600), *rows_of(np.arange(500, 600)), wait=False) == 100
    store.close()  # writes what is queued first
    check_rows(open_store(tmp_path / "s"), np.arange(500, 600), np.ones(100, dtype=bool))


def test_rows_queued_in_the_background_are_written_before_the_process_exits(tmp_path):
    code = f"""
import numpy as np, sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from test_kge_rowstore import open_store, rows_of
keys = np.arange({R * N})
print(open_store({str(tmp_path / 's')!r}).append(keys, *rows_of(keys), wait=False))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stdout.split() == [str(R * N)], p.stderr
    check_rows(open_store(tmp_path / "s"), np.arange(R * N), np.ones(R * N, dtype=bool))


def _append_in_batches(folder, keys, batch):
    store = open_store(folder)
    for a in range(0, len(keys), batch):
        append(store, keys[a : a + batch])


def test_concurrent_appends_from_two_processes(tmp_path):
    folder = tmp_path / "s"
    open_store(folder)
    everything = np.arange(R * N)
    # overlapping halves, in different orders: both processes write many of the same rows at once
    a = everything[: 2 * R * N // 3]
    b = everything[R * N // 3 :][::-1].copy()
    procs = [FORK.Process(target=_append_in_batches, args=(folder, keys, 37)) for keys in (a, b)]
    for p in procs:
        p.start()
    reader = open_store(folder, refresh_s=0.0)
    while any(p.is_alive() for p in procs):
        check_rows(reader, np.random.default_rng(len(reader)).choice(R * N, 200))  # meanwhile: only whole rows
        time.sleep(0.01)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    check_rows(reader, everything, np.ones(R * N, dtype=bool))
    names = [p.name for p in (folder).iterdir()]
    assert not [n for n in names if "damaged" in n or n.startswith(".")], names


def _append_then_hang(folder, keys, ready):
    """Append ``keys``; stop for good halfway through writing the segment, after telling ``ready``."""
    real = rowstore._write_arrays

    def half(f, head, *arrays):
        real(f, head, *arrays[:2])
        f.flush()
        ready.set()
        time.sleep(120)

    rowstore._write_arrays = half
    append(open_store(folder), keys)


def test_a_writer_killed_mid_append_leaves_only_whole_rows(tmp_path, caplog):
    folder = tmp_path / "s"
    append(open_store(folder), np.arange(0, 100))
    ready = FORK.Event()
    child = FORK.Process(target=_append_then_hang, args=(folder, np.arange(100, R * N), ready))
    child.start()
    try:
        assert ready.wait(60), "the writer never started writing"
        parts = [p for p in folder.iterdir() if ".part-" in p.name]
        assert len(parts) == 1 and parts[0].stat().st_size > 0
        # While it writes, a reader (taking no lock) sees only the complete segment.
        check_rows(open_store(folder, readonly=True), np.arange(R * N), np.arange(R * N) < 100)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert [p for p in folder.iterdir() if ".part-" in p.name] == parts  # the killed writer's leftover
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        store = open_store(folder)  # the lock died with the writer: its leftover is removed
    assert not caplog.records
    assert not [p for p in folder.iterdir() if ".part-" in p.name]
    check_rows(store, np.arange(R * N), np.arange(R * N) < 100)
    assert append(store, np.arange(100, 200)) == 100  # and the lock is free for the next writer
    check_rows(open_store(folder), np.arange(200), np.ones(200, dtype=bool))


def _append_forever(folder):
    store = open_store(folder)
    rng = np.random.default_rng(os.getpid())
    while True:
        append(store, rng.choice(R * N, 300, replace=False))


def test_a_writer_killed_at_a_random_moment_never_leaves_a_wrong_row(tmp_path, caplog):
    folder = tmp_path / "s"
    open_store(folder)
    child = FORK.Process(target=_append_forever, args=(folder,))
    child.start()
    time.sleep(0.3 + np.random.default_rng().random() * 0.3)
    os.kill(child.pid, signal.SIGKILL)
    child.join(60)
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        found = check_rows(open_store(folder), np.arange(R * N))
    assert found.any()
    assert not caplog.records  # no segment was half written
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]


def test_a_leftover_is_kept_while_its_writer_holds_the_lock(tmp_path):
    import fcntl

    folder = tmp_path / "s"
    open_store(folder)
    leftover = folder / ".x.rows.part-abc"
    leftover.write_bytes(b"partial")
    with open(folder / rowstore.LOCK_NAME) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a live writer does
        open_store(folder)
        assert leftover.exists()
    open_store(folder)
    assert not leftover.exists()


# ------------------------------------------------------------------ damage
def _written(tmp_path, keys=range(0, 60)) -> tuple[Path, Path]:
    folder = tmp_path / "s"
    append(open_store(folder), np.asarray(list(keys)))
    (seg,) = segments(folder)
    return folder, seg


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _moved_aside(folder: Path, seg: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(seg.name + ".damaged-")]


@pytest.mark.parametrize("how, why", [
    ("truncate", "truncated"),
    ("empty", "truncated: 0 bytes"),
    ("header", "header does not match its checksum"),
    ("index", "key index does not match its checksum"),
    ("magic", "not a row-store segment"),
    ("longer", "too long"),
])
def test_a_damaged_segment_is_moved_aside_on_open(tmp_path, caplog, how, why):
    folder, seg = _written(tmp_path)
    size = seg.stat().st_size
    if how == "truncate":
        os.truncate(seg, size - 3)
    elif how == "empty":
        os.truncate(seg, 0)
    elif how == "header":
        _flip(seg, 20)  # N
    elif how == "index":
        _flip(seg, rowstore._HEADER.size + 8 * 5)  # the sixth key
    elif how == "magic":
        _flip(seg, 0)
    else:
        with open(seg, "ab") as f:
            f.write(b"\0" * 8)
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        store = open_store(folder)
    assert len(caplog.records) == 1
    assert why in caplog.text and "moved to" in caplog.text and "recomputed" in caplog.text
    assert not seg.exists() and len(_moved_aside(folder, seg)) == 1
    check_rows(store, range(60), np.zeros(60, dtype=bool))
    assert append(store, range(60)) == 60  # recomputed rows are stored again
    check_rows(open_store(folder), range(60), np.ones(60, dtype=bool))


def test_a_flipped_entry_byte_is_caught_on_first_use(tmp_path, caplog):
    folder, seg = _written(tmp_path)
    _flip(seg, seg.stat().st_size - 5)  # inside the last value
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        store = open_store(folder)  # the entries are checked on first use, not on open
        assert not caplog.records
        check_rows(store, [1, 2, 59, 1000], [False, False, False, False])
    assert len(caplog.records) == 1 and "entries do not match their checksum" in caplog.text
    assert store.damaged == 1 and not seg.exists() and len(_moved_aside(folder, seg)) == 1


def test_a_segment_of_other_rows_is_never_served(tmp_path, caplog):
    folder, seg = _written(tmp_path)
    other = "0" * 64
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        store = open_store(folder, fingerprint=other)  # e.g. a segment copied into another artifact's store
    assert "written for other rows" in caplog.text
    check_rows(store, range(60), np.zeros(60, dtype=bool))
    assert not seg.exists()


def test_a_segment_of_another_format_version_is_left_alone(tmp_path, caplog):
    folder, seg = _written(tmp_path)
    data = bytearray(seg.read_bytes())
    data[8:12] = (rowstore._VERSION + 1).to_bytes(4, "little")  # what a newer kgreason might write
    seg.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        store = open_store(folder)
        check_rows(store, range(60), np.zeros(60, dtype=bool))
    assert not caplog.records and seg.exists() and not _moved_aside(folder, seg)
    assert append(store, range(60)) == 60  # this version's copy of the rows beside it


def test_a_readonly_store_ignores_damage_and_writes_nothing(tmp_path, caplog):
    folder, seg = _written(tmp_path)
    _flip(seg, seg.stat().st_size - 5)
    store = open_store(folder, readonly=True)
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        check_rows(store, [1, 2], [False, False])
        check_rows(store, [1, 2], [False, False])
    assert len(caplog.records) == 1 and "ignored (read-only store)" in caplog.text
    assert seg.exists()  # left in place
    assert append(store, [200]) == 0 and len(segments(folder)) == 1
    missing = open_store(tmp_path / "none", readonly=True)  # a read-only store never creates its folder
    check_rows(missing, [1], [False])
    assert not (tmp_path / "none").exists()


def test_an_unwritable_folder_costs_only_the_recomputation(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        store = open_store(blocker / "s")
        assert append(store, [1, 2]) == 0
        check_rows(store, [1, 2], [False, False])
    assert len(caplog.records) == 1 and "cannot be written" in caplog.text
    assert store.readonly


def test_a_full_disk_while_writing_costs_only_the_recomputation(tmp_path, caplog, monkeypatch):
    folder = tmp_path / "s"
    store = open_store(folder)

    def full(f, head, *arrays):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rowstore, "_write_arrays", full)
    with caplog.at_level(logging.WARNING, logger="kge.rowstore"):
        assert append(store, [1, 2]) == 0
        assert append(store, [3]) == 0
    assert len(caplog.records) == 1 and "No space left on device" in caplog.text
    assert [p.name for p in folder.iterdir()] == [rowstore.LOCK_NAME]  # the temporary was removed


# ------------------------------------------------------------------ budget
def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def test_the_budget_is_never_exceeded_and_the_oldest_rows_go_first(tmp_path):
    folder = tmp_path / "s"
    one_batch = rowstore._HEADER.size + 8 + sum(16 + 8 * (k % 9) for k in range(100, 150))
    store = open_store(folder, max_bytes=3 * one_batch + 100)
    for a in range(0, 1000, 50):
        keys = np.arange(a, a + 50) + 100
        assert append(store, keys) == 50
        assert _folder_bytes(folder) <= store.max_bytes
    assert store.evicted > 0
    found = check_rows(open_store(folder, max_bytes=store.max_bytes), np.arange(100, 1100))
    assert found[-100:].all() and not found[:800].any()  # first in, first out


def test_a_large_batch_is_split_and_a_row_over_the_budget_is_not_stored(tmp_path):
    folder = tmp_path / "s"
    store = open_store(folder, max_bytes=4000)  # segments of about 1000 bytes
    keys = np.arange(1000, 1100)  # ~5,000 bytes of rows
    assert append(store, keys) == 100
    assert store.evicted > 0 and len(segments(folder)) >= 3 and _folder_bytes(folder) <= 4000
    found = check_rows(store, keys)
    assert found[-20:].all() and not found[:20].any()  # its first segments made room for its last ones
    tiny = open_store(tmp_path / "t", max_bytes=100)  # less than one segment's header and a row
    assert append(tiny, [5]) == 0 and segments(tmp_path / "t") == []


def test_damaged_files_count_against_the_budget_and_go_first(tmp_path):
    folder, seg = _written(tmp_path, range(100, 160))
    _flip(seg, 0)
    open_store(folder)
    (aside,) = _moved_aside(folder, seg)
    store = open_store(folder, max_bytes=aside.stat().st_size + 50)
    assert append(store, range(100, 160)) == 60
    assert not aside.exists() and _folder_bytes(folder) <= store.max_bytes
