"""Streaming from S3 (a real moto server) through the counting proxy of proxy.py: what is
downloaded, how often, and in how many requests."""

from __future__ import annotations

import logging
import os
import resource
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import txstore
from txstore.storage import TEMP_PREFIX
from txstore.store.cache import (
    PART_SIZE,
    STALE_PART_S,
    ChunkCache,
    Head,
    part_ranges,
    parts_around,
)

from .conftest import S3Server
from .proxy import Proxy, Rule

pytest.importorskip("torch")

from txstore.torch import StreamingDataLoader, StreamingDataset


def _options(server: S3Server, proxy: Proxy) -> dict[str, Any]:
    return dict(server.options, endpoint_url=proxy.endpoint)


def _chunk_gets(proxy: Proxy) -> list[tuple[str, int]]:
    """(path, bytes) of each GET of a chunk file the proxy passed on."""
    return [
        (path, n) for method, path, n in proxy.replied if method == "GET" and "/chunks/" in path
    ]


def _store(server: S3Server, n: int, pad: int, chunk_bytes: int) -> tuple[str, txstore.Store]:
    uri = f"s3://{server.new_bucket()}/data"
    store = txstore.create(uri, chunk_bytes=chunk_bytes, storage_options=server.options)
    store.append({"id": i, "pad": os.urandom(pad)} for i in range(n))
    return uri, store


def _s3(server: S3Server, uri: str, path: str) -> tuple[Any, str, str]:
    """A boto3 client straight to the server (not through s3fs or the proxy), and the bucket
    and key of ``path`` in the store at ``uri``."""
    import boto3

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    return client, bucket, f"{prefix}/{path}"


def _s3_object(server: S3Server, uri: str, path: str) -> bytes:
    client, bucket, key = _s3(server, uri, path)
    return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())


def _flip_in_store(server: S3Server, uri: str, path: str, offset: int) -> None:
    """The byte at ``offset`` of the store's object at ``path``, inverted in place."""
    client, bucket, key = _s3(server, uri, path)
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[offset] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))


def test_part_ranges_cover_the_object_once() -> None:
    assert part_ranges(0) == [(0, 0)]
    assert part_ranges(5, 8) == [(0, 5)]
    assert part_ranges(16, 8) == [(0, 8), (8, 16)]
    assert part_ranges(17, 8) == [(0, 8), (8, 16), (16, 17)]


def test_a_large_chunk_downloads_as_parts_and_decodes(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    size = 4096
    n = (2 * PART_SIZE) // size + 300  # one chunk of a little over two parts
    uri, store = _store(s3_server, n, size, chunk_bytes=4 * PART_SIZE)
    (chunk,) = store.snapshot().chunk_refs()
    snap = txstore.open(uri, storage_options=_options(s3_server, proxy)).snapshot()
    proxy.reset()
    cache = ChunkCache(snap.reader, str(tmp_path / "cache"), 10**10)
    fetched = cache.fetch(chunk, snap.version)
    gets = _chunk_gets(proxy)
    assert len(gets) == 3  # ceil(size / PART_SIZE) ranged GETs
    assert sum(n for _, n in gets) == chunk.size
    assert all(r.range.startswith("bytes=") for r in proxy.seen if "/chunks/" in r.path)
    samples = list(snap.reader.samples(fetched, chunk, snap.version))
    assert [s["id"] for s in samples] == list(range(n))
    assert samples[-1]["pad"] == store.snapshot()[n - 1]["pad"]
    assert (tmp_path / "cache" / chunk.path).stat().st_size == chunk.size
    cache.close()


def _mapped_from(folder: Path) -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if str(folder) in line]


