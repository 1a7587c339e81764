"""The Kubernetes client's errors mapped once (praesto/kubeerrors.py): the class each status becomes,
and that what logs and status messages show of an error reads as it did before the mapping."""

from __future__ import annotations

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import api_exception

from praesto import kubeerrors
from praesto.kubeerrors import APIError, Conflict, Forbidden, Gone, Mapped, NotFound, Transient


@pytest.mark.parametrize(
    ("status", "kind"),
    [(404, NotFound), (409, Conflict), (403, Forbidden), (410, Gone), (429, Transient), (500, Transient),
     (503, Transient), (0, Transient), (401, APIError), (422, APIError)],
)  # fmt: skip
def test_each_status_maps_to_the_error_a_caller_acts_on(status: int, kind: type[APIError]) -> None:
    err = ApiException(status=status, reason="Some Reason")
    mapped = kubeerrors.mapped(err)
    assert mapped is not None and type(mapped).__mro__[1] is kind  # exactly that kind, not a sibling
    assert (mapped.status, mapped.reason, mapped.origin, mapped.answered) == (
        status,
        "Some Reason",
        err,
        True,
    )
    assert kubeerrors.is_transient(mapped) == kubeerrors.is_transient(err) == (kind is Transient)


def test_what_a_log_line_shows_reads_as_the_clients_error() -> None:
    """Lines print `type(err).__name__`, `str(err)` and `short_error(err)`: all as before."""
    err = ApiException(status=404, reason="Not Found")
    err.body = '{"kind": "Status", "message": "leases \\"x\\" not found", "code": 404}'
    mapped = kubeerrors.mapped(err)
    assert mapped is not None
    assert type(mapped).__name__ == "ApiException" and str(mapped) == str(err)
    assert kubeerrors.short_error(mapped) == kubeerrors.short_error(err) == "HTTP 404 Not Found"
    assert mapped.message == 'leases "x" not found'  # the Status message, never the whole body
    cut = urllib3.exceptions.MaxRetryError(None, "/api", "refused")  # type: ignore[arg-type]
    unreachable = kubeerrors.mapped(cut)
    assert isinstance(unreachable, Transient) and not unreachable.answered and unreachable.status is None
    assert type(unreachable).__name__ == "MaxRetryError"
    assert kubeerrors.short_error(unreachable) == kubeerrors.short_error(cut)


def test_the_dynamic_clients_errors_map_the_same() -> None:
    mapped = kubeerrors.mapped(api_exception(ApiException(status=409, reason="Conflict")))
    assert isinstance(mapped, Conflict) and mapped.status == 409


def test_a_mapped_group_raises_only_ours_with_the_clients_as_the_cause() -> None:
    class Group:
        def read(self, name: str) -> str:
            if name == "gone":
                raise ApiException(status=404, reason="Not Found")
            if name == "bug":
                raise ValueError("not an API error")
            return name

    group = Mapped(Group())
    assert group.read("here") == "here"
    with pytest.raises(NotFound) as found:
        group.read("gone")
    assert isinstance(found.value.__cause__, ApiException)
    with pytest.raises(ValueError):  # no API error: raised as it is
        group.read("bug")
    assert isinstance(group.unmapped, Group)
