"""`/metrics/` read as Prometheus reads it (prometheus-client's own parser), and a real Prometheus
server (Debian's `prometheus`, which bin/test installs) scraping a web process."""

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support.procs import Proc, Procs, free_port, wait_http_ok

Families = dict[str, Any]


def parse(text: str) -> Families:
    """Metric families by name (a counter `x_total` is the family `x`, its sample `x_total`)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def scrape(base_url: str, headers: dict[str, str]) -> Families:
    response = httpx.get(f"{base_url}/metrics/", headers=headers, timeout=10)
    assert response.status_code == 200, (response.status_code, response.text)
    return parse(response.text)


def samples(families: Families) -> list[Sample]:
    return [sample for family in families.values() for sample in family.samples]


def value(families: Families, name: str, **labels: str) -> float:
    """The sample `name` with `labels` (among others); KeyError if the scrape has none."""
    for sample in samples(families):
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    raise KeyError(f"no sample {name}{labels} in the scrape")


def prometheus_binary() -> str:
    return shutil.which("prometheus") or "/usr/bin/prometheus"


def start_prometheus(procs: Procs, folder: Path, *, target: Proc, token: str) -> Proc:
    """A Prometheus server in the foreground on a free port, its storage in `folder`, scraping
    `target`'s /metrics/ every second with the bearer token. Stopped by PID with the rest of `procs`."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "runledger",
                "metrics_path": "/metrics/",
                "authorization": {"type": "Bearer", "credentials": token},
                "static_configs": [{"targets": [f"127.0.0.1:{target.port}"]}],
            }
        ],
    }
    config_file = folder / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    args = [prometheus_binary(), f"--config.file={config_file}", f"--storage.tsdb.path={folder / 'data'}"]
    args += [f"--web.listen-address=127.0.0.1:{port}"]
    proc = procs.start("prometheus", args, env={"PATH": "/usr/bin:/bin"}, port=port)
    wait_http_ok(proc, "/-/ready", timeout=60)
    return proc


def query(prometheus: Proc, promql: str) -> list[dict[str, Any]]:
    """The instant query's result vector from Prometheus's HTTP API."""
    answer = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result
