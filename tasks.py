"""fmcluster's front door: `invoke --list`. Thin on purpose: each task calls one function of fmcluster.commands
(the package the `fmcluster` CLI calls too); the logic lives in src/fmcluster."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from invoke import Context, Exit, task

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("FMCLUSTER_ROOT", str(ROOT))

from fmcluster import commands  # noqa: E402
from fmcluster.capabilities import SCHEDULERS  # noqa: E402
from fmcluster.exits import ExitCode  # noqa: E402
from fmcluster.node.strategy import mitogen_unless_chosen  # noqa: E402


def _one_of(names: list[str]) -> str:
    """`a, b or c`: a help text's list of choices (the schedulers: one folder each, fmcluster.capabilities)."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


@task(help={"org": "tenant name (a folder under inventories/)"})
def validate(c: Context, org: str) -> None:
    """Validate a tenant spec: schema and catalog checks, every problem with its fix."""
    _exit(commands.validate(org))


@task(
    name="new-tenant",
    help={
        "org": "new tenant name",
        "instance_type": "compute instance type, e.g. p5.48xlarge",
        "count": "compute node count",
        "scheduler": _one_of(list(SCHEDULERS)),
        "region": "AWS region",
        "provider": "aws or local",
        "force": "replace an existing tenant (the old one is kept under inventories/.backup/)",
        "output_dir": "render somewhere other than inventories/ (e.g. a temp dir)",
    },
)
def new_tenant(
    c: Context,
    org: str = "",
    instance_type: str = "",
    count: str = "",  # text, so that --count=0 is refused rather than read as "not given"
    scheduler: str = "",
    region: str = "",
    provider: str = "",
    force: bool = False,
    output_dir: str = "",
) -> None:
    """Scaffold inventories/<org> from cookiecutters/tenant (prompts when run bare in a terminal)."""
    _exit(commands.new_tenant(org, instance_type, count, scheduler, region, provider, force, output_dir))


def _venv_bin(name: str) -> str:
    candidate = ROOT / ".venv" / "bin" / name
    return str(candidate) if candidate.exists() else name


#: CI's tiers, cheapest first (`invoke test --tier=NAME` runs one; STREAMS below says how `invoke test` runs all).
#: fast and slow run under pytest-xdist, one test file per worker (--dist loadfile: a file's module fixtures,
#: servers and throw-away hosts stay in one process); e2e drives one shared cluster, so it runs serially.
#: standins-extra is the one tier `invoke test` leaves out: stand-in clusters whose deploy would take .ci/run past
#: its 30 minutes on 2 cores (BENCHMARKS.md); run it by name before changing what they cover.
TIERS = ("fast", "slow", "molecule", "e2e", "standins", "standins-extra")
PYTEST_TIERS = {
    "fast": ("not e2e and not slow", True),
    "slow": ("slow and not e2e", True),
    "e2e": ("e2e and not standin", False),
    "standins": ("e2e and standin and not extra_standin", False),
    "standins-extra": ("e2e and extra_standin", False),
}
#: Seconds a serial cluster tier may run before it is interrupted as Ctrl-C would (tests/conftest.py): its
#: fixtures still destroy their clusters and pytest still prints which tests failed and why, where a CI job's own
#: limit would cut the log mid-run with neither. A watchdog for evidence, far above the tiers' usual times
#: (BENCHMARKS.md), never a performance target.
TIER_BUDGETS_S = {"e2e": 3000, "standins": 1200, "standins-extra": 1200}
#: Where each tier's junit XML goes (git-ignored): the durations of the last run, per test.
RESULTS_DIR = ROOT / ".cache" / "test-results"


def _workers() -> str:
    """xdist workers: one per core, at most 4 (the slow tier's tests start servers and playbooks of their own)."""
    return str(max(1, min(4, os.cpu_count() or 1)))


def _pytest(c: Context, tier: str, extra: str = "") -> None:
    marker, parallel = PYTEST_TIERS[tier]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    junit = RESULTS_DIR / f"{tier}.xml"
    xdist = ""
    if parallel and importlib.util.find_spec("xdist") is not None:
        xdist = f"-n {_workers()} --dist loadfile "
    elif parallel:
        print(f"test: pytest-xdist is not installed (scripts/bootstrap.sh installs it): tier {tier} runs serially")
    budget = {"FMCLUSTER_TEST_BUDGET_S": str(TIER_BUDGETS_S[tier])} if tier in TIER_BUDGETS_S else {}
    result = c.run(f"{_venv_bin('pytest')} -m '{marker}' {xdist}--durations=20 "
                   f"--junitxml={junit} -o junit_family=xunit2 {extra}", warn=True, pty=False, env=budget)
    # pytest exits 5 when a tier has no tests (e.g. -k selected none of them); an empty tier is not a failure.
    if result is not None and result.exited not in (0, 5):
        raise Exit(f"tests failed in tier '{tier}' ({marker}); durations in {junit}", code=result.exited)


