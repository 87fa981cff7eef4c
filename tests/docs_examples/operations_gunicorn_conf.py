# gunicorn.conf.py: several workers, one scrape (PROMETHEUS_MULTIPROC_DIR set before start)
workers = 4


def child_exit(server, worker):
    """A worker exited: drop its live gauges; its counters stay in the sum."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
