"""How the control plane grows with the node count: 16, 128, 512 and 1,000 instances on the AWS emulator, no hosts.

    .venv/bin/python benchmarks/control_plane_scale.py [--sizes 16,128,512,1000]

For each size it resets one emulator (moto, in its own process on 127.0.0.1, started by the project's own
helper), launches the instances a slurm-ec2 tenant's cluster stack would (controller, login, the rest one
p5.48xlarge queue; tagged as the stack tags them), files a converged report for every node where the node
agent files it (s3://<bucket>/fmcluster/report/<aws:userid>/<instance id>.json), and writes the tenant's generated state as a
deploy would (manifest.json, hosts.yml). Then it times, each in this process and under tracemalloc (the peak
of Python allocations during that operation alone), counting the AWS API calls each makes:

- discovery: `fmcluster.nodes.discover`, what the deploy, `invoke status` and every node's agent call;
- manifest: `build_manifest` (the deploy, once) and `assemble_inventory` + its YAML (every node, every converge);
- slurm.conf: the slurm role's template rendered by Jinja2 with Ansible's filters, from that inventory;
- report polling: the first round of `reports.wait_for_reports` (every report new to it) and a later round in
  which nothing changed (what each further poll of the deploy's converge step costs);
- `invoke status`, `invoke nodes`, `invoke doctor --org`, `invoke fleet`: the commands themselves.

`nodes`, `doctor` and `fleet` talk to nodes over ssh. Here the provider's client_argv is a stand-in: a shell
that prints a recorded answer (a healthy node's health report, `scontrol show node` of N nodes, Prometheus's
targets), so their own work is measured — one process per node for doctor, as ssh would be — but not the
network or the nodes' side. Wall time includes the emulator's answers (moto, on the same cores) and whatever
else loads the machine; CPU time is this process's own (not the emulator's, not the stand-in processes'), the
figure to compare across sizes on a shared machine; memory is this process's only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
os.environ.setdefault("FMCLUSTER_ROOT", str(ROOT))

from fmcluster.capabilities import EMULATOR_APIS  # noqa: E402
from fmcluster.manifest import assemble_inventory, digest, inventory_yaml, membership_digest  # noqa: E402
from fmcluster.nodes import Node, discover  # noqa: E402

ORG = "scale"
VPC = "10.40.0.0/16"
REF = "0123456789abcdef0123456789abcdef01234567"
BUCKET = "fmc-scale-data"
SIZES = (16, 128, 512, 1000)


@dataclass
class Measure:
    seconds: float
    cpu: float
    peak_mib: float
    calls: Counter[str] = field(default_factory=Counter)


class CallCounter:
    """Counts the API calls boto3 clients make (botocore's before-call event: one per request, retries aside)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def attach(self, client: Any) -> Any:
        client.meta.events.register("before-call.*.*", self._count)
        return client

    def _count(self, model: Any, **_: Any) -> None:
        self.calls[f"{model.service_model.service_name}:{model.name}"] += 1


@contextlib.contextmanager
def measured(result: list[Measure], counter: CallCounter) -> Iterator[None]:
    counter.calls.clear()
    tracemalloc.start()
    started, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        elapsed, used = time.perf_counter() - started, time.process_time() - cpu
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result.append(Measure(elapsed, used, peak / 1024**2, Counter(counter.calls)))


# --- the stand-in for ssh ------------------------------------------------------------------------------------
STANDIN = """#!/bin/sh
# Stands in for `ssh node <command>`: prints what the node would answer, chosen by the command's text.
dir=$(dirname "$0")
eval "cmd=\\${$#}"
case "$cmd" in
  *fmcluster-doctor*) cat "$dir/node-answer.txt" ;;
  *"scontrol show node"*) cat "$dir/show-node.txt" ;;
  *" triage "*) echo "[]" ;;
  *sinfo*) cat "$dir/sinfo.txt" ;;
  *api/v1/targets*) cat "$dir/targets.json" ;;
  *api/v1/alerts*) echo '{"status":"success","data":{"alerts":[]}}' ;;
  *) echo "stand-in: unknown command: $cmd" >&2; exit 2 ;;
esac
"""


def health_report(name: str) -> dict[str, Any]:
    checks = ("gpu-count", "gpu-xid", "gpu-ecc", "gpu-throttle", "efa", "nvlink", "disk", "mounts", "memory", "slurmd")
    return {"node": name, "context": "manual", "started": 0.0, "seconds": 0.4, "healthy": True, "action": "none",
            "reason": "", "drain": {}, "results": [{"check": c, "status": "pass", "detail": "ok", "action": "none",
                                                    "seconds": 0.01, "evidence": {}} for c in checks]}


def write_standin(where: Path, nodes: list[Node]) -> list[str]:
    from slurm_outputs import node_block, show_node

    compute = [n for n in nodes if n.role == "compute"]
    mark = "==fmcluster-doctor:"
    answer = (f"{mark}up==\n{mark}health==\n{json.dumps(health_report('any'))}\n{mark}rc=0==\n{mark}nccl-env==\n"
              "export FI_PROVIDER=efa\nexport NCCL_DEBUG=WARN\n")
    (where / "node-answer.txt").write_text(answer)
    (where / "show-node.txt").write_text(show_node(*(node_block(n.name, address=n.address, partitions="gpu")
                                                     for n in compute)))
    (where / "sinfo.txt").write_text("".join(f"{n.name}|idle|none\n" for n in compute))
    targets = [{"scrapeUrl": f"http://{n.address}:{port}/metrics", "health": "up", "labels": {"job": job, "node": n.name}}
               for n in nodes for job, port in (("node", 9100), ("dcgm", 9400))]
    (where / "targets.json").write_text(json.dumps({"status": "success", "data": {"activeTargets": targets}}))
    script = where / "ssh-standin.sh"
    script.write_text(STANDIN)
    script.chmod(0o755)
    return ["/bin/sh", str(script)]


# --- one size ------------------------------------------------------------------------------------------------
def launch(ec2: Any, count: int, subnet: str, role: str, instance_type: str, queue: str | None = None) -> None:
    tags = [{"Key": "fmcluster:org", "Value": ORG}, {"Key": "fmcluster:role", "Value": role},
            {"Key": "Name", "Value": f"fmc-{ORG}-{role}"}]
    if queue:
        tags.append({"Key": "fmcluster:queue", "Value": queue})
    ec2.run_instances(ImageId="ami-12c6146b", InstanceType=instance_type, MinCount=count, MaxCount=count,
                      SubnetId=subnet, TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])


