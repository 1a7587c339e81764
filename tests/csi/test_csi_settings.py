"""`praesto-csi`'s settings (#23 item 3): flags over environment, built once at the edge (cli.main),
every default the field's own, every refusal naming the flag and its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from praesto.csi import cli
from praesto.csi.registration import RegistrationOptions
from praesto.csi.settings import CsiSettings, SettingsError

ENV = {"NODE_NAME": "worker-1", "CSI_ENDPOINT": "unix:///plugin/csi.sock"}


def settings(env: dict[str, str], *flags: str) -> CsiSettings:
    """As cli.main builds them: the parser's defaults from `env`, then CsiSettings from the flags."""
    return CsiSettings.from_args(cli.build_parser(env).parse_args(list(flags)))


def test_the_defaults_are_the_fields_own() -> None:
    assert settings({}, "--node-name=n") == CsiSettings(node_name="n")


def test_the_variables_and_flags_reach_their_fields_and_a_flag_wins() -> None:
    assert settings(ENV) == CsiSettings(node_name="worker-1", endpoint="unix:///plugin/csi.sock")
    assert settings(ENV, "--node-name=w2", "--endpoint=unix:///other.sock") == CsiSettings(
        node_name="w2", endpoint="unix:///other.sock"
    )
    registered = settings(
        ENV, "--base-path=/mnt/ssd/praesto", "--unassigned-after=5", "--log-level=DEBUG",
        "--registration-dir=/registration", "--kubelet-endpoint=/var/lib/kubelet/plugins/csi.praesto.io/csi.sock",
        "--registration-check-seconds=2",
    )  # fmt: skip
    assert registered == CsiSettings(
        node_name="worker-1",
        endpoint="unix:///plugin/csi.sock",
        base_path=Path("/mnt/ssd/praesto"),
        unassigned_after=5.0,
        registration=RegistrationOptions(
            Path("/registration"), "/var/lib/kubelet/plugins/csi.praesto.io/csi.sock", 2.0
        ),
        log_level="DEBUG",
    )


@pytest.mark.parametrize(
    ("env", "flags", "refusal"),
    [
        ({}, [], "--node-name is required (or env NODE_NAME); set it from the Pod's spec.nodeName"),
        ({"NODE_NAME": ""}, [], "--node-name is required (or env NODE_NAME)"),
        (ENV, ["--base-path=praesto"], "--base-path 'praesto' must be an absolute path"),
        (ENV, ["--registration-dir=/registration"], "--kubelet-endpoint is required with the other"),
        (ENV, ["--kubelet-endpoint=/k/csi.sock"], "--registration-dir is required with the other"),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag_and_the_fix(
    env: dict[str, str], flags: list[str], refusal: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        settings(env, *flags)
    assert str(refused.value).startswith(refusal)


def test_the_edge_refuses_with_exit_2_before_serving(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--base-path=/var/praesto"], env={}) == 2
    assert "praesto-csi: --node-name is required (or env NODE_NAME)" in capsys.readouterr().err
