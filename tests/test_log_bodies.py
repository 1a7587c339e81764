"""--log-level DEBUG never prints an API answer: the agent reads Secrets through the Kubernetes client,
whose DEBUG lines are whole response bodies (kubernetes.client.rest "response body: ..."), so a
debug agent would write a tenant's Secret into its log (found by the node tier's upgrade test)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from praesto.cliargs import BODY_LOGGERS, LOG_LEVELS, configure_logging


@pytest.fixture
def restored() -> Iterator[None]:
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in BODY_LOGGERS)]
    levels = [lg.level for lg in loggers]
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


@pytest.mark.parametrize("level", LOG_LEVELS)
def test_the_api_clients_bodies_stay_out_of_the_log_at_every_level(level: str, restored: None) -> None:
    configure_logging(level, "%(message)s")
    logging.getLogger().setLevel(getattr(logging, level))  # basicConfig is a no-op under pytest's handlers
    assert not logging.getLogger("kubernetes.client.rest").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("praesto.agent").isEnabledFor(getattr(logging, level))


def test_the_agent_and_csi_command_lines_configure_logging_through_it() -> None:
    """Both processes that talk to the API server set their level through configure_logging."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for cli in ("agent/cli.py", "csi/cli.py"):
        text = (root / cli).read_text()
        assert "configure_logging(" in text and "logging.basicConfig(" not in text, cli
