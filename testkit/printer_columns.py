"""What `kubectl get` prints for one object: the API server's own Table rendering of the CRD's
additionalPrinterColumns (the server evaluates the jsonPaths, kubectl only lays the cells out)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def printed_columns(
    api: client.ApiClient, api_version: str, plural: str, namespace: str, name: str
) -> dict[str, Any]:
    """Column name -> cell, every column including priority > 0 (`kubectl get -o wide`)."""
    path = f"/apis/{api_version}/namespaces/{namespace}/{plural}/{name}"
    response = api.call_api(
        path,
        "GET",
        header_params={"Accept": TABLE},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _preload_content=False,  # the client's models know no Table: read the JSON as it came
    )
    table: dict[str, Any] = json.loads(response.data)
    assert table["kind"] == "Table", table
    (row,) = table["rows"]
    return {
        column["name"]: cell for column, cell in zip(table["columnDefinitions"], row["cells"], strict=True)
    }
