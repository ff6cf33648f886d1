import threading

import mlx.core as mx

from mlxcel_core.threads import thread_stream


def test_a_worker_thread_computes_on_its_stream():
    results = []

    def work():
        with thread_stream():
            results.append((mx.arange(4) * 2).tolist())

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert results == [[0, 2, 4, 6]]
