import threading

import mlx.core as mx

from mlxcel_core.threads import side_streams, thread_stream


def test_a_worker_thread_computes_on_its_stream():
    results = []

    def work():
        with thread_stream():
            results.append((mx.arange(4) * 2).tolist())

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert results == [[0, 2, 4, 6]]


def test_side_streams_are_kept_per_thread_until_its_stream_block_ends():
    cpu = mx.Device(mx.cpu)
    seen = []

    def work():
        for _ in range(2):
            with thread_stream(cpu):
                first = side_streams(cpu, 2)
                assert side_streams(cpu, 2) == first and len(set(first)) == 2
                # Products on the side streams run and join the thread's own stream.
                parts = [mx.arange(3, stream=s) * (i + 1) for i, s in enumerate(first)]
                seen.append((first, mx.concatenate(parts).tolist()))

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert [values for _, values in seen] == [[0, 1, 2, 0, 2, 4]] * 2
    # The block's end destroyed the first streams; the second block made new ones.
    assert seen[0][0] != seen[1][0]
