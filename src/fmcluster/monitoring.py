"""Monitoring: the tenant's monitoring section as role variables, and the deploy's check that Prometheus
scrapes exactly the cluster's current nodes.

`inventory_vars(tenant)` goes into the manifest (fmcluster.publish.build_manifest); roles never read the tenant.
`scrape_targets` asks Prometheus's HTTP API on the controller — over ssh, as an operator would — and passes
only when every current node has its exporters `up` and no target of a node that is gone remains.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fmcluster.manifest import NODE_SECRETS_DIR
from fmcluster.model import Tenant
from fmcluster.nodes import Node
from fmcluster.paths import repo_root
from fmcluster.steps import StepOutcome

Out = Callable[[str], object]
PROMETHEUS_PORT = 9090
#: Where Prometheus sends alerts: Alertmanager on the controller itself (the alertmanager role's defaults;
#: tests/test_monitoring_inventory_vars.py keeps the three equal to the roles').
ALERTMANAGER_ADDRESS, ALERTMANAGER_PORT = "127.0.0.1", 9093
#: Asks the API from the controller itself (its own python3: every image has one).
TARGETS_QUERY = ("python3 -c \"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
                 f"'http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/targets?state=active', timeout=10).read().decode())\"")


def playbook_path(root: Path | None = None) -> Path:
    """playbooks/monitoring.yml (part of playbooks/site.yml, which every node converges)."""
    return (root or repo_root()) / "playbooks" / "monitoring.yml"


def inventory_vars(tenant: Tenant, image_of: Callable[[str], str] | None = None) -> dict[str, Any]:
    """Role variables derived from the tenant's monitoring section; `image_of`: the image a node of an accelerator
    boots (fmcluster.images.booted_image; by default the tenant's scheduler's and provider's, as the deploy's)."""
    monitoring = tenant.monitoring
    return {
        "prometheus_retention_days": monitoring.prometheus_retention_days,
        "prometheus_remote_write_url": monitoring.remote_write_url or "",
        "prometheus_remote_write_region": tenant.region if monitoring.remote_write_url else "",
        "grafana_enabled": monitoring.grafana,
        "alertmanager_receivers": [
            {"name": r.name, "type": r.type, "target": r.target} for r in monitoring.alert_receivers
        ],
        **smtp_vars(tenant),
        "prometheus_scrape_jobs": scrape_jobs(tenant, image_of),
        "prometheus_external_labels": {"cluster": tenant.org},
        "prometheus_alertmanager_targets": ([f"{ALERTMANAGER_ADDRESS}:{ALERTMANAGER_PORT}"]
                                            if monitoring.alert_receivers else []),
        "grafana_prometheus_url": f"http://127.0.0.1:{PROMETHEUS_PORT}",
    }


def smtp_vars(tenant: Tenant) -> dict[str, Any]:
    """The alertmanager role's relay for email receivers (monitoring.smtp), TLS required; its credentials are the
    files the controller's node agent writes from Secrets Manager (root only: the role hands Alertmanager its own
    copy). Without monitoring.smtp, the role's default relay, localhost:25, and no login: validation refuses an email
    receiver without a relay on AWS, and the local substrate delivers no mail, and says so (its substrate notes)."""
    smtp = tenant.monitoring.smtp
    if smtp is None:
        return {"alertmanager_smtp_smarthost": "localhost:25", "alertmanager_smtp_from": "alertmanager@localhost",
                "alertmanager_smtp_require_tls": False, "alertmanager_smtp_auth_username_file": "",
                "alertmanager_smtp_auth_password_file": ""}
    return {
        "alertmanager_smtp_smarthost": smtp.smarthost,
        "alertmanager_smtp_from": smtp.sender,
        "alertmanager_smtp_require_tls": True,
        "alertmanager_smtp_auth_username_file": (f"{NODE_SECRETS_DIR}/{smtp.username_secret}"
                                                 if smtp.username_secret else ""),
        "alertmanager_smtp_auth_password_file": (f"{NODE_SECRETS_DIR}/{smtp.password_secret}"
                                                 if smtp.password_secret else ""),
    }


#: Exporter ports (REFERENCE: node_exporter 9100, DCGM exporter 9400, EFA exporter 9109).
EXPORTER_PORTS = {"node": 9100, "dcgm": 9400, "efa": 9109}


def tenant_images(tenant: Tenant) -> Callable[[str], str]:
    """accelerator → the image its nodes boot for this tenant (the provider's own, else the scheduler's), as the
    deploy's manifest gives them (fmcluster.deploy publish)."""
    from fmcluster.images import booted_image
    from fmcluster.providers.registry import provider_for
    from fmcluster.schedulers.registry import scheduler_for

    return booted_image(scheduler_for(tenant).image, provider_for(tenant).node_image)


