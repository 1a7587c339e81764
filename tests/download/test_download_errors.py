"""A download error's kind is its retry policy (#23 item 6): no flag that says "not retryable" on an
error the agent retries anyway. That a lasting error is still tried again, and recovers once the
source appears, is tests/agent/test_agent_flow.py::test_missing_repo_fails_then_recovers_when_it_appears."""

from __future__ import annotations

import pytest
from praesto.agent.download import DownloadError, LastingDownloadError, TemporaryDownloadError


def test_a_download_error_must_say_its_kind() -> None:
    with pytest.raises(TypeError, match="the kind is the retry policy"):
        DownloadError("SourceUnavailable", "the origin answered 503")


def test_temporary_errors_come_back_sooner_than_lasting_ones() -> None:
    temporary = TemporaryDownloadError("SourceUnavailable", "the origin answered 503")
    lasting = LastingDownloadError("SourceUnavailable", "the bucket does not exist")
    assert isinstance(temporary, DownloadError) and isinstance(lasting, DownloadError)
    assert (temporary.reason, temporary.message) == ("SourceUnavailable", "the origin answered 503")
    assert temporary.backoff_factor == 1.0 and lasting.backoff_factor == 4.0