def render_slurm_conf(variables: dict[str, Any], controller: str) -> str:
    import jinja2
    import yaml
    from ansible.plugins.filter.core import FilterModule

    defaults = yaml.safe_load((ROOT / "roles" / "slurm" / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True)  # Ansible's template module: trim_blocks on
    env.filters.update(FilterModule().filters())
    context: dict[str, Any] = {**defaults, **variables, "inventory_hostname": controller,
                               "ansible_facts": {"service_mgr": "systemd"}}
    for key, value in defaults.items():  # the role's defaults that are themselves templates
        if isinstance(value, str) and "{{" in value and key not in variables:
            context[key] = yaml.safe_load(env.from_string(value).render(context))
    template = env.from_string((ROOT / "roles" / "slurm" / "templates" / "slurm.conf.j2").read_text())
    return template.render(context)


def run_size(n: int, endpoint: str, work: Path, counter: CallCounter) -> dict[str, Measure]:
    from fmcluster import commands
    from fmcluster.commands.diagnose import doctor, fleet
    from fmcluster.inventory import write_inventory
    from fmcluster.model import load_tenant
    from fmcluster.paths import generated_dir
    from fmcluster.providers.registry import provider_for
    from fmcluster.reports import ReportReader, statuses, wait_for_reports
    from fmcluster.stacks import api as stacks_api
    from fmcluster.stacks import aws
    from fmcluster.stacks.render import subnet_cidrs
    from localtenant import make_root, manifest_for

    root = make_root(work / f"n{n}", ORG, VPC, login=1, provider="aws",
                     queues=[{"name": "gpu", "instance_type": "p5.48xlarge", "count": n - 2}])
    os.environ["FMCLUSTER_ROOT"] = str(root)
    tenant = load_tenant(ORG, root)

    clients: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in clients:
            clients[service] = counter.attach(aws.client(service, tenant.region, endpoint))
        return clients[service]

    ec2, s3 = client("ec2"), client("s3")
    vpc = ec2.create_vpc(CidrBlock=VPC)["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=subnet_cidrs(VPC)["private"])["Subnet"]["SubnetId"]
    launch(ec2, 1, subnet, "controller", tenant.controller.name)
    launch(ec2, 1, subnet, "login", tenant.controller.name)
    for start in range(0, n - 2, 250):  # the stack's Auto Scaling group launches in batches too
        launch(ec2, min(250, n - 2 - start), subnet, "compute", "p5.48xlarge", "gpu")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": tenant.region})

    out: dict[str, Measure] = {}
    got: list[Measure] = []
    with measured(got, counter):
        manifest = manifest_for(tenant, {"DataBucketName": BUCKET})
        manifest["ref"] = REF
    out["manifest (build, once per deploy)"] = got.pop()
    with measured(got, counter):
        aws.client("ec2", tenant.region, endpoint)
    out["a new boto3 EC2 client (the deploy's wait makes one a poll)"] = got.pop()
    with measured(got, counter):
        nodes = discover(manifest["discovery"], client, ORG)
    out["discovery (DescribeInstances)"] = got.pop()
    assert len(nodes) == n, (len(nodes), n)
    with measured(got, counter):
        inventory = assemble_inventory(manifest, nodes)
        text = inventory_yaml(inventory, "# generated\n")
    out["inventory (assemble + YAML, every converge)"] = got.pop()
    with measured(got, counter):
        conf = render_slurm_conf(inventory["all"]["vars"], nodes[0].name)
    out["slurm.conf (render)"] = got.pop()
    assert conf.count("\nNodeName=") == n - 2, "one NodeName line per compute node"
    del text, conf

    # What the nodes filed, and what the deploy wrote (generated/manifest.json, hosts.yml).
    manifest_digest, membership = digest(manifest), membership_digest(nodes)
    for node in nodes:
        report = {"ok": True, "ref": REF, "manifest_digest": manifest_digest, "membership_digest": membership,
                  "role": node.role, "address": node.address, "seconds": 61.2, "changed": 0, "stage": "done"}
        s3.put_object(Bucket=BUCKET, Key=f"fmcluster/report/AROAEXAMPLENODEROLE01:{node.instance_id}/{node.instance_id}.json",
                      Body=json.dumps(report).encode())
    generated_dir(ORG, root).mkdir(parents=True, exist_ok=True)
    (generated_dir(ORG, root) / "manifest.json").write_text(json.dumps(manifest))
    write_inventory(tenant, manifest, nodes, root=root)

    with measured(got, counter):
        wait = wait_for_reports(s3, BUCKET, lambda: discover(manifest["discovery"], client, ORG), REF,
                                manifest_digest, timeout_s=60, out=lambda _line: None)
    out["converge wait: a round that finds every report new"] = got.pop()
    assert wait.ok, [s.line() for s in wait.statuses if s.state != "converged"][:3]
    reader = ReportReader(s3, BUCKET)
    statuses(s3, BUCKET, nodes, REF, manifest_digest, reader)
    with measured(got, counter):
        found = statuses(s3, BUCKET, discover(manifest["discovery"], client, ORG), REF, manifest_digest, reader)
    out["converge wait: a later round, no report changed"] = got.pop()
    assert all(s.state == "converged" for s in found)

    argv = write_standin(work, nodes)
    real_provider = provider_for(tenant)
    standin = mock.Mock(wraps=real_provider)
    standin.client_argv = lambda _node: argv
    standin.endpoint = lambda _start, _out: endpoint
    standin.capabilities = replace(real_provider.capabilities, apis=EMULATOR_APIS)  # its endpoint is the emulator
    real_status = stacks_api.stacks_status

    def stacks_status(*args: Any, **kwargs: Any) -> Any:
        result = real_status(*args, **kwargs)
        # The emulator holds no stacks here: what the three stacks would say once created.
        for stack in result.stacks:
            stack.status = "CREATE_COMPLETE"
            if stack.key == "storage":
                stack.outputs["DataBucketName"] = BUCKET
        return result

    patched_client = aws.client

    def counted_client(service: str, region: str, endpoint_url: str | None, apis: Any = None) -> Any:
        return counter.attach(patched_client(service, region, endpoint_url, apis))

    with mock.patch("fmcluster.providers.registry.provider_for", lambda _tenant: standin), \
            mock.patch("fmcluster.stacks.api.stacks_status", stacks_status), \
            mock.patch("fmcluster.stacks.aws.client", counted_client):
        operations: list[tuple[str, Callable[[], int]]] = [
            ("invoke status", lambda: commands.status(ORG)),
            ("invoke nodes (ssh: stand-in)", lambda: commands.nodes(ORG)),
            ("invoke doctor --org (ssh: stand-in)", lambda: doctor(org=ORG, out=print)),
            ("invoke fleet (ssh: stand-in)", lambda: fleet(out=print, root=root, html_path=work / "fleet.html"))]
        for label, call in operations:
            printed = io.StringIO()
            with measured(got, counter), contextlib.redirect_stdout(printed):
                code = call()
            out[label] = got.pop()
            if code != 0:  # every node healthy, every stack created: anything else is the harness's fault
                raise SystemExit(f"{label} at N={n} exited {code}:\n{printed.getvalue()[-2000:]}")
    return out


def reset(endpoint: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).read()


def calls_text(calls: Counter[str]) -> str:
    short = {"ec2:DescribeInstances": "Describe", "s3:GetObject": "Get", "s3:ListObjectsV2": "List",
             "cloudformation:DescribeStacks": "CFN"}
    return ", ".join(f"{short.get(k, k.split(':')[1])} {v}" for k, v in sorted(calls.items())) or "-"


def table(results: dict[int, dict[str, Measure]]) -> list[str]:
    sizes = sorted(results)
    head = ("| operation (wall; CPU of this process; peak Python memory) | " + " | ".join(f"N={n}" for n in sizes)
            + f" | CPU growth {sizes[0]}→{sizes[-1]} | API calls at N={sizes[-1]} |")
    rows = [head, "|---" * (len(sizes) + 3) + "|"]
    for label in results[sizes[0]]:
        cells = [f"{m.seconds:.2f} s; {m.cpu:.2f} s; {m.peak_mib:.1f} MiB" for m in (results[n][label] for n in sizes)]
        first, last = results[sizes[0]][label].cpu, results[sizes[-1]][label].cpu
        growth = f"×{last / first:.0f}" if first >= 0.005 else "-"
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {growth} | {calls_text(results[sizes[-1]][label].calls)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="instance counts (each ≥ 3)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(s < 3 for s in sizes):
        parser.error("each size needs a controller, a login node and at least one compute node: ≥ 3")
    from fmcluster.providers.local.emulator import ensure_emulator, stop_emulator

    for var, value in (("AWS_ACCESS_KEY_ID", "emulator"), ("AWS_SECRET_ACCESS_KEY", "emulator")):
        os.environ[var] = value
    os.environ.pop("AWS_PROFILE", None)
    started = time.perf_counter()
    print(f"control-plane scale benchmark, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    with tempfile.TemporaryDirectory(prefix="fmc-scale-") as tmp:
        work = Path(tmp)
        emulator = ensure_emulator("scale-bench", work / "emulator", host="127.0.0.1")
        os.environ["AWS_ENDPOINT_URL"] = emulator.endpoint  # what boto3 reads for an AWS tenant (endpoint None)
        counter = CallCounter()
        results: dict[int, dict[str, Measure]] = {}
        try:
            reset(emulator.endpoint)
            run_size(3, emulator.endpoint, work, counter)  # warm-up: imports, botocore's service models, caches
            for n in sizes:
                reset(emulator.endpoint)
                t = time.perf_counter()
                results[n] = run_size(n, emulator.endpoint, work, counter)
                print(f"N={n}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
        finally:
            stop_emulator("scale-bench", work / "emulator")
    print("\n".join(table(results)) + "\n")
    print(f"done in {time.perf_counter() - started:.1f} s; peak RSS of this process "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
