"""The mount's Prometheus endpoint (--metrics-addr): its own counters, read at scrape time."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import trio
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ckptfs.common.config import metrics_address
from ckptfs.common.latency import FUSE_BUCKETS, LatencyTable
from ckptfs.common.redact import redact
from ckptfs.fs.filesystem import CheckpointFS

log = logging.getLogger(__name__)

#: seconds between two looks at whether the mount is durable (ckptfs_seconds_since_durable)
DURABLE_POLL = 1.0


@dataclass(frozen=True)
class Sample:
    """Everything one scrape reports, read in trio's thread at once."""

    stats: dict[str, Any]  # MountStatistics as a dict
    queued_jobs: int
    evicted_bytes: int
    fetched_chunks: int
    lost_files: int
    since_durable: float
    store_rows: list[Any]
    store_errors: dict[tuple[str, str], int]
    fuse_rows: list[Any]
    fuse_errors: dict[tuple[str, str], int]
    fast: dict[str, Any] | None = None  # with --fast-tier: Health's and Mover's statistics


class MountCollector(Collector):
    """Turns one Sample, taken by `sample` at each scrape, into metric families."""

    def __init__(self, sample: Callable[[], Sample], version: str, store_url: str,
                 store_buckets: tuple[float, ...]) -> None:
        self.sample = sample
        self.version = version
        self.store_url = redact(store_url)  # a label: no credential (redact.py)
        self.store_buckets = store_buckets

    def collect(self) -> Iterator[Metric]:
        s = self.sample()
        st = s.stats
        info = InfoMetricFamily("ckptfs", "the ckptfs version and the store this mount serves")
        info.add_metric([], {"version": self.version, "store": self.store_url})
        yield info
        for name, field, text in COUNTERS:
            yield CounterMetricFamily(name, text, value=st[field])
        yield CounterMetricFamily("ckptfs_cache_evicted_bytes", "bytes of clean data "
                                  "evicted from the cache directory", value=s.evicted_bytes)
        yield CounterMetricFamily("ckptfs_fetched_chunks", "chunks fetched from the store",
                                  value=s.fetched_chunks)
        for name, field, text in GAUGES:
            yield GaugeMetricFamily(name, text, value=st[field])
        yield GaugeMetricFamily("ckptfs_upload_queue_jobs", "upload jobs queued, not yet "
                                "taken by a worker", value=s.queued_jobs)
        yield GaugeMetricFamily("ckptfs_durable", "1 when everything written on this node "
                                "is in the store, else 0", value=int(st["durable"]))
        yield GaugeMetricFamily("ckptfs_seconds_since_durable", "seconds since the mount was "
                                "last seen durable (0 while it is)", value=s.since_durable)
        yield GaugeMetricFamily("ckptfs_lost_files", "files that lost data before it reached "
                                "the store (DATA LOST in ckptfs status)", value=s.lost_files)
        retries = CounterMetricFamily("ckptfs_retries", "tries made again after a failed "
                                      "store request, by what was retried", labels=["what"])
        for what, n in sorted(st["retries"].items()):
            retries.add_metric([what], n)
        yield retries
        retrying = st["retrying_since"]
        yield GaugeMetricFamily("ckptfs_upload_failing_seconds", "seconds since the first "
                                "upload failure of the current run of failures (0: none)",
                                value=max(0.0, time.time() - retrying) if retrying else 0.0)
        yield histogram("ckptfs_store_request_duration_seconds", "store requests by kind and "
                        "their latency", "kind", s.store_rows, self.store_buckets)
        yield errors("ckptfs_store_request_errors", "store requests that raised, by kind and "
                     "error class", ("kind", "error"), s.store_errors)
        yield histogram("ckptfs_fuse_request_duration_seconds", "FUSE requests by operation "
                        "and their latency", "op", s.fuse_rows, FUSE_BUCKETS)
        yield errors("ckptfs_fuse_request_errors", "FUSE requests answered with an error, by "
                     "operation and errno", ("op", "errno"), s.fuse_errors)
        if s.fast is not None:
            yield from fast_tier(s.fast)
            yield from fast_tier_metrics(s.fast)


