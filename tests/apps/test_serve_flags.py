"""`mlxcel serve`'s monitoring switches and their `LLAMA_ARG_ENDPOINT_*` mirrors."""

from mlxcel.cli import make_parser
from mlxcel.flags import resolve_defaults
from mlxcel.serve_command import FLAGS, settings_from


def settings(argv, environ):
    args = make_parser("serve").parse_args(["serve", *argv])
    resolve_defaults(args, FLAGS, environ)
    return settings_from(args)


def test_monitoring_endpoints_are_off_by_default():
    result = settings([], {})
    assert not (result.endpoint_metrics or result.endpoint_slots or result.endpoint_props)


def test_switches_and_environment_mirrors_enable_them():
    assert settings(["--metrics", "--slots", "--props"], {}).endpoint_slots
    result = settings([], {"LLAMA_ARG_ENDPOINT_METRICS": "1", "LLAMA_ARG_ENDPOINT_PROPS": "true"})
    assert result.endpoint_metrics and result.endpoint_props and not result.endpoint_slots
