"""The namespace quota through the real API server: it calls our webhook, which counts from its watch.

The quota is the chart's value (tests/cluster/installed.py gives QUOTA_NAMESPACE
3Gi), reaching praesto-hooks as the rendered Deployment's environment.
"""

from __future__ import annotations

import time

import pytest
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ApiException as DynamicApiException

from praesto import names
from testkit.chart_install import ensure_namespace
from tests.cluster.installed import QUOTA_NAMESPACE, Installed
from tests.cluster.tenants import modelcache

GiB = 2**30


def _refusal(installed: Installed, obj: dict[str, object]) -> str:
    with pytest.raises((ApiException, DynamicApiException)) as err:
        installed.admin.create(obj)
    assert getattr(err.value, "status", None) == 403, err.value
    return str(getattr(err.value, "body", "") or err.value)


def _create_eventually(installed: Installed, obj: dict[str, object], deadline: float = 20.0) -> None:
    """The webhook counts from its watch: a deletion shows there a moment later."""
    end = time.monotonic() + deadline
    while True:
        try:
            installed.admin.create(obj)
            return
        except (ApiException, DynamicApiException) as err:
            if getattr(err, "status", None) != 403 or time.monotonic() > end:
                raise
            time.sleep(0.1)


def test_a_cache_over_the_namespace_quota_is_refused_with_used_requested_and_limit(
    installed: Installed,
) -> None:
    ensure_namespace(installed.admin, QUOTA_NAMESPACE)
    ensure_namespace(installed.admin, "quota-free")
    _create_eventually(installed, modelcache("first", QUOTA_NAMESPACE, storage={"size": "2Gi"}))
    message = ""
    end = time.monotonic() + 20
    while "used by its 1 other" not in message:  # until the watch has shown `first`
        assert time.monotonic() < end, message
        message = _refusal(installed, modelcache("second", QUOTA_NAMESPACE, storage={"size": "2Gi"}))
    assert f"quota of 3.0 GiB ({3 * GiB} bytes)" in message
    assert f"2.0 GiB ({2 * GiB} bytes) is used by its 1 other ModelCache(s)" in message
    assert f"requests 2.0 GiB ({2 * GiB} bytes)" in message and "namespaceQuota" in message
    installed.admin.create(modelcache("second", "quota-free", storage={"size": "2Gi"}))  # no quota there

    installed.admin.delete(names.API_VERSION, names.MODELCACHE_KIND, "first", QUOTA_NAMESPACE)
    _create_eventually(installed, modelcache("second", QUOTA_NAMESPACE, storage={"size": "2Gi"}))