def fast_tier(st: dict[str, Any]) -> Iterator[Metric]:
    """A fast tier's health (--fast-tier): usable or not, and what bypassed it."""
    yield GaugeMetricFamily("ckptfs_fast_tier_usable", "1 while the fast tier takes writes, "
                            "0 while they go straight to the store", value=int(st["fast_usable"]))
    yield CounterMetricFamily("ckptfs_fast_tier_unusable_episodes", "times the fast tier was "
                              "found unusable", value=st["fast_unusable_episodes"])
    yield CounterMetricFamily("ckptfs_fast_tier_direct_bytes", "bytes written straight to the "
                              "store while the fast tier was unusable",
                              value=st["fast_direct_bytes"])
    yield CounterMetricFamily("ckptfs_fast_tier_direct_ops", "metadata ops applied straight to "
                              "the store while the fast tier was unusable",
                              value=st["fast_direct_ops"])


#: (metric, MountStatistics field, help) of the counters the mount keeps
COUNTERS = (
    ("ckptfs_written_bytes", "written_bytes", "bytes written through the mount"),
    ("ckptfs_uploaded_bytes", "uploaded_bytes", "raw bytes of the chunks PUT"),
    ("ckptfs_stored_bytes", "stored_bytes", "bytes of the chunk objects PUT, as stored "
     "(after compression)"),
    ("ckptfs_deduplicated_bytes", "dedup_bytes", "raw bytes of published chunks that "
     "needed no PUT: the store had them"),
    ("ckptfs_published_bytes", "logical_bytes", "size of the file versions published"),
    ("ckptfs_fetched_bytes", "fetched_bytes", "raw bytes of the chunks fetched"),
    ("ckptfs_cache_hits", "cache_hits", "chunk reads served from memory or the cache "
     "directory"),
    ("ckptfs_cache_misses", "cache_misses", "chunk reads that had to fetch"),
)
#: (metric, MountStatistics field, help) of the levels
GAUGES = (
    ("ckptfs_dirty_bytes", "dirty_bytes", "bytes written on this node not yet in the store"),
    ("ckptfs_uploading_bytes", "uploading_bytes", "raw bytes of the chunks being uploaded "
     "or waiting to retry"),
    ("ckptfs_pending_chunks", "pending_chunks", "journaled chunks not yet in the store"),
    ("ckptfs_pending_metadata_ops", "pending_ops", "metadata ops (manifests, markers, "
     "deletes, renames) not yet applied"),
    ("ckptfs_open_files", "open_files", "files with unpublished modifications"),
    ("ckptfs_cache_bytes", "cache_bytes", "bytes in the cache directory"),
    ("ckptfs_cache_limit_bytes", "cache_limit", "--cache-size"),
    ("ckptfs_cache_memory_bytes", "memory_bytes", "fetched chunks held in memory"),
    ("ckptfs_upload_rate_bytes", "upload_rate", "raw bytes per second PUT over the last 5 s"),
)


# -- the fast tier (--fast-tier): what this mount's mover has still to move, and moved

#: (metric, Mover.statistics field, help) of the fast tier's levels
FAST_GAUGES = (
    ("ckptfs_fast_tier_pending_records", "fast_pending_records", "this mount's pending "
     "records: ops in the fast tier not yet applied to the object store"),
    ("ckptfs_fast_tier_pending_bytes", "fast_pending_bytes", "size of the files this "
     "mount's pending records hold: in the fast tier, not yet in the object store"),
)
#: (metric, Mover.statistics field, help) of the fast tier's counters
FAST_COUNTERS = (
    ("ckptfs_fast_tier_moved_records", "fast_moved_records", "pending records moved to "
     "the object store (this mount's, and those of lost mounts it took over)"),
    ("ckptfs_fast_tier_moved_bytes", "fast_moved_bytes", "size of the files those "
     "records published in the object store"),
    ("ckptfs_fast_tier_copied_bytes", "fast_copied_bytes", "bytes of the chunk objects "
     "copied from the fast tier to the object store, as stored"),
    ("ckptfs_fast_tier_lost_chunks", "fast_lost_chunks", "chunks a moved file named that "
     "were in neither tier (or damaged in the fast tier): DATA LOST in the log"),
)


