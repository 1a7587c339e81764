"""The HTTP edge: Flask routes around the pure hooks, plus /healthz and /metrics.

Metrics are recorded for every route through before/after request handlers,
so blueprints registered later (admission, node decorator) are measured too.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path

from flask import Flask, Response, g, request
from praesto.hooks import hook_protocol
from praesto.hooks.config import HooksConfig
from praesto.hooks.modelcache import HOOKS, Hook
from praesto.hooks.serving import worker_metrics
from praesto.hooks.serving.whole_request_worker import DEFAULT_MAX_REQUEST_BYTES
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

log = logging.getLogger(__name__)
MODELCACHE_PREFIX = "/hooks/modelcache"
METRICS_REGISTRY = "praesto.metrics"  # app.extensions key of the registry /metrics serves


def json_response(body: object, status: int = 200) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status=status, mimetype="application/json")


def error_response(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


def read_json_body() -> object:
    """The request's JSON, or raises hook_protocol.BadRequest with a message saying what is wrong."""
    raw = request.get_data(cache=False)
    if not raw:
        raise hook_protocol.BadRequest("request body is empty; send the hook request as JSON")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise hook_protocol.BadRequest(f"request body is not valid JSON: {err}") from None


def _hook_view(name: str, hook: Hook, config: HooksConfig) -> Response:
    try:
        body = read_json_body()
        return json_response(hook(body, config, datetime.now(UTC)))
    except hook_protocol.BadRequest as err:
        return error_response(400, str(err))


def _install_metrics(app: Flask, registry: CollectorRegistry) -> None:
    requests = Counter(
        "praesto_hooks_requests",
        "HTTP requests served, by route and status code",
        ["path", "method", "code"],
        registry=registry,
    )
    latency = Histogram(
        "praesto_hooks_request_duration_seconds",
        "Time spent answering a request, by route",
        ["path"],
        registry=registry,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    )

    @app.before_request
    def _start() -> None:
        g.praesto_started = time.perf_counter()

    @app.after_request
    def _record(response: Response) -> Response:
        # The route pattern, not the raw path: unknown URLs must not grow label sets.
        path = request.url_rule.rule if request.url_rule is not None else "unmatched"
        requests.labels(path, request.method, str(response.status_code)).inc()
        started = g.get("praesto_started")
        if started is not None:
            latency.labels(path).observe(time.perf_counter() - started)
        return response


def create_app(config: HooksConfig | None = None, *, metrics_dir: Path | None = None) -> Flask:
    """The WSGI app. `metrics_dir`: the multiprocess metrics directory praesto-hooks made
    (worker_metrics.enable) before this call; /metrics then sums every worker's files."""
    config = config or HooksConfig.from_env()
    app = Flask("praesto.hooks")
    app.config["PRAESTO_HOOKS_CONFIG"] = config
    # Hook requests carry a cache's children and related objects; a bound keeps a hostile body
    # from exhausting the container's memory. praesto-hooks refuses larger bodies before reading
    # them (hooks/serving/whole_request_worker.py) and sets this to its --max-request-bytes; this is the same bound for
    # other WSGI servers.
    app.config["MAX_CONTENT_LENGTH"] = DEFAULT_MAX_REQUEST_BYTES

    @app.errorhandler(413)
    def _too_large(_error: Exception) -> Response:
        limit = request.max_content_length
        return error_response(
            413,
            f"request body is over this server's limit of {limit} bytes "
            "(praesto-hooks --max-request-bytes, chart value hooks.maxRequestBytes)",
        )

    registry = CollectorRegistry()
    _install_metrics(app, registry)
    app.extensions[METRICS_REGISTRY] = registry  # what /metrics serves (docs/metrics.md is generated from it)

    for name, hook in HOOKS.items():
        app.add_url_rule(
            f"{MODELCACHE_PREFIX}/{name}",
            endpoint=f"modelcache_{name}",
            view_func=lambda name=name, hook=hook: _hook_view(name, hook, config),
            methods=["POST"],
        )

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/metrics")
    def metrics() -> Response:
        served = registry if metrics_dir is None else worker_metrics.registry_for_scrape(metrics_dir)
        return Response(generate_latest(served), mimetype=CONTENT_TYPE_LATEST)

    # ---- Blueprints of the other hook families are registered here ----
    # (admission webhooks, Node DecoratorController). Keep them below this line.
    from praesto.hooks.admission.http import blueprint as admission_blueprint
    from praesto.hooks.broker_http import blueprint as broker_blueprint
    from praesto.hooks.nodes import blueprint as nodes_blueprint

    app.register_blueprint(admission_blueprint)
    app.register_blueprint(nodes_blueprint)
    app.register_blueprint(broker_blueprint)  # the agents' credentials broker (hooks/broker.py)
    # ---- end of blueprints ----

    return app
