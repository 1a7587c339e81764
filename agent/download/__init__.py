"""Downloader shared by the agent, the PVC-mode Job and users.

`plan(source, options)` resolves a source (hf://, s3://, gs://, az://) to a revision and its files (no bytes yet, so
capacity can be checked first); `download(plan, dest, options, sources)` fetches, verifies and
publishes atomically. Failures are `DownloadError` with a reason from `REASONS`; its kind (`TemporaryDownloadError`,
`LastingDownloadError`) is the retry policy.
"""

from praesto.agent.download.api import (
    REASONS,
    DownloadCancelled,
    DownloadError,
    EngineSettings,
    LastingDownloadError,
    Options,
    PartSources,
    Plan,
    ProgressCallback,
    RemoteFile,
    Result,
    TemporaryDownloadError,
)
from praesto.agent.download.download import download, plan

__all__ = [
    "REASONS",
    "DownloadCancelled",
    "DownloadError",
    "EngineSettings",
    "LastingDownloadError",
    "Options",
    "PartSources",
    "Plan",
    "ProgressCallback",
    "RemoteFile",
    "Result",
    "TemporaryDownloadError",
    "download",
    "plan",
]