def fast_tier_metrics(st: dict[str, Any]) -> Iterator[Metric]:
    """The fast tier's families, from the mover's statistics."""
    for name, field, text in FAST_GAUGES:
        yield GaugeMetricFamily(name, text, value=st[field])
    for name, field, text in FAST_COUNTERS:
        yield CounterMetricFamily(name, text, value=st[field])


def histogram(name: str, text: str, label: str, rows: list[Any],
              bounds: tuple[float, ...]) -> HistogramMetricFamily:
    """A histogram family of LatencyTable rows (its buckets made cumulative)."""
    family = HistogramMetricFamily(name, text, labels=[label])
    for row in rows:
        total, buckets = 0, []
        for bound, n in zip((*map(repr, bounds), "+Inf"), row.counts, strict=True):
            total += n
            buckets.append((bound, total))
        family.add_metric([row.kind], buckets, row.seconds)
    return family


def errors(name: str, text: str, labels: tuple[str, str],
           counts: dict[tuple[str, str], int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, text, labels=list(labels))
    for key, n in sorted(counts.items()):
        family.add_metric(list(key), n)
    return family


class MetricsServer:
    """The HTTP endpoint of one mount: started before the mount is reported ready,
    stopped before trio's loop ends (a scrape reads the mount in trio's thread)."""

    def __init__(self, addr: str, fs: CheckpointFS, store_requests: LatencyTable,
                 fuse_requests: LatencyTable, version: str, store_url: str,
                 fast: Callable[[], dict[str, Any]] | None = None) -> None:
        self.host, self.port = metrics_address(addr)
        self.fs = fs
        self.fast = fast  # with --fast-tier: its health's statistics
        self.store_requests = store_requests
        self.fuse_requests = fuse_requests
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MountCollector(self.sample_from_thread, version, store_url,
                                              store_requests.buckets))
        self.last_durable = time.monotonic()
        self._token: trio.lowlevel.TrioToken | None = None
        self._server: Any = None
        self.address: str | None = None  # HOST:PORT, once listening

    def start(self) -> None:
        """Listen (in trio's thread; the HTTP server runs in a thread of its own)."""
        self._token = trio.lowlevel.current_trio_token()
        self._server, _ = start_http_server(self.port, self.host, self.registry)
        port = self._server.server_port
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.address = f"{host}:{port}"
        log.info("metrics on http://%s/metrics", self.address)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    async def watch_durable(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                            ) -> None:
        """Notes, every DURABLE_POLL seconds, whether the mount is durable."""
        task_status.started()
        while True:
            if self.fs.durable():
                self.last_durable = time.monotonic()
            await trio.sleep(DURABLE_POLL)

    def sample_from_thread(self) -> Sample:
        assert self._token is not None
        return trio.from_thread.run_sync(self.sample, trio_token=self._token)

    def sample(self) -> Sample:
        fs = self.fs
        st = fs.statistics()
        if st.durable:
            self.last_durable = time.monotonic()
        return Sample(
            stats=st.__dict__.copy(), queued_jobs=fs.uploader.statistics().queued_jobs,
            evicted_bytes=fs.cache.evicted_bytes,
            fetched_chunks=fs.fetcher.statistics().fetched_chunks,
            lost_files=len(fs.uploader.lost_files()),
            since_durable=round(time.monotonic() - self.last_durable, 3),
            store_rows=self.store_requests.rows(), store_errors=self.store_requests.errors(),
            fuse_rows=self.fuse_requests.rows(), fuse_errors=self.fuse_requests.errors(),
            fast=self.fast() if self.fast is not None else None)
