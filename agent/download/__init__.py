"""Downloader shared by the agent, the PVC-mode Job and users.

The download core: the types every part shares (api.py), the engine, transports, publication.
`plan(source, options)` and `download(plan, dest, options, sources)` live in
`praesto.agent.download.fetch`, which joins this core and the origins (one package per kind):
plan resolves a source to a revision and its files (no bytes yet, so capacity can be checked
first); download fetches, verifies and publishes atomically. Failures are `DownloadError` with a reason from `REASONS`; its kind (`TemporaryDownloadError`,
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
]