def scrape_jobs(tenant: Tenant, image_of: Callable[[str], str] | None = None) -> list[dict[str, Any]]:
    """One scrape job per exporter, limited to the instance types that run it (empty list: every node).

    dcgm-exporter runs only on GPU nodes whose image ships a container runtime (contract: container_runtime; the
    dcgm_exporter role's runtime none elsewhere), so only their instance types get a dcgm target: Prometheus expects
    none where no exporter runs by design, and plan lists those nodes (fmcluster.images.gpu_exporter_gaps)."""
    from fmcluster.images import load_images

    image = image_of or tenant_images(tenant)
    types = [tenant.controller] + ([tenant.login] if tenant.login else []) + [q.instance for q in tenant.queues]
    gpu = sorted({t.name for t in types if t.accelerator == "cuda"
                  and load_images()[image(t.accelerator)].contract.container_runtime})
    efa = sorted({t.name for t in types if t.has_efa})
    jobs: list[dict[str, Any]] = [{"job": "node", "port": EXPORTER_PORTS["node"], "instance_types": []}]
    if gpu:
        jobs.append({"job": "dcgm", "port": EXPORTER_PORTS["dcgm"], "instance_types": gpu})
    if efa:
        jobs.append({"job": "efa", "port": EXPORTER_PORTS["efa"], "instance_types": efa})
    return jobs


def read_targets(client_argv: Sequence[str]) -> tuple[list[dict[str, Any]], str]:
    try:
        done = subprocess.run([*client_argv, TARGETS_QUERY], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return [], "the controller did not answer within 30s"
    if done.returncode != 0:
        return [], (done.stderr.strip() or done.stdout.strip())[-300:]
    try:
        return list(json.loads(done.stdout)["data"]["activeTargets"]), ""
    except (ValueError, KeyError, TypeError):
        return [], f"unreadable answer from Prometheus: {done.stdout[:200]!r}"


def target_host(target: dict[str, Any]) -> str:
    return str(target.get("scrapeUrl", "")).split("//")[-1].split("/")[0].rsplit(":", 1)[0]


def scrape_targets(client_argv: Sequence[str], nodes: Sequence[Node], out: Out, wait_s: float = 180.0) -> StepOutcome:
    """Wait until Prometheus scrapes every current node (all its targets up) and nothing else.

    Fail closed: no answer, an unreadable answer, a node without an `up` target, a target down or a target of
    a node that is gone are failures, with the evidence."""
    addresses = {n.address: n.name for n in nodes}
    deadline = time.monotonic() + wait_s
    last = ""
    while True:
        targets, error = read_targets(client_argv)
        up = {target_host(t) for t in targets if t.get("health") == "up"}
        missing = [name for address, name in addresses.items() if address not in up]
        down = [t for t in targets if t.get("health") != "up"]
        stray = sorted({target_host(t) for t in targets} - set(addresses) - {"127.0.0.1", "localhost"})
        line = f"{len(addresses) - len(missing)}/{len(addresses)} nodes scraped, {len(down)} target(s) down, {len(stray)} stray"
        if line != last:
            out(f"    {line}")
            last = line
        if targets and not missing and not down and not stray:
            jobs = sorted({str(t.get("labels", {}).get("job", "?")) for t in targets})
            return StepOutcome("ok", f"Prometheus scrapes exactly the {len(addresses)} current nodes: "
                               f"{len(targets)}/{len(targets)} targets up ({', '.join(jobs)})",
                               ["Prometheus: port 9090 on the controller (reach it through ssh)"])
        if time.monotonic() > deadline:
            details = [f"{t.get('scrapeUrl')}: {t.get('health')} {t.get('lastError', '')}" for t in down]
            details += [f"{name}: no target up" for name in missing]
            details += [f"{host}: scraped, but no such node (gone from the cluster)" for host in stray]
            if error:
                details.append(f"Prometheus API: {error}")
            return StepOutcome("failed", f"Prometheus on the controller: {line} after {wait_s:.0f}s", details)
        time.sleep(3)
