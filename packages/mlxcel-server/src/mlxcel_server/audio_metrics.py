"""The audio series of `GET /metrics`, read from the speech models' totals at each scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mlxcel_server.state import ServerState

_ENDPOINTS = ("transcriptions", "translations", "speech")
_DIRECTIONS = ("transcribed", "synthesized")


class AudioCollector(Collector):
    """Exposes `mlxcel:audio_requests_total{endpoint}`, `mlxcel:audio_seconds_total{direction}`
    (seconds of audio transcribed or synthesized), `mlxcel:audio_processing_seconds_total
    {direction}` (worker time) (counters), and `mlxcel:audio_requests_processing` and
    `mlxcel:audio_requests_deferred` (gauges). Nothing while no speech model is served."""

    def __init__(self, state: ServerState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        audio = self._state.audio
        if audio is None:
            return
        totals = audio.totals.snapshot()
        requests = CounterMetricFamily(
            "mlxcel:audio_requests", "Audio requests finished.", labels=["endpoint"]
        )
        for endpoint in _ENDPOINTS:
            requests.add_metric([endpoint], totals.requests.get(endpoint, 0))
        yield requests
        seconds = CounterMetricFamily(
            "mlxcel:audio_seconds",
            "Seconds of audio transcribed or synthesized.",
            labels=["direction"],
        )
        processing = CounterMetricFamily(
            "mlxcel:audio_processing_seconds",
            "Seconds the audio worker spent transcribing or synthesizing.",
            labels=["direction"],
        )
        for direction in _DIRECTIONS:
            seconds.add_metric([direction], totals.audio_seconds.get(direction, 0.0))
            processing.add_metric([direction], totals.processing_seconds.get(direction, 0.0))
        yield seconds
        yield processing
        yield GaugeMetricFamily(
            "mlxcel:audio_requests_processing",
            "Audio requests running now.",
            audio.worker.num_running,
        )
        yield GaugeMetricFamily(
            "mlxcel:audio_requests_deferred",
            "Audio requests waiting for the audio worker.",
            audio.worker.num_waiting,
        )
