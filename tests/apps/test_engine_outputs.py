import pytest

from mlxcel.common.flags import RunError
from mlxcel.generation.engine_outputs import next_output
from mlxcel_core.engine import EngineOutput, OutputQueue


def test_next_output_returns_what_the_engine_put():
    sink = OutputQueue()
    sink.put(EngineOutput(index=0, text="hi"))
    assert next_output(sink, timeout=1.0).text == "hi"


def test_a_silent_engine_is_a_run_error_not_a_traceback():
    with pytest.raises(RunError, match=r"the engine produced nothing for 0\.05 s; giving up"):
        next_output(OutputQueue(), timeout=0.05)
