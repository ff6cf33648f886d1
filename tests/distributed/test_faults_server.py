"""The server once a rank is at fault, in-process on the tiny model: generation requests
and `/health` answer 503 naming the rank, and `/metrics` shows the group."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from mlxcel_core.engine import Engine
from mlxcel_distributed import StageFault, StageMetrics, StageReport
from mlxcel_models.loading.loader import load_model
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app
from mlxcel_server.stage_metrics import StageCollector
from mlxcel_server.state import Degradation

FAULT = StageFault(2, "exited with code -9")


@pytest.fixture
def served(tiny_gguf):
    loaded = load_model(tiny_gguf)
    state = ServerState()
    state.set_ready(ServingModel(loaded, Engine(loaded.model), "tiny", 256))
    metrics = StageMetrics(3)
    state.add_collector(StageCollector(metrics))
    app = create_app(state, ServerSettings(n_predict=4, endpoint_metrics=True))
    yield state, metrics, app
    state.close(timeout=10)


def _call(app, method: str, path: str, **kwargs):
    async def call():
        response = await app.test_client().open(path, method=method, **kwargs)
        return response.status_code, await response.get_json(), await response.get_data()

    return asyncio.run(call())


def _degrade(state: ServerState, metrics: StageMetrics) -> None:
    state.degrade(Degradation(FAULT.message, {"rank": FAULT.rank, "reason": FAULT.reason}))
    metrics.record_down(FAULT.rank)


def test_a_degraded_server_answers_503_naming_the_rank(served):
    state, metrics, app = served
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert _call(app, "POST", "/v1/chat/completions", json=chat)[0] == 200
    _degrade(state, metrics)
    status, body, _ = _call(app, "POST", "/v1/chat/completions", json=chat)
    assert status == 503 and body["error"]["type"] == "unavailable_error"
    assert "rank 2 exited with code -9" in body["error"]["message"]
    status, body, _ = _call(app, "GET", "/health")
    assert status == 503
    assert body == {
        "status": "degraded",
        "message": FAULT.message,
        "rank": 2,
        "reason": "exited with code -9",
    }


def test_metrics_show_the_ranks_step_times_and_bytes(served):
    state, metrics, app = served
    metrics.record_step(0.002, 0.2, 1024)
    metrics.record_step(0.003, 0.4, 1024)
    text = _call(app, "GET", "/metrics")[2].decode()
    for line in (
        'mlxcel:distributed_ranks{rank="0",role="front"} 1.0',
        'mlxcel:distributed_ranks{rank="2",role="follower"} 1.0',
        "mlxcel:distributed_degraded 0.0",
        'mlxcel:step_channel_seconds_bucket{le="0.005"} 2.0',
        'mlxcel:step_forward_seconds_bucket{le="0.25"} 1.0',
        "mlxcel:step_forward_seconds_count 2.0",
        "mlxcel:step_channel_bytes_total 2048.0",
    ):
        assert line in text, line
    _degrade(state, metrics)
    text = _call(app, "GET", "/metrics")[2].decode()
    assert 'mlxcel:distributed_ranks{rank="2",role="follower"} 0.0' in text
    assert "mlxcel:distributed_degraded 1.0" in text


def test_metrics_show_each_rank_s_reported_steps(served):
    _, metrics, app = served
    metrics.record_reports({0: StageReport(1, 0.03, 0), 2: StageReport(1, 0.2, 0)})
    metrics.record_reports({2: StageReport(1, 0.2, 0)})  # the same step again: not counted
    metrics.record_reports({3: StageReport(1, 0.2, 0), -1: StageReport(1, 0.2, 0)})  # no rank
    text = _call(app, "GET", "/metrics")[2].decode()
    for line in (
        'mlxcel:stage_step_seconds_bucket{le="0.05",rank="0"} 1.0',
        'mlxcel:stage_step_seconds_bucket{le="0.1",rank="2"} 0.0',
        'mlxcel:stage_step_seconds_count{rank="2"} 1.0',
        'mlxcel:stage_step_seconds_sum{rank="2"} 0.2',
    ):
        assert line in text, line
    assert 'mlxcel:stage_step_seconds_count{rank="1"}' not in text  # nothing reported
    assert "mlxcel:stage_sent_bytes" not in text  # tensor-parallel ranks send nothing on


def test_metrics_count_the_bytes_each_pipeline_stage_sent_on():
    pipeline = StageMetrics(2, stages_send=True)
    pipeline.record_reports({0: StageReport(1, 0.01, 2304), 1: StageReport(1, 0.01, 196608)})
    registry = CollectorRegistry()
    registry.register(StageCollector(pipeline))
    text = generate_latest(registry).decode()
    assert 'mlxcel:stage_sent_bytes_total{rank="0"} 2304.0' in text
    assert 'mlxcel:stage_sent_bytes_total{rank="1"} 196608.0' in text