#: `invoke test` (every tier): fast first, alone (a broken unit stops everything within two minutes); then two
#: streams at once. The e2e tier is the longest and leaves the cores idle a third of its time (health-check
#: intervals, a node's first boot waiting on the controller, Slurm's timers), so slow and Molecule run beside it,
#: niced: the e2e cluster's nodes keep the cores whenever they want them. The schedulers' stand-in clusters
#: (ParallelCluster, HyperPod: a tenant each; PCS's in standins-extra) deploy after Molecule in that stream, while the e2e cluster spends
#: its last ten minutes mostly waiting on health intervals. The streams share no host, bridge, VPC range, tenant or
#: substrate folder (each test and scenario has its own); the pristine image is built under a lock
#: (fmcluster.providers.local.image).
STREAMS: tuple[tuple[tuple[str, ...], int], ...] = ((("e2e",), 0), (("slow", "molecule", "standins"), 10))


def _run_tier(c: Context, name: str, extra: str) -> None:
    if name == "molecule":
        if (ROOT / "molecule").is_dir():
            # Mitogen's strategy, as pytest's plays (tests/conftest.py)
            env = {"PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", **mitogen_unless_chosen(os.environ)}
            c.run(f"{_venv_bin('molecule')} test --all", env=env)
    else:
        _pytest(c, name, extra)


def _stream(tiers: tuple[str, ...], niceness: int, k: str, live: bool,
            timings: dict[str, float], failed: dict[str, int]) -> None:
    """One stream's tiers in order, each as its own `invoke test --tier=…` (stops at the first that fails).
    A live stream writes to this terminal; the others to .cache/test-results/<tier>.log, printed when all end."""
    for name in tiers:
        argv = [_venv_bin("invoke"), "test", f"--tier={name}", *(["-k", k] if k else [])]
        log = RESULTS_DIR / f"{name}.log"
        started = time.monotonic()
        with contextlib.nullcontext(None) if live else open(log, "w") as sink:
            done = subprocess.run(argv, cwd=ROOT, stdin=subprocess.DEVNULL, check=False, stdout=sink,
                                  stderr=None if live else subprocess.STDOUT,
                                  preexec_fn=(lambda: os.nice(niceness)) if niceness else None)
        timings[name] = time.monotonic() - started
        print(f"test: tier {name} {'passed' if done.returncode == 0 else f'FAILED (exit {done.returncode})'} "
              f"in {timings[name]:.0f} s" + ("" if live else f" (niced {niceness}; log {log.relative_to(ROOT)})"),
              flush=True)
        if done.returncode != 0:
            failed[name] = done.returncode
            return


@task(help={"tier": "fast | slow | molecule | e2e | standins | standins-extra | all (default: fast, then e2e beside slow, molecule and standins; all leaves standins-extra out)",
            "k": "pytest -k expression"})
def test(c: Context, tier: str = "all", k: str = "") -> None:
    """Run the whole suite in tiers: fast (unit tests, in parallel) first; then the e2e tier (serially, one shared
    cluster) beside slow (real servers, playbooks, linters; in parallel), the Molecule scenarios and the schedulers'
    stand-in clusters, niced."""
    if tier not in (*TIERS, "all"):
        raise Exit(f"test: unknown tier {tier!r}; one of {', '.join(TIERS)} or all", code=ExitCode.INVALID)
    extra = f"-k '{k}'" if k else ""
    with c.cd(str(ROOT)):
        if tier != "all":
            started = time.monotonic()
            _run_tier(c, tier, extra)
            print(f"test: tier {tier} took {time.monotonic() - started:.0f} s")
            return
        started = time.monotonic()
        _pytest(c, "fast", extra)
        timings: dict[str, float] = {"fast": time.monotonic() - started}
        print(f"test: tier fast took {timings['fast']:.0f} s", flush=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    failed: dict[str, int] = {}
    concurrent = time.monotonic()
    streams = [threading.Thread(target=_stream, args=(tiers, niceness, k, index == 0, timings, failed))
               for index, (tiers, niceness) in enumerate(STREAMS)]
    for stream in streams:
        stream.start()
    for stream in streams:
        stream.join()
    for tiers, _ in STREAMS[1:]:
        for name in tiers:
            if (RESULTS_DIR / f"{name}.log").is_file() and name in timings:
                print(f"\n----- tier {name} (ran niced beside the e2e tier) -----", flush=True)
                sys.stdout.write((RESULTS_DIR / f"{name}.log").read_text(errors="replace"))
    print("test: tiers " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
          + f"; wall {timings['fast'] + time.monotonic() - concurrent:.0f} s (after fast: "
          + " beside ".join("+".join(tiers) for tiers, _ in STREAMS) + ")")
    if failed:
        raise Exit("tests failed in tier(s) " + ", ".join(f"{name} (exit {code})" for name, code in failed.items()),
                   code=next(iter(failed.values())))


def _exit(code: int) -> None:
    """A command's exit code (fmcluster.exits.ExitCode) as invoke's exit."""
    if code:
        raise Exit(code=code)


@task(help={"org": "tenant name",
            "approve_replace": "a stack update may replace instances: their Slurm nodes are drained first and "
                               "replaced once no job runs on them (without it such an update is refused, naming them)",
            "allow_degraded": "end without failing when compute nodes the tenant declares do not serve (drained, "
                              "down, absent); acceptance then tests the serving ones and is not kept as a PASS"})
def deploy(c: Context, org: str, approve_replace: bool = False, allow_degraded: bool = False) -> None:
    """Validate, secrets and key pair, stacks, boot, wait for every node's own converge report, check
    monitoring, the cluster's shape and acceptance, summarize. The deploy machine pushes nothing to the nodes. A
    stack update that would replace instances is refused, naming them, unless approved: then their Slurm nodes are
    drained first. A cluster below its declared shape fails the deploy unless `--allow-degraded`."""
    _exit(commands.deploy(org, approve_replace=approve_replace, allow_degraded=allow_degraded))


@task(help={"org": "tenant name", "show_templates": "print the rendered templates too"})
def plan(c: Context, org: str, show_templates: bool = False) -> None:
    """Show each stack's change set without executing it (offline render when there are no AWS credentials)."""
    _exit(commands.plan(org, show_templates=show_templates))


@task(help={"org": "tenant name"})
def stacks(c: Context, org: str) -> None:
    """Create or update only the CloudFormation stacks (network → storage → cluster) and write their outputs."""
    _exit(commands.stacks(org))


@task(help={"org": "tenant name", "yes": "do not ask for confirmation"})
def destroy(c: Context, org: str, yes: bool = False) -> None:
    """Delete the tenant's stacks (cluster → storage → network; the bucket is retained), then what the
    provider's substrate holds (local: the hosts, the bridge, the emulator)."""
    _exit(commands.destroy(org, yes=yes))


@task(help={"org": "tenant name"})
def status(c: Context, org: str) -> None:
    """Each stack's status and outputs, each kind's recorded baked images, and each node's last convergence report."""
    _exit(commands.status(org))


# --- Accelerators and fabric -------------------------------------------------------------------------
@task(
    name="nccl-env",
    help={"instance_type": "e.g. p5.48xlarge", "plugin_version": "aws-ofi-nccl version (default: the pinned one)"},
)
def nccl_env(c: Context, instance_type: str, plugin_version: str = "") -> None:
    """Show the NCCL/libfabric environment an instance type gets, with the public source of each value."""
    _exit(commands.nccl_env(instance_type, plugin_version))


# --- nodes ---------------------------------------------------------------------------------------------
@task(name="nodes-up", help={"org": "tenant name"})
def nodes_up(c: Context, org: str) -> None:
    """Boot every instance the AWS APIs list for the tenant (local: a host each, running its user data; on AWS
    EC2 does this itself). Idempotent: running hosts are kept."""
    _exit(commands.nodes_up(org))


@task(help={"org": "tenant name", "kind": "cpu | gpu | trainium: the node kind whose image is baked (default cpu)",
            "check": "bake nothing: boot a host from the current baked image, run a first boot's install steps, "
                     "say what they still install (exit 1 if anything)"})
def image(c: Context, org: str, kind: str = "cpu", check: bool = False) -> None:
    """Bake the tenant's node image (local: a layer over the pristine image; AWS: the image stack's AMIs, every kind
    the tenant has, recorded for the cluster stack) from the roles' install tasks (`site.yml --tags install`) and the
    bootstrap's install stages; its nodes then boot it and first boot only configures. An image older than the
    install set is said and not booted: locally the pristine image boots instead, on AWS the deploy refuses
    (docs/local-nodes.md, docs/node-convergence.md)."""
    _exit(commands.image(org, kind, check))


@task(help={"org": "tenant name", "node": "node name, address or instance id"})
def halt(c: Context, org: str, node: str) -> None:
    """Take one node down hard, as a crash would (local: its host goes; the instance stays for nodes-up)."""
    _exit(commands.halt(org, node))


@task(help={"org": "tenant name", "cmd": "Slurm client command, e.g. 'sinfo -N' or 'sbatch job.sh'",
            "node": "node to run it on (default: the login node, else the controller)"})
def slurm(c: Context, org: str, cmd: str, node: str = "") -> None:
    """Run a command on the tenant's login node through ssh, as an operator would (e.g. Slurm clients)."""
    _exit(commands.slurm(org, cmd, node))


# --- acceptance ------------------------------------------------------------------------------------------
@task(help={"org": "tenant name"})
def acceptance(c: Context, org: str) -> None:
    """Collective-bandwidth gate through Slurm on the login node: judge against the catalog, bisect, drain."""
    _exit(commands.acceptance(org))


# --- users and teams (docs/users.md) ---------------------------------------------------------------------
@task(help={"org": "tenant name", "since": "first day counted, YYYY-MM-DD (default: the first of this month)",
            "json": "print the report as JSON"})
def usage(c: Context, org: str, since: str = "", json: bool = False) -> None:
    """GPU-, CPU- and node-hours per team (Slurm account) and user from sacct on the cluster's login node."""
    _exit(commands.usage(org, since=since, as_json=json))


# --- observability -------------------------------------------------------------------------------------
@task
def dashboards(c: Context) -> None:
    """Regenerate the Grafana dashboard JSON files of the grafana role from fmcluster.dashboards."""
    _exit(commands.dashboards(ROOT))


# --- troubleshooting knowledge (docs/doctor.md) ----------------------------------------------------------
@task(help={"org": "tenant name (with --log: judge the log against this tenant's queue)",
            "node": "only this node (name or address)", "log": "a job log (nccl-tests or CPU bench): no cluster needed",
            "json": "print the diagnosis as JSON", "instance_type": "with --log: judge it as this instance type"})
def doctor(c: Context, org: str = "", node: str = "", log: str = "", json: bool = False, instance_type: str = "") -> None:
    """Run the knowledge base's detections (node health checks, Slurm, Prometheus, stacks, logs): per finding
    what is wrong, the evidence, the fix and its source. Exit 0 only on positive evidence of health."""
    _exit(commands.doctor(org, node, log, json, instance_type=instance_type))


@task(help={"json": "print the rows as JSON"})
def fleet(c: Context, json: bool = False) -> None:
    """Every tenant in inventories/: provider, scheduler, stacks, nodes, last acceptance, alerts, doctor
    findings, the repair agent; a table here and a static page in inventories/fleet.html."""
    _exit(commands.fleet(as_json=json))


# --- node lifecycle (docs/health.md) ---------------------------------------------------------------------
@task(help={"org": "tenant name", "json": "print JSON for machines",
            "replace": "automatic mode: replace the nodes whose triage says replace (tenant health.auto_replace)"})
def nodes(c: Context, org: str, json: bool = False, replace: bool = False) -> None:
    """Every node with its Slurm state; unhealthy ones with the drain reason, the check that drained them and
    the action they need (none/drain/reboot/replace). Exits 1 when a node is unhealthy."""
    _exit(commands.nodes(org, as_json=json, replace=replace))


@task(name="replace", help={"org": "tenant name", "node": "compute node name, address or instance id",
                            "timeout": "seconds for the whole replacement (default: the provider's boot budget)"})
def replace_node(c: Context, org: str, node: str, timeout: int = 0) -> None:
    """Replace one compute node the scheduler's way (slurm-ec2: its Auto Scaling group launches a new instance
    through the boot path) and wait until the new node has reported, is idle in Slurm, scraped, healthy and
    runs a job; the old one gone. A node that does not converge in time is shown with its console and log."""
    _exit(commands.replace(org, node, timeout or None))
