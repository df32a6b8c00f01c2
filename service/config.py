"""The one settings class (environment prefix ``DPRELEASE_``).

Embedded mode is what you get with no configuration: a SQLite ledger and an object store in a
local directory under ``DPRELEASE_HOME``, with jobs run in-process by the same task code the
Celery worker runs. Real mode is selected by pointing the database at Postgres; it then refuses
the embedded conveniences that would be unsafe in production (a generated admin key, a local
object store, in-process jobs).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from limits import parse_many
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DPRELEASE_", extra="ignore")

    home: Path = Field(default=Path("var"), description="Data directory of the embedded mode")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; unset: SQLite under home (embedded mode)"
    )
    celery_broker_url: str | None = Field(
        default=None, description="Celery broker (Redis); unset: jobs run in-process"
    )
    s3_endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint")
    s3_bucket: str | None = Field(default=None, description="Bucket for raw data and releases")
    s3_public_endpoint_url: str | None = Field(
        default=None, description="Endpoint put in presigned download URLs (default: endpoint)"
    )
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    admin_key: SecretStr | None = Field(
        default=None, description="The first admin API key; generated in embedded mode if unset"
    )
    max_upload_bytes: int = Field(
        default=512 * 1024 * 1024, gt=0, description="Largest dataset file (413 above)"
    )
    max_request_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Largest body of any request but an upload (413)"
    )
    rate_limit: str = Field(
        default="50/second;2400/minute",
        description="Requests per API key, in `limits` notation ('N/second;M/minute'); "
        "empty: no limit",
    )
    redis_url: str | None = Field(
        default=None,
        description="Redis shared by API processes for rate limits; unset: the Celery broker "
        "when it is Redis, else counted in-process",
    )
    max_release_samples: int = Field(default=10_000_000, gt=0)
    task_max_attempts: int = Field(default=3, ge=1, le=10)
    task_retry_window_s: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="Seconds a job's retries wait in all, spread over its attempts with a "
        "doubling back-off (worker.attempts.retry_delay): a store or database outage shorter "
        "than this does not fail the release; 0: retry at once",
    )
    celery_visibility_timeout: int = Field(
        default=6 * 3600,
        ge=1,
        description="Seconds a job may stay unacknowledged before Redis hands it to another "
        "worker (how long a dead worker's job waits): keep it above the longest job",
    )
    cpu_queue: str = Field(
        default="celery",
        min_length=1,
        description="Celery queue of the mechanisms whose spec says queue 'cpu' (Celery's "
        "default queue, so a worker started without -Q consumes it)",
    )
    gpu_queue: str = Field(
        default="gpu",
        min_length=1,
        description="Celery queue of the mechanisms whose spec says queue 'gpu' (training "
        "jobs): consumed by workers that hold a GPU, or by every worker on a CPU-only host",
    )
    # Lanes (real mode): a job whose declared work passes long_job_work waits on its pool's
    # long queue, so that workers reading only the short queues never take one.
    long_job_work: float = Field(
        default=5e10,
        gt=0,
        description="Real mode: a release whose job's declared work (multiply-adds, from public "
        "figures at admission) is above this goes to its pool's long lane (DPRELEASE_LONG_QUEUE "
        "or DPRELEASE_GPU_LONG_QUEUE), the rest to the short lane (DPRELEASE_CPU_QUEUE, "
        "DPRELEASE_GPU_QUEUE); at or above DPRELEASE_MAX_JOB_WORK every job is short",
    )
    long_queue: str = Field(
        default="long",
        min_length=1,
        description="Celery queue of the CPU pool's long lane (jobs whose declared work passes "
        "DPRELEASE_LONG_JOB_WORK); a worker started without -Q consumes it besides the CPU queue",
    )
    gpu_long_queue: str = Field(
        default="gpu-long",
        min_length=1,
        description="Celery queue of the GPU pool's long lane (jobs whose declared work passes "
        "DPRELEASE_LONG_JOB_WORK)",
    )
    sweep_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="Seconds between passes of the outbox sweeper of each API process (one at "
        "start-up, then on this schedule); 0: no sweeper",
    )
    sweep_queued_after_s: float = Field(
        default=300.0,
        gt=0,
        description="A release still queued this long after it was last handed to the "
        "dispatcher is handed over again by the sweeper (the broker was down, or lost it)",
    )
    sweep_running_after_s: float = Field(
        default=6 * 3600.0,
        gt=0,
        description="A release running with no sign of life (start, progress) for this long "
        "is queued again and handed over by the sweeper if it has attempts left, else ended "
        "failed, settled from its upload claim: keep it above the longest stretch a job runs "
        "without writing progress",
    )
    sweep_lease_s: float = Field(
        default=120.0,
        gt=0,
        description="How long a sweeper's lease (table sweeper_leases) keeps the other API "
        "processes from sweeping; renewed at each pass, so keep it above sweep_interval_s",
    )
    # Health, readiness and metrics.
    ready_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="Seconds each readiness check (database, broker, store) may take before "
        "GET /ready answers 503",
    )
    worker_metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Port on which a Celery worker serves its Prometheus metrics (job "
        "durations); 0: none",
    )
    # Downloads: how an S3-stored file reaches its downloader. A presigned
    # URL is checked by the object store alone, so it outlives a grant's revocation by at
    # most its lifetime; hence a short one, or streaming through the API (grant checked when
    # the bytes are sent). The local store of embedded mode is always served by the API.
    download_mode: Literal["presigned", "stream"] = Field(
        default="presigned",
        description="S3 downloads: 'presigned' (307 to a URL valid s3_presign_seconds) or "
        "'stream' (the API streams the object, checking access at request time)",
    )
    s3_presign_seconds: int = Field(
        default=60,
        gt=0,
        le=3600,
        description="Lifetime of presigned download URLs: how long one can outlive the "
        "revocation of the grant (or key) it was issued under",
    )
    download_chunk_bytes: int = Field(
        default=1024 * 1024,
        ge=64 * 1024,
        le=64 * 1024 * 1024,
        description="Chunk size of streamed downloads (memory per download in stream mode)",
    )
    summary_max_bytes: int = Field(
        default=256 * 1024**2,
        gt=0,
        description="Largest release file GET /releases/{id}/summary reads (chunk by chunk; "
        "its time grows with the file); larger ones answer 409 summary_too_large",
    )
    max_concurrent_summaries: int = Field(
        default=2,
        ge=1,
        description="Release summaries one API process computes at once; one more is refused "
        "with 503 summaries_busy and Retry-After (a stored summary is served without a slot)",
    )
    max_concurrent_summaries_per_key: int = Field(
        default=1,
        ge=1,
        description="Release summaries one API key has computed at once in one API process; "
        "one more is refused with 503 summaries_busy and Retry-After",
    )
    # δ handled as a budget.
    delta_warning_ratio: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="A preview warns (delta_low) when the δ that would remain, as a fraction "
        "of the budget's δ, is below this times the fraction of ε that would remain: δ spent "
        "much faster than ε leaves later releases a small δ (more noise)",
    )
    # Bounded release jobs: the size cap, the scratch space and its disk check, and the
    # embedded job pool.
    max_release_bytes: int = Field(
        default=2 * 1024**3,
        gt=0,
        description="Largest release file, estimated before admission from public figures: "
        "rows x (features + classes) x bytes per value of the format (4 for NPZ and Parquet, "
        "16 for CSV); larger requests answer 422 release_too_large",
    )
    max_job_work: float = Field(
        default=2e13,
        gt=0,
        description="Largest job, in multiply-adds, as its mechanism's spec estimates it at "
        "admission from public figures (parameters, the dataset's shape): it bounds how long "
        "one release may hold a worker; larger requests answer 422 job_too_long",
    )
    scratch_dir: Path | None = Field(
        default=None,
        description="Where jobs write their scratch files (one dprelease-<pid>-* directory per "
        "job, removed when it ends; those of dead processes are removed at start); unset: the "
        "system's temporary directory",
    )
    scratch_margin_bytes: int = Field(
        default=256 * 1024**2,
        ge=0,
        description="Free disk a job leaves beyond its own estimated need: a job that would "
        "leave less fails before writing (still charged: it has read the private data by then)",
    )
    job_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Embedded mode: release jobs run at once, taken from per-owner queues in "
        "turn (so one owner's backlog does not hold up another's release)",
    )
    job_threads_per_owner: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Embedded mode: most release jobs one owner runs at once; unset: all job "
        "threads but one (at least one), so one owner's long jobs always leave a thread for "
        "another owner's release",
    )
    # One release, every format (service/releases/conversions.py).
    conversion_max_bytes: int = Field(
        default=2 * 1024**3,
        gt=0,
        description="Largest release file GET /releases/{id}/download?format= converts to "
        "another format (chunk by chunk: memory stays near one chunk, time and scratch disk "
        "grow with the file); larger ones answer 409 conversion_too_large",
    )
    max_concurrent_conversions: int = Field(
        default=2,
        ge=1,
        description="Format conversions one API process runs at once; one more is refused "
        "with 503 conversions_busy and Retry-After",
    )
    # Bounded uploads (service/upload_slots.py, datasets/parsing.py).
    # With the defaults one upload's parse peaks near max_upload_bytes + 2 x decoded + 10 B x
    # cells (about 3.2 GiB at most), and at most max_concurrent_uploads run per API process
    # (docs/operations.md, "Bounded uploads").
    max_concurrent_uploads: int = Field(
        default=2,
        ge=1,
        description="Uploads (POST /datasets) one API process reads and parses at once; one "
        "more is refused with 503 uploads_busy and Retry-After before its body is read",
    )
    max_concurrent_uploads_per_principal: int = Field(
        default=1,
        ge=1,
        description="Uploads one principal (all its keys together) has in progress at once in "
        "one API process; one more is refused with 503 uploads_busy and Retry-After before its "
        "body is read, so one tenant cannot take every upload slot",
    )
    upload_retry_after_s: int = Field(
        default=5, ge=1, description="Retry-After of the 503 answered to an upload over the cap"
    )
    # A slot is held while the body arrives: a client that trickles it would keep the slot
    # from every other tenant (service/upload_rate.py).
    upload_min_bytes_per_s: int = Field(
        default=16 * 1024,
        ge=0,
        description="Slowest an upload's body may arrive, in bytes per second over each "
        "window after the grace: a slower one is cut off with 408 upload_too_slow, nothing "
        "stored and its slot given back; 0: no minimum",
    )
    upload_rate_grace_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="Seconds of waiting for an upload's body before its rate is checked",
    )
    upload_rate_window_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="Seconds over which an upload's body rate is averaged: after the grace, "
        "each such stretch of waiting must bring upload_min_bytes_per_s x this many bytes",
    )
    max_upload_cells: int = Field(
        default=64_000_000,
        gt=0,
        description="Most values (rows x columns; NPZ: rows x features + labels) an upload may "
        "hold, read from its metadata (Parquet footer, .npy headers) or counted while a CSV "
        "is read in chunks: 413 dataset_too_large above, before decoding",
    )
    max_upload_features: int = Field(
        default=1_000_000,
        gt=0,
        description="Most features (columns besides the label; NPZ: values per record) an "
        "upload may have, read from its metadata (the .npy header, the Parquet footer, the "
        "CSV header line) before anything per feature is built: 413 dataset_too_large above",
    )
    max_upload_decoded_bytes: int = Field(
        default=1024 * 1024 * 1024,
        gt=0,
        description="Most bytes an upload's values may take once decoded (Parquet: the "
        "columns' Arrow widths; NPZ: the arrays the headers declare; CSV: the frame read so "
        "far): 413 dataset_too_large above, before decoding",
    )
    # Guidance before spending (service/releases/guidance.py).
    preview_noise_columns: int = Field(
        default=100,
        ge=0,
        le=100_000,
        description="POST /releases/preview lists the noise per feature column (noise_guide."
        "columns) for datasets of at most this many features; wider ones get the summary "
        "(min, median, max) only",
    )
    # Releases beyond one machine (worker/dask_release.py, docs/scaling.md).
    dask_scheduler: str | None = Field(
        default=None,
        description="Address of the dask.distributed scheduler that runs distributed releases "
        "(e.g. tcp://scheduler:8786); unset: a LocalCluster of dask_local_workers in the job's "
        "process. The cluster is trusted with the private data and its task timings",
    )
    dask_local_workers: int = Field(
        default=2, ge=1, le=64, description="Workers of the LocalCluster used without a scheduler"
    )
    # Sharded releases (worker/shards.py).
    shard_rows: int = Field(
        default=1_000_000,
        ge=0,
        description="A release of more rows than this, by a mechanism that can be sharded "
        "(GET /mechanisms: shardable) is drawn as shards of about this many rows with "
        "independent randomness, run by several Celery workers in parallel (in-process one "
        "after the other in embedded mode) and assembled into one file; 0: never shard",
    )
    max_shards: int = Field(
        default=64, ge=2, le=1024, description="The most shards one release is split into"
    )
    release_engine: Literal["local", "dask"] = Field(
        default="local",
        description="Where a release's rows are drawn: local (the job's process) or dask (the "
        "dask.distributed cluster of dask_scheduler, for the mechanisms and options whose "
        "Execution.distributed builds a job: DPMix record assignment, DP-CDA without DP "
        "statistics, DP class sizes, basis or post-processing; every other release runs "
        "locally). The release metadata's engine says which ran it",
    )
    dask_local_processes: bool = Field(
        default=True,
        description="The LocalCluster's workers are processes (false: threads of the job's "
        "process, e.g. tests)",
    )
    dask_row_group_rows: int = Field(
        default=100_000,
        ge=1,
        description="Rows per Parquet partition (one row group, one Dask task) of the dataset "
        "a dask release stages for the cluster (dask_staging)",
    )
    dask_staging: Literal["auto", "store", "scratch"] = Field(
        default="auto",
        description="Where a dask release stages the dataset's partitions for the cluster: "
        "store (objects under the release's prefix in the object store, read by the tasks "
        "through the S3 protocol with the DPRELEASE_S3_* endpoint and credentials: a remote "
        "cluster needs no shared filesystem), scratch (files in the job's scratch directory: "
        "the job's own LocalCluster, or a remote cluster that mounts DPRELEASE_SCRATCH_DIR at "
        "the same path), auto (store when dask_scheduler is set, else scratch). Removed when "
        "the job ends, however it ends",
    )
    run_migrations: bool = Field(default=True, description="Apply migrations at start")
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Where mechanisms run: CUDA when present under auto"
    )

    @property
    def embedded(self) -> bool:
        return self.database_url is None or self.database_url.startswith("sqlite")

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'dprelease.db').resolve()}"

    @property
    def rate_limit_storage_url(self) -> str:
        url = self.redis_url or self.celery_broker_url
        if url and url.startswith(("redis://", "rediss://", "unix://")):
            return url
        return "memory://"

    @field_validator("rate_limit")
    @classmethod
    def _rate_limit_parses(cls, value: str) -> str:
        if value.strip():
            try:
                parse_many(value)
            except ValueError as exc:
                raise ValueError(f"rate_limit {value!r} is not in `limits` notation") from exc
        return value

    @property
    def uses_s3(self) -> bool:
        return self.s3_endpoint_url is not None or self.s3_bucket is not None

    @model_validator(mode="after")
    def _refuse_unsafe_defaults(self) -> Settings:
        if self.uses_s3 and not self.s3_bucket:
            raise ValueError("DPRELEASE_S3_BUCKET is required when S3 is configured")
        if self.embedded:
            return self
        problems = []
        if self.admin_key is None:
            problems.append("DPRELEASE_ADMIN_KEY must be set (no generated key outside embedded)")
        elif len(self.admin_key.get_secret_value()) < 32:
            problems.append("DPRELEASE_ADMIN_KEY must be at least 32 characters")
        if not self.uses_s3:
            problems.append("DPRELEASE_S3_BUCKET (and endpoint) must be set: workers need S3")
        if not self.celery_broker_url:
            problems.append("DPRELEASE_CELERY_BROKER_URL must be set outside embedded mode")
        if problems:
            raise ValueError("unsafe configuration for real mode: " + "; ".join(problems))
        return self


@lru_cache
def get_settings() -> Settings:
    return Settings()
