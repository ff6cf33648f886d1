"""Prometheus text (`GET /metrics`) as a dict a test can index."""

from prometheus_client.parser import text_string_to_metric_families


def metric_samples(text: str) -> dict[str, float]:
    """Each sample of `text` by its name and labels as Prometheus writes them, labels
    sorted: `{'mlxcel:distributed_ranks{rank="1",role="prefill"}': 1.0, ...}`."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples
