"""MLflow's system metrics (CPU, memory, GPU), sampled on a thread of their own and sent by the
arm's run between epochs."""

from __future__ import annotations

import threading
import time
from typing import Any

from ampbench.logs import log

SAMPLE_INTERVAL_S = 10.0


class SystemMetrics:
    """MLflow's system metrics, sampled here and sent between epochs.

    MLflow's own collectors (CPU utilisation and memory through psutil; per-GPU utilisation,
    memory and power through nvidia-ml-py where there is an NVIDIA GPU) under MLflow's
    `system/` names, so that a run's System metrics tab shows them beside its throughput.
    Unlike `mlflow.start_run(log_system_metrics=True)`, whose thread also asks the tracking
    server about the run and sends to it while steps are timed, this thread only samples
    (a few /proc reads each interval); the samples go out with the epoch's
    metrics, between epochs.
    """

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor

        self.interval_s = interval_s
        self.monitors: list[Any] = [CPUMonitor()]
        try:
            from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

            self.monitors.append(GPUMonitor())
        except Exception:  # no NVIDIA driver or no nvidia-ml-py: CPU and memory only
            log.debug("system metrics: no NVIDIA GPU monitor")
        self.samples: list[tuple[int, dict[str, float]]] = []  # (time in ms, values)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="system-metrics", daemon=True)

    def start(self) -> None:
        import psutil

        psutil.cpu_percent()  # its first call has nothing to compare with and says 0.0
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            values: dict[str, float] = {}
            for monitor in self.monitors:
                monitor.collect_metrics()
                values.update(monitor.aggregate_metrics())
                monitor.clear_metrics()
            with self._lock:
                self.samples.append((int(time.time() * 1000), values))

    def drain(self) -> list[tuple[int, dict[str, float]]]:
        with self._lock:
            taken, self.samples = self.samples, []
        return taken

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
