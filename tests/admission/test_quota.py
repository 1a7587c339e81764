"""The namespace quota on cached bytes: the validating webhook refuses what would exceed it.

Issue #12 (7): a tenant could declare any number of caches of any size. The
refusal states used, requested and limit, and names the chart key to raise.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from praesto.hooks.admission import review
from praesto.hooks.admission.lookup import StaticLookups
from praesto.hooks.admission.validate import validate

from praesto import names
from praesto.quota import QuotaError, Quotas, parse_quotas
from testkit.admission_objects import NS

GiB = 2**30
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache(name: str, size: str, namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.MODELCACHE_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"source": {"huggingface": {"repo": "org/m", "revision": COMMIT}}, "storage": {"size": size}},
    }


def create(obj: dict[str, Any], lookups: StaticLookups, quotas: Quotas) -> dict[str, Any]:
    body = {
        "apiVersion": review.API_VERSION,
        "kind": review.KIND,
        "request": {"uid": "u", "operation": "CREATE", "namespace": NS, "object": obj, "oldObject": None},
    }
    response: dict[str, Any] = validate(review.parse_review(body), lookups, quotas=quotas)["response"]
    return response


def existing(*caches: dict[str, Any]) -> StaticLookups:
    return StaticLookups(modelcaches={(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in caches})


QUOTAS = Quotas(default=10 * GiB, namespaces={"unlimited-team": 10**15})


def test_a_cache_that_takes_the_namespace_over_its_quota_is_refused_with_the_numbers() -> None:
    lookups = existing(cache("a", "4Gi"), cache("b", "3Gi"), cache("elsewhere", "100Gi", namespace="other"))
    answer = create(cache("c", "5Gi"), lookups, QUOTAS)
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    message = answer["status"]["message"]
    assert message.startswith("spec.storage.size: ")
    assert f"quota of 10.0 GiB ({10 * GiB} bytes)" in message  # limit
    assert f"7.0 GiB ({7 * GiB} bytes) is used by its 2 other ModelCache(s)" in message  # used (not other's)
    assert f"requests 5.0 GiB ({5 * GiB} bytes)" in message  # requested
    assert "namespaceQuota" in message


def test_within_the_quota_is_allowed_and_exactly_the_limit_too() -> None:
    lookups = existing(cache("a", "4Gi"))
    assert create(cache("c", "6Gi"), lookups, QUOTAS)["allowed"] is True
    assert create(cache("c", "7Gi"), lookups, QUOTAS)["allowed"] is False


def test_no_quota_configured_means_no_limit_and_no_lookup() -> None:
    down = StaticLookups(unavailable="API down")
    assert create(cache("c", "1Pi"), down, Quotas())["allowed"] is True


def test_a_quota_that_cannot_be_checked_refuses_rather_than_guesses() -> None:
    answer = create(
        cache("c", "1Gi"), StaticLookups(unavailable="the ModelCache cache is not loaded yet"), QUOTAS
    )
    assert answer["allowed"] is False and answer["status"]["code"] == 503
    assert "could not count its ModelCaches" in answer["status"]["message"]


def test_per_namespace_quota_overrides_the_default() -> None:
    big = Quotas(default=1 * GiB, namespaces={NS: 100 * GiB})
    assert create(cache("c", "50Gi"), existing(), big)["allowed"] is True
    zero = Quotas(default=None, namespaces={NS: 0})
    assert create(cache("c", "1Ki"), existing(), zero)["allowed"] is False


def test_quota_setting_parses_the_chart_value_and_names_bad_keys() -> None:
    parsed = parse_quotas(json.dumps({"default": "200Gi", "namespaces": {"team-a": "1Ti", "sandbox": "0"}}))
    assert parsed.limit("team-a") == 2**40 and parsed.limit("sandbox") == 0 and parsed.limit("x") == 200 * GiB
    assert parse_quotas(json.dumps({"default": "", "namespaces": {}})) == Quotas()
    assert parse_quotas("") == Quotas()
    for bad, key in [
        ({"default": "lots"}, "namespaceQuota.default"),
        ({"namespaces": {"team-a": "-1Gi"}}, "namespaceQuota.namespaces.team-a"),
        ({"namespaces": {"Team_A": "1Gi"}}, "namespaceQuota.namespaces"),
        ({"defaults": "1Gi"}, "namespaceQuota.defaults"),
    ]:
        with pytest.raises(QuotaError, match=key.replace(".", r"\.")):
            parse_quotas(json.dumps(bad))
