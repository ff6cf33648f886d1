"""`GET /metrics`: Prometheus text with llama-server's metric names, from prometheus-client.

Counters are totals since start; the two throughput gauges cover the work finished since the
previous scrape, as llama-server computes them (0 when there was none).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from quart import Blueprint, Response

from mlxcel_core.engine import EngineStats
from mlxcel_server.audio_metrics import AudioCollector
from mlxcel_server.errors import ApiError
from mlxcel_server.settings import ServerSettings
from mlxcel_server.state import ServerState
from mlxcel_server.totals import TotalsSnapshot


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if tokens and seconds > 0 else 0.0


class LlamaServerCollector(Collector):
    """Reads the serving model's totals and engine queue at each scrape.

    Exposes `llamacpp:prompt_tokens_total`, `llamacpp:prompt_seconds_total`,
    `llamacpp:tokens_predicted_total`, `llamacpp:tokens_predicted_seconds_total` (counters),
    `llamacpp:prompt_tokens_seconds`, `llamacpp:predicted_tokens_seconds` (tokens/s),
    `llamacpp:requests_processing` and `llamacpp:requests_deferred` (gauges), and the
    engine's KV cache: `llamacpp:kv_cache_usage_ratio`, `mlxcel:kv_cache_blocks_used`,
    `mlxcel:kv_cache_blocks_free`, `mlxcel:kv_cache_bytes`, `mlxcel:prefix_cache_hit_rate`
    (gauges), `mlxcel:prefix_cache_queried_tokens`, `mlxcel:prefix_cache_hit_tokens`,
    `mlxcel:preemptions`, and speculative decoding's `mlxcel:draft_n_total` and
    `mlxcel:draft_n_accepted_total` (counters, named after llama-server's `draft_n` and
    `draft_n_accepted` timings).
    """

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._previous = TotalsSnapshot()

    def collect(self) -> Iterator[Metric]:
        model = self._state.serving_model
        totals = TotalsSnapshot() if model is None else model.totals.snapshot()
        previous, self._previous = self._previous, totals
        processing = 0 if model is None else model.engine.num_running
        deferred = 0 if model is None else model.engine.num_waiting
        engine = EngineStats() if model is None else model.engine.stats
        yield CounterMetricFamily(
            "llamacpp:prompt_tokens", "Number of prompt tokens processed.", totals.prompt_tokens
        )
        yield CounterMetricFamily(
            "llamacpp:prompt_seconds", "Prompt process time", totals.prompt_seconds
        )
        yield CounterMetricFamily(
            "llamacpp:tokens_predicted",
            "Number of generation tokens processed.",
            totals.predicted_tokens,
        )
        yield CounterMetricFamily(
            "llamacpp:tokens_predicted_seconds", "Predict process time", totals.predicted_seconds
        )
        yield GaugeMetricFamily(
            "llamacpp:prompt_tokens_seconds",
            "Average prompt throughput in tokens/s.",
            _rate(
                totals.prompt_tokens - previous.prompt_tokens,
                totals.prompt_seconds - previous.prompt_seconds,
            ),
        )
        yield GaugeMetricFamily(
            "llamacpp:predicted_tokens_seconds",
            "Average generation throughput in tokens/s.",
            _rate(
                totals.predicted_tokens - previous.predicted_tokens,
                totals.predicted_seconds - previous.predicted_seconds,
            ),
        )
        yield GaugeMetricFamily(
            "llamacpp:requests_processing", "Number of requests processing.", processing
        )
        yield GaugeMetricFamily(
            "llamacpp:requests_deferred", "Number of requests deferred.", deferred
        )
        yield from _engine_metrics(engine)


def _engine_metrics(stats: EngineStats) -> Iterator[Metric]:
    usage = stats.num_kv_blocks_used / stats.num_kv_blocks if stats.num_kv_blocks else 0.0
    yield GaugeMetricFamily(
        "llamacpp:kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", usage
    )
    yield GaugeMetricFamily(
        "mlxcel:kv_cache_blocks_used",
        "KV cache blocks held by sequences.",
        stats.num_kv_blocks_used,
    )
    yield GaugeMetricFamily(
        "mlxcel:kv_cache_blocks_free",
        "KV cache blocks free (cached ones included).",
        stats.num_kv_blocks_free,
    )
    yield GaugeMetricFamily(
        "mlxcel:kv_cache_bytes", "Bytes the KV cache pools hold now.", stats.kv_cache_bytes
    )
    yield GaugeMetricFamily(
        "mlxcel:prefix_cache_hit_rate",
        "Prompt tokens found in the prefix cache over prompt tokens looked up.",
        stats.prefix_cache_hit_rate,
    )
    yield CounterMetricFamily(
        "mlxcel:prefix_cache_queried_tokens",
        "Prompt tokens looked up in the prefix cache.",
        stats.prefix_cache_queried_tokens,
    )
    yield CounterMetricFamily(
        "mlxcel:prefix_cache_hit_tokens",
        "Prompt tokens found in the prefix cache.",
        stats.prefix_cache_hit_tokens,
    )
    yield CounterMetricFamily(
        "mlxcel:preemptions",
        "Sequences preempted to free KV cache blocks.",
        stats.num_preemptions,
    )
    yield CounterMetricFamily(
        "mlxcel:draft_n", "Draft tokens verified (speculative decoding).", stats.num_draft_tokens
    )
    yield CounterMetricFamily(
        "mlxcel:draft_n_accepted",
        "Draft tokens accepted (speculative decoding).",
        stats.num_accepted_draft_tokens,
    )


class _AddedCollectors(Collector):
    """The collectors added to the state (`ServerState.add_collector`), read at each scrape."""

    def __init__(self, state: ServerState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        for collector in self._state.collectors:
            yield from collector.collect()


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("metrics", __name__)
    # One registry per app: two apps in one process (tests) never share series.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LlamaServerCollector(state))
    registry.register(AudioCollector(state))
    registry.register(_AddedCollectors(state))

    @blueprint.get("/metrics")
    async def metrics() -> Response:
        if not settings.endpoint_metrics:
            raise ApiError(
                501,
                "This server does not support metrics endpoint. Start it with `--metrics`",
                code="not_supported",
            )
        return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

    return blueprint