def test_a_chunk_downloads_into_the_folder_once_and_is_read_from_its_file(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    """The parts of a chunk go into its file in the folder as they arrive: what is handed out
    is a map of that file (the chunk is never a whole buffer in memory), and the file is in
    place when ``fetch`` returns. A second cache on the folder (another worker) that asks
    for a chunk while it downloads waits on the first's lock, then reads its file."""
    uri, store = _store(s3_server, 1000, 200, chunk_bytes=10**5)
    refs = store.snapshot().chunk_refs()
    snap = txstore.open(uri, storage_options=_options(s3_server, proxy)).snapshot()
    folder = tmp_path / "cache"
    first = ChunkCache(snap.reader, str(folder), 10**10)
    fetched = first.fetch(refs[0], snap.version)
    assert (folder / refs[0].path).stat().st_size == refs[0].size
    assert _mapped_from(folder)  # handed out from the file, not from a joined copy
    samples = snap.reader.samples(fetched, refs[0], snap.version)
    assert [s["id"] for s in samples] == list(range(refs[0].num_samples))

    second = ChunkCache(snap.reader, str(folder), 10**10)
    proxy.reset(Rule(lambda r: "/chunks/" in r.path, "delay", times=10**6, delay=0.5))
    with ThreadPoolExecutor(1) as pool:
        downloading = pool.submit(first.fetch, refs[1], snap.version)
        time.sleep(0.2)
        again = second.fetch(refs[1], snap.version)
        fetched = downloading.result(timeout=60)
    ids = [s["id"] for s in snap.reader.samples(fetched, refs[1], snap.version)]
    assert ids == list(range(refs[0].num_samples, sum(c.num_samples for c in refs[:2])))
    assert [s["id"] for s in snap.reader.samples(again, refs[1], snap.version)] == ids
    assert sum(n for _, n in _chunk_gets(proxy)) == refs[1].size  # one download
    names = sorted(p.name for p in (folder / "chunks").iterdir())
    assert names == sorted(c.path.split("/")[-1] for c in refs[:2])  # no temporary file left
    first.close()
    second.close()


def test_a_folder_that_cannot_take_a_chunk_leaves_it_out_and_reads_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache is not the data: a chunk that cannot be written there is read all the same,
    with a warning naming it, and nothing of it is left in the folder."""
    store = txstore.create(str(tmp_path / "store"), chunk_bytes=10**5)
    store.append({"id": i, "pad": os.urandom(1000)} for i in range(300))
    snap = store.snapshot()
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "chunks").write_bytes(b"a file where the folder of chunks would go")
    cache = ChunkCache(snap.reader, str(folder), 10**10)
    with caplog.at_level(logging.WARNING, logger="txstore"):
        ids = []
        for chunk in snap.chunk_refs():
            fetched = cache.fetch(chunk, snap.version)
            ids += [s["id"] for s in snap.reader.samples(fetched, chunk, snap.version)]
            cache.release(chunk)
        cache.close()
    assert ids == list(range(300))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    left_out = [w for w in warned if "not kept in the cache" in w]
    assert len(left_out) == len(snap.chunk_refs()) >= 2
    assert snap.chunk_refs()[0].path in left_out[0]
    assert sorted(p.name for p in folder.iterdir()) == ["chunks", "locks"]


def test_a_chunk_with_dropped_fields_is_kept_and_read_by_frames(tmp_path: Path) -> None:
    """A chunk some of whose fields a later version dropped is read by frames, from the
    folder: its file is in place before its samples are read, and they lack the fields."""
    store = txstore.create(str(tmp_path / "store"), chunk_bytes=10**5)
    store.append({"id": i, "pad": os.urandom(500)} for i in range(300))
    store.drop_fields(["pad"])
    snap = store.snapshot()
    cache = ChunkCache(snap.reader, str(tmp_path / "cache"), 10**10)
    ids = []
    for chunk in snap.chunk_refs():
        fetched = cache.fetch(chunk, snap.version)
        assert (tmp_path / "cache" / chunk.path).stat().st_size == chunk.size
        samples = list(snap.reader.samples(fetched, chunk, snap.version))
        assert all(set(s) == {"id"} for s in samples)
        ids += [s["id"] for s in samples]
    cache.close()
    assert ids == list(range(300))


def test_a_killed_downloads_part_file_is_removed_once_stale(tmp_path: Path) -> None:
    """A worker killed mid-download leaves its part file; the next cache on the folder
    removes it once nothing has written to it for a while, and leaves a part file being
    written now and every cached chunk alone."""
    store = txstore.create(str(tmp_path / "store"))
    store.append({"id": i} for i in range(10))
    snap = store.snapshot()
    chunks = tmp_path / "cache" / "chunks"
    chunks.mkdir(parents=True)
    stale = chunks / f"{TEMP_PREFIX}{'a' * 32}.{'b' * 32}.chunk"
    live = chunks / f"{TEMP_PREFIX}{'c' * 32}.{'d' * 32}.chunk"
    kept = chunks / f"{'e' * 32}.chunk"
    old = time.time() - STALE_PART_S - 60
    for path in (stale, live, kept):
        path.write_bytes(b"part of a chunk")
    os.utime(stale, (old, old))
    os.utime(kept, (old, old))
    ChunkCache(snap.reader, str(tmp_path / "cache"), 10**10).close()
    assert sorted(p.name for p in chunks.iterdir()) == sorted([live.name, kept.name])


def test_a_folder_that_fills_up_during_a_download_reads_the_chunk_on(
    s3_server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write into the folder that fails partway (here the file size limit, as a quota or
    a full disk would) leaves the chunk out of the folder, not the read: it is read into
    memory instead, with a warning, and no part file is left behind."""
    uri, store = _store(s3_server, 400, 2000, chunk_bytes=10**7)
    (chunk,) = store.snapshot().chunk_refs()
    snap = txstore.open(uri, storage_options=s3_server.options).snapshot()
    folder = tmp_path / "cache"
    cache = ChunkCache(snap.reader, str(folder), 10**10)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    quiet = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not the signal's kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (chunk.size // 3, limit[1]))
    try:
        with caplog.at_level(logging.WARNING, logger="txstore"):
            fetched = cache.fetch(chunk, snap.version)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, quiet)
    samples = list(snap.reader.samples(fetched, chunk, snap.version))
    assert [s["id"] for s in samples] == list(range(400))
    assert samples[-1]["pad"] == store.snapshot()[399]["pad"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("not kept in the cache" in w and chunk.path in w for w in warned), warned
    assert list((folder / "chunks").iterdir()) == []
    cache.close()


def test_a_dataloader_downloads_each_chunk_once(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    """Two workers share the middle chunk (each takes half the samples): it is downloaded
    once, the second worker waiting on the first's lock and reading its copy."""
    uri, store = _store(s3_server, 3000, 200, chunk_bytes=200_000)
    chunks = store.snapshot().chunks()
    assert len(chunks) >= 3
    proxy.reset()
    ds = StreamingDataset(
        uri, storage_options=_options(s3_server, proxy), cache_dir=str(tmp_path / "cache")
    )
    ids = [
        i for batch in StreamingDataLoader(ds, batch_size=50, num_workers=2) for i in batch["id"]
    ]
    assert sorted(ids) == list(range(3000))
    gets = _chunk_gets(proxy)
    assert sorted(p.rsplit("/", 1)[1] for p, _ in gets) == sorted(
        c.path.rsplit("/", 1)[1] for c in chunks
    )
    assert sum(n for _, n in gets) == sum(c.size for c in chunks)


def test_a_damaged_cached_copy_is_downloaded_again(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    uri, store = _store(s3_server, 1000, 100, chunk_bytes=50_000)
    cache = tmp_path / "cache"
    options = _options(s3_server, proxy)
    assert [
        s["id"] for s in StreamingDataset(uri, storage_options=options, cache_dir=str(cache))
    ] == list(range(1000))
    victim = store.snapshot().chunks()[1]
    copy = cache / victim.path
    data = bytearray(copy.read_bytes())
    data[len(data) // 3] ^= 0xFF
    copy.write_bytes(bytes(data))
    proxy.reset()
    again = StreamingDataset(uri, storage_options=options, cache_dir=str(cache))
    assert [s["id"] for s in again] == list(range(1000))
    assert [p.rsplit("/", 1)[1] for p, _ in _chunk_gets(proxy)] == [victim.path.rsplit("/", 1)[1]]
    assert copy.read_bytes() != bytes(data)  # repaired


def test_a_chunk_damaged_in_the_store_raises(s3_server: S3Server, tmp_path: Path) -> None:
    uri, store = _store(s3_server, 1000, 100, chunk_bytes=50_000)
    victim = store.snapshot().chunks()[2]
    _flip_in_store(s3_server, uri, victim.path, 100)
    ds = StreamingDataset(uri, storage_options=s3_server.options, cache_dir=str(tmp_path / "c"))
    with pytest.raises(txstore.ChecksumError, match=victim.path):
        list(ds)
    assert not (tmp_path / "c" / victim.path).exists()  # nothing damaged is kept
    assert not [p for p in (tmp_path / "c").rglob("*") if p.name.startswith(".tmp.")]


def test_zero_copy_views_keep_no_evicted_cache_file_mapped(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """Views of a zero-copy snapshot outlive the chunk they came from; a cache of a quarter
    of the store evicts that chunk's file. The views must not keep the deleted file (its disk
    space) alive: they refer to memory, not to a map of the file."""
    uri, store = _store(s3_server, 2000, 100, chunk_bytes=50_000)
    total = sum(c.size for c in store.snapshot().chunks())
    cache = tmp_path / "cache"
    snap = txstore.open(uri, storage_options=s3_server.options).snapshot().zero_copy()
    ds = StreamingDataset(snap, cache_dir=str(cache), max_cache_size=total // 4)
    kept = [s["pad"] for s in ds]  # every view held
    assert [bytes(v) for v in kept[:3]] == [bytes(v) for v in kept[:3]]
    assert len(kept) == 2000
    mapped = _mapped_from(cache)
    assert mapped == [], mapped[:3]


def _slow(proxy: Proxy) -> None:
    """Every reply held a little, so that requests sent together overlap clearly."""
    proxy.reset(Rule(lambda r: True, "delay", times=10**6, delay=0.05))


def test_opening_a_dataset_waits_three_round_trips(s3_server: S3Server, proxy: Proxy) -> None:
    """HEAD; the manifest it names with a probe of the next version; every segment."""
    uri, store = _store(s3_server, 400, 10, chunk_bytes=4096)
    for _ in range(3):  # several segments
        store.append({"id": 0, "pad": b""} for _ in range(10))
    assert len(store.snapshot().manifest.segments) >= 2
    _slow(proxy)
    ds = StreamingDataset(uri, storage_options=_options(s3_server, proxy))
    assert len(ds) == 430
    assert proxy.round_trips() == 3, [(r.method, r.path) for r in proxy.seen]


def test_a_store_opened_again_finds_its_latest_version_in_one_round_trip(
    s3_server: S3Server, proxy: Proxy
) -> None:
    uri, store = _store(s3_server, 10, 10, chunk_bytes=4096)
    reader = txstore.open(uri, storage_options=_options(s3_server, proxy))
    assert reader.snapshot().version == 1
    _slow(proxy)
    assert reader.version == 1  # nothing new: HEAD and the next manifest, together
    assert proxy.round_trips() == 1
    for _ in range(3):
        store.append([{"id": 1, "pad": b""}])
    proxy.reset()
    assert reader.snapshot().version == 4  # later commits are found
    assert [s["id"] for s in reader.snapshot()][-3:] == [1, 1, 1]


# -- the first batch from its blocks, while the chunk downloads ------------------------------


def _range_start(request: Any) -> int:
    return int(request.range.removeprefix("bytes=").split("-")[0]) if request.range else -1


def test_a_cold_epoch_hands_out_its_first_sample_before_the_chunk_is_in(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    """The first sample of a chunk not yet downloaded comes from two round trips (its footer,
    then its block) while the download runs; the download takes those bytes from the reader,
    so nothing but the footer is fetched twice, and the file kept is the store's."""
    n = 2600  # one chunk of about 10.6 MB: more than a download part
    uri, store = _store(s3_server, n, 4096, chunk_bytes=4 * PART_SIZE)
    (chunk,) = store.snapshot().chunk_refs()
    assert chunk.size > PART_SIZE
    expected = store.snapshot()[0]
    cache = tmp_path / "cache"
    ds = StreamingDataset(uri, storage_options=_options(s3_server, proxy), cache_dir=str(cache))
    assert len(ds) == n
    # Every reply held a little; the download's own parts (neither the blocks read from the
    # file's start nor the footer) held long enough to be still out after the first sample.
    proxy.reset(
        Rule(
            lambda r: "/chunks/" in r.path and _range_start(r) not in (0, chunk.footer_offset),
            "delay",
            times=10**6,
            delay=2.0,
        ),
        Rule(lambda r: True, "delay", times=10**6, delay=0.05),
    )
    it = iter(ds)
    first = next(it)
    assert first == expected
    assert proxy.round_trips() == 2, [(r.path, r.range) for r in proxy.seen]
    assert not (cache / chunk.path).exists()  # the chunk itself is still on its way
    ids = [first["id"]] + [s["id"] for s in it]
    assert ids == list(range(n))
    assert (cache / chunk.path).read_bytes() == _s3_object(s3_server, uri, chunk.path)
    gets = _chunk_gets(proxy)
    footer = chunk.size - chunk.footer_offset
    assert sum(size for _, size in gets) == chunk.size + footer
    heads = [r for r in proxy.seen if "/chunks/" in r.path and _range_start(r) == 0]
    assert len(heads) == 1
    head_end = int(heads[0].range.split("-")[1]) + 1
    assert 4096 < head_end <= 2 * 65536  # the first block of 16 samples of 4 KiB, no more


def test_a_loader_reads_each_workers_first_batch_from_its_blocks(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    """Two workers start in the same chunk, one at its first sample and one halfway: each
    reads its first batch as blocks (the second's from the middle of the file), one of
    them downloads the chunk around them, and every sample arrives once."""
    n = 2600
    uri, store = _store(s3_server, n, 4096, chunk_bytes=4 * PART_SIZE)
    (chunk,) = store.snapshot().chunk_refs()
    cache = tmp_path / "cache"
    ds = StreamingDataset(uri, storage_options=_options(s3_server, proxy), cache_dir=str(cache))
    proxy.reset()
    ids = [
        int(i)
        for batch in StreamingDataLoader(ds, batch_size=32, num_workers=2)
        for i in batch["id"]
    ]
    assert sorted(ids) == list(range(n))
    assert (cache / chunk.path).read_bytes() == _s3_object(s3_server, uri, chunk.path)
    starts = sorted(_range_start(r) for r in proxy.seen if "/chunks/" in r.path)
    assert 0 in starts and any(0 < s < chunk.size // 2 < chunk.footer_offset for s in starts)
    assert starts.count(chunk.footer_offset) == 2  # each worker's footer read


def test_a_damaged_first_block_raises_and_nothing_is_kept(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """The blocks read for the first sample are checked frame by frame; the download that
    takes them is checked whole and not kept either."""
    uri, store = _store(s3_server, 2600, 4096, chunk_bytes=4 * PART_SIZE)
    (chunk,) = store.snapshot().chunk_refs()
    _flip_in_store(s3_server, uri, chunk.path, 100)  # in the first block's frames
    ds = StreamingDataset(uri, storage_options=s3_server.options, cache_dir=str(tmp_path / "c"))
    with pytest.raises(txstore.ChecksumError, match=chunk.path):
        next(iter(ds))
    assert not (tmp_path / "c" / chunk.path).exists()
    assert not [p for p in (tmp_path / "c").rglob("*") if p.name.startswith(TEMP_PREFIX)]


def test_a_download_around_a_readers_bytes_takes_them_from_it(
    s3_server: S3Server, proxy: Proxy, tmp_path: Path
) -> None:
    """``ChunkCache.fetch`` with a ``Head``: the bytes in it are not fetched, and are written
    in place; a reader's failure is the fetch's; bytes of the wrong length are corruption.
    Nothing is kept from a fetch that fails."""
    uri, store = _store(s3_server, 2600, 4096, chunk_bytes=4 * PART_SIZE)
    (chunk,) = store.snapshot().chunk_refs()
    whole = _s3_object(s3_server, uri, chunk.path)
    snap = txstore.open(uri, storage_options=_options(s3_server, proxy)).snapshot()
    start, end = 3_000_000, 3_500_000

    def head(data: bytes | BaseException) -> Head:
        future: Future[bytes] = Future()
        if isinstance(data, BaseException):
            future.set_exception(data)
        else:
            future.set_result(data)
        return Head(chunk.path, start, end, future)

    folder = tmp_path / "cache"
    failed = ChunkCache(snap.reader, str(folder), 10**10)
    with pytest.raises(txstore.StorageError, match="the reader's"):
        failed.fetch(chunk, snap.version, head(txstore.StorageError("the reader's")))
    with pytest.raises(txstore.CorruptError, match="shorter"):
        failed.fetch(chunk, snap.version, head(whole[start : end - 1]))
    assert not (folder / chunk.path).exists()
    assert not [p for p in folder.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    failed.close()

    proxy.reset()
    cache = ChunkCache(snap.reader, str(folder), 10**10)
    fetched = cache.fetch(chunk, snap.version, head(whole[start:end]))
    assert sum(size for _, size in _chunk_gets(proxy)) == chunk.size - (end - start)
    assert (folder / chunk.path).read_bytes() == whole
    ids = [s["id"] for s in snap.reader.samples(fetched, chunk, snap.version)]
    assert ids == list(range(2600))
    cache.close()


def test_parts_around_a_span_cover_the_rest_once() -> None:
    assert parts_around(20, (0, 5), 8) == [(5, 13), (13, 20)]
    assert parts_around(20, (6, 9), 4) == [(0, 4), (4, 6), (9, 13), (13, 17), (17, 20)]
    assert parts_around(20, (3, 20), 8) == [(0, 3)]
    assert parts_around(20, (0, 20), 8) == []
