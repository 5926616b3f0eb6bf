"""A hostile tenant spec is refused with the file, the line, the key and a fix, or accepted and rendered
as data: every template it reaches parses to the same structure. Never a traceback.

Each case is a spec a careless or malicious editor could write. Refused cases name what a person fixes;
accepted ones (values with quotes, `: `, `#`...) are rendered into CloudFormation, the generated inventory,
slurm.conf, Prometheus and Alertmanager and compared with the same spec holding a plain value.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hostile_helpers import (ROOT, SPEC_REL, assert_refused, assert_same_structure, set_path, setter, spec_text,
                             validate, write_tenant)

Change = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Refused:
    id: str
    category: str
    spec: str | bytes | Change
    key: str | None
    fragments: tuple[str, ...] = ()
    base: str = "demo"
    line: bool = True


def R(id: str, category: str, spec: str | bytes | Change, key: str | None, *fragments: str,
      base: str = "demo", line: bool = True) -> Refused:
    return Refused(id, category, spec, key, fragments, base, line)


# The bundled demo spec as its authors wrote it (comments, flow lists), moved to the tenant folder `acme`.
DEMO = (ROOT / "inventories/demo/group_vars/all/tenant.yml").read_text().replace("org: demo", "org: acme")


def text_with(old: str, new: str) -> str:
    assert old in DEMO, old
    return DEMO.replace(old, new, 1)


def both(*changes: Change) -> Change:
    return lambda t: [c(t) for c in changes]


def queue(**fields: Any) -> Change:
    return lambda t: t["queues"].append(fields)


def receiver(kind: str, target: str, name: str = "r1") -> Change:
    return setter("monitoring.alert_receivers", [{"name": name, "type": kind, "target": target}])


def openzfs(mount: str, capacity: int = 128) -> Change:
    return lambda t: t["storage"].update(openzfs={"storage_capacity_gib": capacity, "mount_point": mount})


BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else ', '.join(['x'] * 9)}]\n" for i in range(9))

Q = "tenant.queues[0]"
L = "tenant.storage.lustre"
M = "tenant.monitoring"
N = "tenant.network"
REFUSED: list[Refused] = [
    # --- the file itself: encoding, characters, size, YAML features a spec never needs --------------------
    R("latin1-byte", "loader", DEMO.replace("org: acme", "org: acm\xe9").encode("latin-1"), None, "is not UTF-8"),
    R("utf16-file", "loader", DEMO.encode("utf-16"), None, "is not UTF-8", "save the file as UTF-8"),
    R("lone-continuation-byte", "loader", DEMO.encode() + b"# \x80\n", None, "0x80"),
    R("truncated-multibyte", "loader", DEMO.encode() + b"# \xe3\x81\n", None, "is not UTF-8"),
    R("nul-byte", "loader", text_with("org: acme", "org: acme\x00"), None, "U+0000"),
    R("bell-raw", "loader", text_with("org: acme", "org: ac\x07me"), None, "U+0007"),
    R("escape-sequence-raw", "loader", text_with("org: acme", "org: \x1b[2Jacme"), None, "U+001B"),
    R("delete-raw", "loader", text_with("org: acme", "org: acme\x7f"), None, "U+007F"),
    R("over-size-cap", "loader", DEMO + "#" * (1024 * 1024), None, "larger than 256 KiB", line=False),
    R("unclosed-double-quote", "loader", text_with("org: acme", 'org: "acme'), None,
      "the quote opened on line 6 is never closed", "close the quote"),
    R("unclosed-single-quote", "loader", text_with("region: ap-northeast-1", "region: 'ap-northeast-1"), None,
      "the quote opened on line 9 is never closed"),
    R("unclosed-flow-list", "loader", text_with("tests: [all_reduce]", "tests: [all_reduce"), None, "never closed"),
    R("unclosed-flow-map", "loader", DEMO + "extra: {a: 1\n", None, "never closed"),
    R("tab-indent", "loader", text_with("  org: acme", "\torg: acme"), None, "tab character"),
    R("duplicate-key", "loader", text_with("  org: acme", "  org: acme\n  org: acme2"), "tenant.org", "duplicate key 'org'"),
    R("list-as-key", "loader", text_with("  org: acme", "  org: acme\n  ? [a, b]\n  : 1"), "tenant", "a key is a list"),
    R("mapping-as-key", "loader", text_with("  org: acme", "  org: acme\n  ? {a: 1}\n  : 1"), "tenant", "a key is a list or a mapping"),
    R("int-key", "loader", text_with("  org: acme", "  org: acme\n  1: x"), "tenant", "read as a number"),
    R("bool-key-on", "loader", text_with("  org: acme", "  org: acme\n  on: x"), "tenant", "read as a true/false value"),
    R("null-key", "loader", text_with("  org: acme", "  org: acme\n  ~: x"), "tenant", "read as a null"),
    R("float-key", "loader", text_with("  org: acme", "  org: acme\n  1.5: x"), "tenant", "read as a number"),
    R("merge-key", "loader", "base: &b {org: acme}\n" + DEMO.removeprefix("---\n").replace("tenant:\n", "tenant:\n  <<: *b\n", 1), "tenant",
      "merge keys"),
    R("recursive-alias-map", "loader", DEMO + "loop: &x\n  self: *x\n", "loop", "recursive alias"),
    R("recursive-alias-list", "loader", DEMO + "loop: &x [*x]\n", "loop", "recursive alias"),
    R("many-values", "loader", DEMO + "extra:\n" + "  - 1\n" * 21000, None, "more than 20000 values"),
    R("alias-bomb", "loader", BOMB + DEMO.removeprefix("---\n"), None, "alias bomb"),
    R("deep-flow-nesting", "loader", DEMO + "deep: " + "[" * 5000 + "]" * 5000 + "\n", None, "nests deeper than 32"),
    R("deep-block-nesting", "loader", DEMO + "deep:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 40)) + "  " * 40 + "v: 1\n",
      None, "nests deeper than 32"),
    R("two-documents", "loader", DEMO + "---\ntenant: {}\n", None, "expected a single document"),
    R("python-tag-scalar", "loader", text_with("org: acme", "org: !!python/name:os.system acme"), None, "python/name"),
    R("python-tag-collection", "loader", text_with("  queues:", "  queues: !!python/object/apply:os.system"), "tenant.queues",
      "is not supported in a tenant spec"),
    R("set-tag", "loader", text_with("    tests: [all_reduce]", "    tests: !!set {all_reduce}"), "tenant.acceptance.tests",
      "is not supported"),
    R("omap-tag", "loader", text_with("  queues:", "  queues: !!omap"), "tenant.queues", "is not supported"),
    R("cfn-tag", "loader", text_with("org: acme", "org: !Ref AWS::AccountId"), None, "!Ref"),
    R("binary-value", "types", text_with("org: acme", "org: !!binary YWNtZQ=="), "tenant.org", "expected text"),
    R("date-value", "types", text_with("region: ap-northeast-1", "region: 2024-01-01"), "tenant.region", "is a date"),
    R("empty-file", "loader", "", None, "the file is empty", line=False),
    R("only-comments", "loader", "# nothing here\n", None, "the file is empty", line=False),
    R("list-document", "loader", "- tenant\n", None, "is a list, not a mapping", line=False),
    R("scalar-document", "loader", "tenant\n", None, "is text, not a mapping", line=False),
    R("tenant-is-list", "structure", "tenant: []\n", "tenant", "is a list, expected a mapping"),
    R("tenant-is-null", "structure", "tenant:\n", "tenant", "empty (null), expected a mapping"),
    # --- types: integers are integers, numbers are finite ----------------------------------------------------
    R("count-float-16.0", "types", setter("queues.0.count", 16.0), f"{Q}.count", "16.0 is a decimal number",
      "write 16, without the decimal point"),
    R("count-float-0.0", "types", setter("queues.0.count", 0.0), f"{Q}.count", "expected a whole number"),
    R("count-scientific", "types", text_with("count: 3", "count: 1e3"), f"{Q}.count", "expected a whole number"),
    R("count-bool", "types", setter("queues.0.count", True), f"{Q}.count", "a true/false value"),
    R("count-string", "types", setter("queues.0.count", "3"), f"{Q}.count", "'3' is text"),
    R("count-null", "types", setter("queues.0.count", None), f"{Q}.count", "empty (null)"),
    R("count-negative", "types", setter("queues.0.count", -1), f"{Q}.count", "at least 1 node"),
    R("count-typo-100000", "limits", setter("queues.0.count", 100000), f"{Q}.count", "out of range", "at most 1000"),
    R("count-huge-int", "limits", setter("queues.0.count", 10**30), f"{Q}.count", "more than 15 digits"),
    R("login-count-17", "limits", setter("login.count", 17), "tenant.login.count", "from 0 to 16"),
    R("login-count-negative", "limits", setter("login.count", -1), "tenant.login.count", "from 0 to 16"),
    R("login-count-float", "types", setter("login.count", 1.0), "tenant.login.count", "write 1, without the decimal"),
    R("schema-version-float", "types", setter("schema_version", 1.0), "tenant.schema_version", "expected a whole number"),
    R("schema-version-bool", "types", setter("schema_version", True), "tenant.schema_version", "a true/false value"),
    R("lustre-capacity-float", "types", setter("storage.lustre.storage_capacity_gib", 1200.0), f"{L}.storage_capacity_gib",
      "write 1200"),
    R("lustre-capacity-int64", "limits", setter("storage.lustre.storage_capacity_gib", 2**63), f"{L}.storage_capacity_gib",
      "more than 15 digits"),
    R("lustre-throughput-float", "types", setter("storage.lustre.throughput_per_unit", 125.0), f"{L}.throughput_per_unit",
      "write 125"),
    R("openzfs-throughput-float", "types",
      lambda t: t["storage"].update(openzfs={"storage_capacity_gib": 128, "throughput_mbps": 128.0}),
      "tenant.storage.openzfs.throughput_mbps", "use one of: 64, 128"),
    R("openzfs-throughput-string", "types",
      lambda t: t["storage"].update(openzfs={"storage_capacity_gib": 128, "throughput_mbps": "128"}),
      "tenant.storage.openzfs.throughput_mbps", "use one of: 64, 128, 256"),
    R("openzfs-capacity-huge", "limits", lambda t: t["storage"].update(openzfs={"storage_capacity_gib": 10**7}),
      "tenant.storage.openzfs.storage_capacity_gib", "use 64 to 524288"),
    R("retention-zero", "limits", setter("monitoring.prometheus_retention_days", 0), f"{M}.prometheus_retention_days",
      "from 1 to 3650"),
    R("retention-huge", "limits", setter("monitoring.prometheus_retention_days", 36500), f"{M}.prometheus_retention_days",
      "from 1 to 3650"),
    R("retention-float", "types", setter("monitoring.prometheus_retention_days", 15.5), f"{M}.prometheus_retention_days",
      "expected a whole number"),
    R("busbw-nan", "types", text_with("    tests: [all_reduce]", "    tests: [all_reduce]\n    min_busbw_gbps: .nan"),
      "tenant.acceptance.min_busbw_gbps", "not a finite number"),
    R("busbw-inf", "types", text_with("    tests: [all_reduce]", "    tests: [all_reduce]\n    min_busbw_gbps: .inf"),
      "tenant.acceptance.min_busbw_gbps", "not a finite number"),
    R("busbw-minus-inf", "types", text_with("    tests: [all_reduce]", "    tests: [all_reduce]\n    min_busbw_gbps: -.inf"),
      "tenant.acceptance.min_busbw_gbps", "not a finite number"),
    R("busbw-overflow-1e309", "types", text_with("    tests: [all_reduce]", "    tests: [all_reduce]\n    min_busbw_gbps: 1.0e+309"),
      "tenant.acceptance.min_busbw_gbps", "not a finite number"),
    R("busbw-zero", "limits", setter("acceptance.min_busbw_gbps", 0), "tenant.acceptance.min_busbw_gbps", "above 0"),
    R("busbw-negative", "limits", setter("acceptance.min_busbw_gbps", -5.0), "tenant.acceptance.min_busbw_gbps", "above 0"),
    R("busbw-typo-huge", "limits", setter("acceptance.min_busbw_gbps", 250000), "tenant.acceptance.min_busbw_gbps",
      "up to 2000"),
    R("busbw-string", "types", setter("acceptance.min_busbw_gbps", "fast"), "tenant.acceptance.min_busbw_gbps",
      "expected a number"),
    R("grafana-string-yes", "types", setter("monitoring.grafana", "yes"), f"{M}.grafana", "expected true or false"),
    R("grafana-int", "types", setter("monitoring.grafana", 1), f"{M}.grafana", "expected true or false"),
    R("default-string-true", "types", setter("queues.0.default", "true"), f"{Q}.default", "expected true or false"),
    R("tests-not-a-list", "types", setter("acceptance.tests", "all_reduce"), "tenant.acceptance.tests", "expected a list"),
    R("tests-repeated", "types", setter("acceptance.tests", ["all_reduce", "all_reduce"]), "tenant.acceptance.tests",
      "repeats an entry"),
    R("import-policy-bad", "types", setter("storage.lustre.data_repository.import_policy", ["NEW", "MOVED"]),
      f"{L}.data_repository.import_policy[1]", "use one of: NEW, CHANGED, DELETED"),
    # --- structure: unknown keys, wrong containers --------------------------------------------------------
    R("unknown-key-with-newline", "structure", lambda t: t.update({"evil\nfix: run rm -rf": 1}), None, "unknown key",
      "'evil\\nfix: run rm -rf'"),
    R("unknown-key-template", "structure", lambda t: t.update({"{{ 7*7 }}": 1}), None, "unknown key '{{ 7*7 }}'"),
    R("unknown-key-huge", "structure", lambda t: t.update({"k" * 5000: 1}), None, "unknown key"),
    R("queues-mapping", "structure", setter("queues", {"cpu": 3}), "tenant.queues", "expected a list"),
    R("queue-null", "structure", setter("queues", [None]), f"{Q}", "expected a mapping"),
    R("queue-string", "structure", setter("queues", ["cpu"]), f"{Q}", "expected a mapping"),
    R("storage-null", "structure", setter("storage", None), "tenant.storage", "expected a mapping"),
    R("too-many-queues", "limits", setter("queues", [{"name": f"q{i}", "instance_type": "c5.2xlarge", "count": 1}
                                                      for i in range(17)]), "tenant.queues", "at most 16"),
    R("too-many-receivers", "limits", setter("monitoring.alert_receivers", [
        {"name": f"r{i}", "type": "email", "target": f"r{i}@example.org"} for i in range(21)]),
      f"{M}.alert_receivers", "at most 20"),
    # --- every text value: control characters, invisible characters, template syntax, size --------------
    R("org-trailing-newline", "text", setter("org", "acme\n"), "tenant.org", "a control character"),
    R("org-template", "text", setter("org", "{{ lookup('pipe', 'id') }}"), "tenant.org", "which templates would evaluate"),
    R("org-path", "names", setter("org", "../../etc"), "tenant.org", "not safe for stack"),
    R("org-uppercase", "names", setter("org", "Acme"), "tenant.org", "not safe for stack"),
    R("org-trailing-dash", "names", setter("org", "acme-"), "tenant.org", "not safe"),
    R("programme-newline-injection", "text", setter("programme", "geniac\n  provider: aws"), "tenant.programme",
      "a control character"),
    R("programme-cfn-sub", "text", setter("programme", "${AWS::AccountId}"), "tenant.programme", "`${`"),
    R("programme-bidi-override", "text", setter("programme", "geniac\u202e"), "tenant.programme",
      "an invisible format character"),
    R("programme-zero-width", "text", setter("programme", "gen\u200biac"), "tenant.programme", "invisible format"),
    R("programme-line-separator", "text", setter("programme", "geniac\u2028x"), "tenant.programme", "a line separator"),
    R("programme-nel", "text", setter("programme", "geniac\x85x"), "tenant.programme", "U+0085"),
    R("programme-lone-surrogate", "text", text_with("programme: geniac", 'programme: "gen\\ud800iac"'), "tenant.programme",
      "a lone surrogate"),
    R("programme-257-chars", "limits", setter("programme", "p" * 257), "tenant.programme", "AWS tag value"),
    R("programme-quote", "text", setter("programme", 'gen"iac'), "tenant.programme", "has the wrong form", "AWS tag value"),
    R("programme-hash", "text", setter("programme", "geniac # x"), "tenant.programme", "has the wrong form"),
    R("programme-huge", "limits", setter("programme", "x" * 100_000), "tenant.programme", "100000 characters long"),
    R("region-newline", "text", setter("region", "ap-northeast-1\n"), "tenant.region", "a control character"),
    R("region-unknown", "names", setter("region", "eu-mars-1"), "tenant.region", "not a known AWS region",
      "use one of: us-east-1"),
    R("az-template", "text", setter("availability_zone", "{{ x }}"), "tenant.availability_zone", "templates would evaluate"),
    R("az-other-region", "names", setter("availability_zone", "us-east-1a"), "tenant.availability_zone",
      "not an availability zone of region 'ap-northeast-1'", "ap-northeast-1a"),
    R("az-trailing-newline", "text", setter("availability_zone", "ap-northeast-1a\n"), "tenant.availability_zone",
      "control character"),
    R("instance-type-newline", "text", setter("queues.0.instance_type", "c5.2xlarge\n"), f"{Q}.instance_type",
      "a control character"),
    R("instance-type-quote", "names", setter("queues.0.instance_type", 'c5.2xlarge"'), f"{Q}.instance_type",
      "not in the instance catalog", "use one of: c5.2xlarge"),
    R("instance-type-huge", "names", setter("controller.instance_type", "m5." + "x" * 1000), "tenant.controller.instance_type",
      "not in the instance catalog"),
    R("instance-type-sagemaker", "names", setter("queues.0.instance_type", "ml.c5.2xlarge"), f"{Q}.instance_type",
      "SageMaker name", "'c5.2xlarge'"),
    R("login-instance-unknown", "names", setter("login.instance_type", "m5.huge"), "tenant.login.instance_type",
      "not in the instance catalog"),
    R("capacity-reservation-trailing-newline", "text", setter("queues.0.capacity_reservation_id", "cr-0123456789abcdef0\n"),
      f"{Q}.capacity_reservation_id", "a control character"),
    R("capacity-reservation-suffix", "names", setter("queues.0.capacity_reservation_id", "cr-0123456789abcdef0 x"),
      f"{Q}.capacity_reservation_id", "has the wrong form", "cr-0123456789abcdef0"),
    R("capacity-reservation-on-hyperpod", "scheduler", setter("queues.0.capacity_reservation_id", "cr-0123456789abcdef0"),
      f"{Q}.capacity_reservation_id", "HyperPod instance groups do not launch into EC2 capacity reservations",
      base="neuronlab"),
    # --- queue names: Slurm, HyperPod, hostnames, CloudFormation logical ids -------------------------------
    R("queue-name-collides-after-camelcase", "names",
      both(setter("queues.0.name", "gpu-1"), queue(name="gpu1", instance_type="c5.2xlarge", count=1)),
      "tenant.queues[1].name", "collides with queues[0] 'gpu-1'", "'Gpu1'"),
    R("queue-name-controller", "names", setter("queues.0.name", "controller"), f"{Q}.name", "reserved",
      "controller's node"),
    R("queue-name-login", "names", setter("queues.0.name", "login"), f"{Q}.name", "reserved"),
    R("queue-name-default", "names", setter("queues.0.name", "default"), f"{Q}.name", "PartitionName=DEFAULT"),
    R("queue-name-all", "names", setter("queues.0.name", "all"), f"{Q}.name", "Nodes=ALL"),
    R("queue-name-compute", "names", setter("queues.0.name", "compute"), f"{Q}.name", "reserved"),
    R("queue-name-none", "names", setter("queues.0.name", "none"), f"{Q}.name", "reserved"),
    R("queue-name-trailing-dash", "names", setter("queues.0.name", "gpu-"), f"{Q}.name", "not a valid partition name"),
    R("queue-name-double-dash", "names", setter("queues.0.name", "gpu--a"), f"{Q}.name", "not a valid partition name"),
    R("queue-name-32-chars", "names", setter("queues.0.name", "q" * 32), f"{Q}.name", "not a valid partition name"),
    R("queue-name-uppercase", "names", setter("queues.0.name", "GPU"), f"{Q}.name", "not a valid partition name"),
    R("queue-name-space", "names", setter("queues.0.name", "gpu a"), f"{Q}.name", "not a valid partition name"),
    R("queue-name-slurm-separator", "names", setter("queues.0.name", "gpu Nodes=ALL"), f"{Q}.name", "not a valid partition"),
    R("queue-name-trailing-newline", "text", setter("queues.0.name", "cpu\n"), f"{Q}.name", "a control character"),
    R("queue-name-duplicate", "names", queue(name="cpu", instance_type="c5.2xlarge", count=1), "tenant.queues[1].name",
      "used twice"),
    # --- network: IPv4 where IPv4 is needed, no open or near-open ranges, room for every address ------------
    R("ssh-on-hyperpod", "scheduler", setter("network.ssh_ingress_cidr", "203.0.113.0/24"), f"{N}.ssh_ingress_cidr",
      "HyperPod nodes are not reachable by ssh", "SSM", base="neuronlab"),
    R("ssh-open", "network", setter("network.ssh_ingress_cidr", "0.0.0.0/0"), f"{N}.ssh_ingress_cidr", "the whole internet"),
    R("ssh-half-internet", "network", setter("network.ssh_ingress_cidr", "0.0.0.0/1"), f"{N}.ssh_ingress_cidr",
      "1/2 of the internet"),
    R("ssh-other-half", "network", setter("network.ssh_ingress_cidr", "128.0.0.0/1"), f"{N}.ssh_ingress_cidr", "1/2 of"),
    R("ssh-slash-4", "network", setter("network.ssh_ingress_cidr", "0.0.0.0/4"), f"{N}.ssh_ingress_cidr", "1/16 of"),
    R("ssh-public-slash-8", "network", setter("network.ssh_ingress_cidr", "11.0.0.0/8"), f"{N}.ssh_ingress_cidr",
      "wider than a /16"),
    R("ssh-public-slash-15", "network", setter("network.ssh_ingress_cidr", "203.0.0.0/15"), f"{N}.ssh_ingress_cidr",
      "wider than a /16"),
    R("ssh-ipv6-open", "network", setter("network.ssh_ingress_cidr", "::/0"), f"{N}.ssh_ingress_cidr", "IPv6"),
    R("ssh-ipv6", "network", setter("network.ssh_ingress_cidr", "2001:db8::/32"), f"{N}.ssh_ingress_cidr", "IPv6"),
    R("ssh-bare-address", "network", setter("network.ssh_ingress_cidr", "203.0.113.5"), f"{N}.ssh_ingress_cidr",
      "no prefix length", "203.0.113.5/32"),
    R("ssh-host-bits", "network", setter("network.ssh_ingress_cidr", "203.0.113.5/24"), f"{N}.ssh_ingress_cidr",
      "host bits", "203.0.113.0/24"),
    R("ssh-multicast", "network", setter("network.ssh_ingress_cidr", "224.0.0.0/24"), f"{N}.ssh_ingress_cidr",
      "not a range ssh clients"),
    R("ssh-loopback", "network", setter("network.ssh_ingress_cidr", "127.0.0.0/8"), f"{N}.ssh_ingress_cidr",
      "not a range ssh clients"),
    R("ssh-link-local", "network", setter("network.ssh_ingress_cidr", "169.254.0.0/16"), f"{N}.ssh_ingress_cidr",
      "not a range ssh clients"),
    R("ssh-leading-zeros", "network", setter("network.ssh_ingress_cidr", "010.0.0.0/8"), f"{N}.ssh_ingress_cidr",
      "not a CIDR block"),
    R("ssh-trailing-newline", "text", setter("network.ssh_ingress_cidr", "203.0.113.0/24\n"), f"{N}.ssh_ingress_cidr",
      "a control character"),
    R("ssh-not-a-cidr", "network", setter("network.ssh_ingress_cidr", "office"), f"{N}.ssh_ingress_cidr", "not a CIDR"),
    R("vpc-ipv6", "network", setter("network.vpc_cidr", "fd00::/48"), f"{N}.vpc_cidr", "IPv6"),
    R("vpc-public", "network", setter("network.vpc_cidr", "8.8.0.0/16"), f"{N}.vpc_cidr", "private (RFC 1918)"),
    R("vpc-shared-space", "network", setter("network.vpc_cidr", "100.64.0.0/16"), f"{N}.vpc_cidr", "RFC 1918"),
    R("vpc-too-wide", "network", setter("network.vpc_cidr", "10.0.0.0/8"), f"{N}.vpc_cidr", "between /16 and /24"),
    R("vpc-too-narrow", "network", setter("network.vpc_cidr", "10.0.0.0/26"), f"{N}.vpc_cidr", "between /16 and /24"),
    R("vpc-host-bits", "network", setter("network.vpc_cidr", "10.0.0.1/16"), f"{N}.vpc_cidr", "10.0.0.0/16"),
    # efa-only interfaces (P5 cards 1-31) take no address: one per node, so it takes 120 P5 to outgrow a /24
    R("vpc-too-small-for-120-p5", "network", both(setter("network.vpc_cidr", "10.0.0.0/24"), setter("queues.0.count", 120)),
      f"{N}.vpc_cidr", "too small for 137", "120 × p5.48xlarge × 1", "use a /23 VPC or larger", base="stockmark"),
    R("vpc-too-small-for-120-trn1", "network", both(setter("network.vpc_cidr", "10.0.0.0/24"), setter("queues.0.count", 120)),
      f"{N}.vpc_cidr", "too small for 138", "120 × trn1.32xlarge × 1", base="neuronlab"),
    # --- storage: paths the OS mounts, S3 prefixes ---------------------------------------------------------
    R("mount-root", "paths", setter("storage.lustre.mount_point", "/"), f"{L}.mount_point", "the root file system"),
    R("mount-etc", "paths", setter("storage.lustre.mount_point", "/etc"), f"{L}.mount_point", "a system directory"),
    R("mount-inside-etc", "paths", setter("storage.lustre.mount_point", "/etc/fsx"), f"{L}.mount_point", "inside /etc"),
    R("mount-usr-local", "paths", setter("storage.lustre.mount_point", "/usr/local/fsx"), f"{L}.mount_point", "inside /usr"),
    R("mount-var-lib", "paths", setter("storage.lustre.mount_point", "/var/lib/fsx"), f"{L}.mount_point", "inside /var"),
    R("mount-proc", "paths", setter("storage.lustre.mount_point", "/proc"), f"{L}.mount_point", "system directory"),
    R("mount-tmp", "paths", setter("storage.lustre.mount_point", "/tmp"), f"{L}.mount_point", "system directory"),
    R("mount-opt", "paths", setter("storage.lustre.mount_point", "/opt"), f"{L}.mount_point", "system directory"),
    R("mount-efa-install", "paths", setter("storage.lustre.mount_point", "/opt/amazon/efa"), f"{L}.mount_point",
      "inside /opt/amazon"),
    R("mount-relative", "paths", setter("storage.lustre.mount_point", "fsx"), f"{L}.mount_point", "absolute"),
    R("mount-trailing-slash", "paths", setter("storage.lustre.mount_point", "/fsx/"), f"{L}.mount_point", "normalised"),
    R("mount-dotdot", "paths", setter("storage.lustre.mount_point", "/fsx/../etc"), f"{L}.mount_point", "no '..'"),
    R("mount-double-slash", "paths", setter("storage.lustre.mount_point", "/fsx//a"), f"{L}.mount_point", "normalised"),
    R("mount-dot", "paths", setter("storage.lustre.mount_point", "/fsx/."), f"{L}.mount_point", "normalised"),
    R("mount-space", "paths", setter("storage.lustre.mount_point", "/fs x"), f"{L}.mount_point", "normalised"),
    R("mount-fstab-fields", "paths", setter("storage.lustre.mount_point", "/fsx\tlustre\tdefaults"), f"{L}.mount_point",
      "a control character"),
    R("mount-semicolon", "paths", setter("storage.lustre.mount_point", "/fsx;reboot"), f"{L}.mount_point", "normalised"),
    R("mount-quote", "paths", setter("storage.lustre.mount_point", '/fsx"'), f"{L}.mount_point", "normalised"),
    R("mount-too-long", "paths", setter("storage.lustre.mount_point", "/" + "a" * 300), f"{L}.mount_point",
      "at most 255 characters"),
    R("mounts-equal", "paths", openzfs("/fsx"), "tenant.storage.openzfs.mount_point", "already the Lustre mount point"),
    R("mounts-nested", "paths", openzfs("/fsx/home"), "tenant.storage.openzfs.mount_point", "are nested"),
    R("mounts-nested-other-way", "paths", both(setter("storage.lustre.mount_point", "/home/fsx"), openzfs("/home")),
      "tenant.storage.openzfs.mount_point", "are nested"),
    R("openzfs-mount-boot", "paths", openzfs("/boot"), "tenant.storage.openzfs.mount_point", "system directory"),
    R("dra-path-root", "paths", setter("storage.lustre.data_repository.file_system_path", "/"),
      f"{L}.data_repository.file_system_path", "link a sub-path, e.g. /data"),
    R("dra-path-relative", "paths", setter("storage.lustre.data_repository.file_system_path", "data"),
      f"{L}.data_repository.file_system_path", "absolute"),
    R("dra-path-dotdot", "paths", setter("storage.lustre.data_repository.file_system_path", "/data/../.."),
      f"{L}.data_repository.file_system_path", "no '..'"),
    R("dra-path-newline", "text", setter("storage.lustre.data_repository.file_system_path", "/data\n"),
      f"{L}.data_repository.file_system_path", "control character"),
    R("s3-prefix-cfn-sub", "text", setter("storage.lustre.data_repository.s3_prefix", "${AWS::AccountId}/"),
      f"{L}.data_repository.s3_prefix", "`${`"),
    R("s3-prefix-quote-escape", "paths", setter("storage.lustre.data_repository.s3_prefix", 'data/"\n  Evil: x'),
      f"{L}.data_repository.s3_prefix", "control character"),
    R("s3-prefix-quote", "paths", setter("storage.lustre.data_repository.s3_prefix", 'data"/'),
      f"{L}.data_repository.s3_prefix", "not a usable S3 prefix"),
    R("s3-prefix-leading-slash", "paths", setter("storage.lustre.data_repository.s3_prefix", "/data/"),
      f"{L}.data_repository.s3_prefix", "no leading '/'"),
    R("s3-prefix-dotdot", "paths", setter("storage.lustre.data_repository.s3_prefix", "../other-tenant/"),
      f"{L}.data_repository.s3_prefix", "not a usable S3 prefix"),
    R("s3-prefix-no-slash", "paths", setter("storage.lustre.data_repository.s3_prefix", "data"),
      f"{L}.data_repository.s3_prefix", "each followed by '/'"),
    R("s3-prefix-double-slash", "paths", setter("storage.lustre.data_repository.s3_prefix", "data//"),
      f"{L}.data_repository.s3_prefix", "not a usable"),
    # --- monitoring: URLs, addresses, ARNs ------------------------------------------------------------------
    R("remote-write-http", "urls", setter("monitoring.remote_write_url",
                                          "http://aps-workspaces.ap-northeast-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"),
      f"{M}.remote_write_url", "not an Amazon Managed Prometheus remote-write URL"),
    R("remote-write-other-host", "urls", setter("monitoring.remote_write_url", "https://evil.example.org/api/v1/write"),
      f"{M}.remote_write_url", "remote-write URL", "https://aps-workspaces.ap-northeast-1.amazonaws.com"),
    R("remote-write-other-region", "urls", setter("monitoring.remote_write_url",
                                                  "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"),
      f"{M}.remote_write_url", "the workspace is in us-east-1, the tenant in ap-northeast-1"),
    R("remote-write-credentials", "urls", setter("monitoring.remote_write_url",
                                                 "https://u:p@aps-workspaces.ap-northeast-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"),
      f"{M}.remote_write_url", "not an Amazon Managed Prometheus"),
    R("remote-write-trailing-newline", "text", setter("monitoring.remote_write_url",
                                                      "https://aps-workspaces.ap-northeast-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write\n"),
      f"{M}.remote_write_url", "control character"),
    R("email-no-at", "urls", receiver("email", "nobody"), f"{M}.alert_receivers[0].target", "not an e-mail address"),
    R("email-template", "text", receiver("email", "{{7*7}}@example.org"), f"{M}.alert_receivers[0].target", "templates"),
    R("email-header-injection", "text", receiver("email", "a@example.org\nBcc: all@example.org"),
      f"{M}.alert_receivers[0].target", "control character"),
    R("email-space", "urls", receiver("email", "a b@example.org"), f"{M}.alert_receivers[0].target", "not an e-mail"),
    R("email-angle-brackets", "urls", receiver("email", "<a@example.org>"), f"{M}.alert_receivers[0].target", "not an e-mail"),
    R("email-no-tld", "urls", receiver("email", "a@localhost"), f"{M}.alert_receivers[0].target", "not an e-mail"),
    R("email-double-dot", "urls", receiver("email", "a..b@example.org"), f"{M}.alert_receivers[0].target", "not an e-mail"),
    R("slack-http", "urls", receiver("slack", "http://hooks.slack.com/services/x"), f"{M}.alert_receivers[0].target",
      "not an https URL"),
    R("slack-credentials", "urls", receiver("slack", "https://user:pw@hooks.slack.com/services/x"),
      f"{M}.alert_receivers[0].target", "carries credentials"),
    R("slack-space", "urls", receiver("slack", "https://hooks.slack.com/a b"), f"{M}.alert_receivers[0].target",
      "characters a URL cannot hold"),
    R("slack-quote", "urls", receiver("slack", 'https://hooks.slack.com/a"b'), f"{M}.alert_receivers[0].target",
      "characters a URL cannot hold"),
    R("webhook-javascript", "urls", receiver("webhook", "javascript:alert(1)"), f"{M}.alert_receivers[0].target",
      "not an https URL"),
    R("webhook-bad-port", "urls", receiver("webhook", "https://10.0.0.5:99999/x"), f"{M}.alert_receivers[0].target",
      "invalid port"),
    R("webhook-no-host", "urls", receiver("webhook", "https:///x"), f"{M}.alert_receivers[0].target", "no valid host"),
    R("webhook-bad-percent", "urls", receiver("webhook", "https://h.example.org/%zz"), f"{M}.alert_receivers[0].target",
      "percent-escape"),
    R("sns-short-account", "urls", receiver("sns", "arn:aws:sns:us-east-1:123:x"), f"{M}.alert_receivers[0].target",
      "not an SNS topic ARN"),
    R("sns-unknown-region", "urls", receiver("sns", "arn:aws:sns:xx-east-9:123456789012:t"),
      f"{M}.alert_receivers[0].target", "not a known AWS region"),
    R("sns-iam-arn", "urls", receiver("sns", "arn:aws:iam::123456789012:user/x"), f"{M}.alert_receivers[0].target",
      "not an SNS topic ARN"),
    R("sns-topic-extra-part", "urls", receiver("sns", "arn:aws:sns:us-east-1:123456789012:t:evil"),
      f"{M}.alert_receivers[0].target", "not an SNS topic ARN"),
    R("receiver-name-reserved", "names", receiver("email", "a@example.org", name="fmcluster-unrouted"),
      f"{M}.alert_receivers[0].name", "catch-all receiver"),
    R("receiver-name-space", "names", receiver("email", "a@example.org", name="on call"),
      f"{M}.alert_receivers[0].name", "has the wrong form", "1-63 letters"),
    R("receiver-name-template", "text", receiver("email", "a@example.org", name="{{ x }}"),
      f"{M}.alert_receivers[0].name", "templates"),
    R("receiver-type-unknown", "names", receiver("pagerduty", "x"), f"{M}.alert_receivers[0].type",
      "use one of: email, slack, sns, webhook"),
    R("receiver-names-repeat", "names", setter("monitoring.alert_receivers", [
        {"name": "a", "type": "email", "target": "a@example.org"}, {"name": "a", "type": "email", "target": "b@example.org"}]),
      f"{M}.alert_receivers[1].name", "used twice"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_hostile_spec_is_refused_with_file_line_key_and_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           case: Refused) -> None:
    content = case.spec if isinstance(case.spec, (str, bytes)) else spec_text(case.spec, base=case.base)
    write_tenant(tmp_path, content)
    code, output = validate(tmp_path, monkeypatch)
    assert_refused(code, output, case.key, case.fragments, case.line)


def test_a_spec_that_is_not_a_regular_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = write_tenant(tmp_path, "")
    spec.unlink()
    os.mkfifo(spec)  # reading a fifo would block forever
    code, output = validate(tmp_path, monkeypatch)
    assert code == 2 and "not a regular file" in output and SPEC_REL in output and "fix:" in output
    spec.unlink()
    spec.symlink_to("/dev/zero")  # reading /dev/zero never ends; a linked spec is refused before any read
    code, output = validate(tmp_path, monkeypatch)
    assert code == 2 and "is a symbolic link" in output
    spec.unlink()
    spec.mkdir()
    code, output = validate(tmp_path, monkeypatch)
    assert code == 2 and "not a regular file" in output


def test_an_unreadable_spec_is_refused_without_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = write_tenant(tmp_path, DEMO)
    spec.chmod(0)
    try:
        if os.access(spec, os.R_OK):
            pytest.skip("running as a user who reads every file (root)")
        code, output = validate(tmp_path, monkeypatch)
        assert code == 2 and "cannot be read" in output
    finally:
        spec.chmod(0o644)


def test_the_unclosed_quote_is_reported_on_the_quote_s_line_not_at_the_end(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    text = text_with("region: ap-northeast-1", 'region: "ap-northeast-1')
    line = next(i for i, l in enumerate(text.splitlines(), 1) if '"ap-northeast-1' in l)
    write_tenant(tmp_path, text)
    code, output = validate(tmp_path, monkeypatch)
    assert f"{SPEC_REL}:{line}: YAML syntax error: the quote opened on line {line} is never closed" in output
    assert line < len(text.splitlines())


# --- accepted: values with characters that matter to YAML, JSON, slurm.conf or Jinja, yet valid ----------------

@dataclass(frozen=True)
class Accepted:
    id: str
    path: str
    plain: str
    hostile: str
    setup: Change | None = None


ACCEPTED: list[Accepted] = [
    Accepted("programme-colon-space", "programme", "zzprogzz", "GENIAC phase 2: LLM/ja @ org=x+y"),
    Accepted("org-with-dashes", "org", "acme", "acme"),  # the folder fixes org; kept for the structure baseline
    Accepted("queue-name-dashes-digits", "queues.0.name", "zzq", "h100-a2"),
    Accepted("mount-dots-dashes", "storage.lustre.mount_point", "/zzmountzz", "/fsx-1.scratch_a"),
    Accepted("dra-path-nested", "storage.lustre.data_repository.file_system_path", "/zzdrazz", "/data.v1/train-set_a"),
    Accepted("s3-prefix-nested", "storage.lustre.data_repository.s3_prefix", "zzs3zz/", "datasets/v1.2_-x/"),
    Accepted("webhook-url-quote-ampersand-hash", "monitoring.alert_receivers.0.target", "https://zzhookzz.example.org/a",
             "https://hooks.example.org/a?b='c'&d=(e)*!,;#frag[1]"),
    Accepted("email-plus-percent", "monitoring.alert_receivers.1.target", "zzmailzz@example.org",
             "first.last+tag%x@example.co.jp"),
    Accepted("receiver-name-dots", "monitoring.alert_receivers.2.name", "zzrecvzz", "team_a.oncall-1"),
    Accepted("sns-arn-valid", "monitoring.alert_receivers.3.target", "arn:aws:sns:us-east-1:123456789012:zzsnszz",
             "arn:aws:sns:ap-northeast-1:123456789012:fm-alerts_1"),
    Accepted("ssh-private-slash-8", "network.ssh_ingress_cidr", "192.0.2.0/24", "10.0.0.0/8"),
]


def _with_receivers(t: dict[str, Any]) -> None:
    t["monitoring"]["alert_receivers"] = [
        {"name": "hook", "type": "webhook", "target": "https://hooks.example.org/x"},
        {"name": "mail", "type": "email", "target": "ops@example.org"},
        {"name": "chat", "type": "slack", "target": "https://hooks.slack.com/services/T/B/X"},
        {"name": "pager", "type": "sns", "target": "arn:aws:sns:us-east-1:123456789012:alerts"},
    ]


def _spec(values: dict[str, str]) -> str:
    def change(t: dict[str, Any]) -> None:
        _with_receivers(t)
        for path, value in values.items():
            set_path(t, path, value)
    return spec_text(change)


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_a_valid_value_with_structural_characters_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             case: Accepted) -> None:
    write_tenant(tmp_path, _spec({case.path: case.hostile}))
    code, output = validate(tmp_path, monkeypatch)
    assert code == 0, output


def test_accepted_values_land_as_data_in_every_rendered_template(tmp_path: Path) -> None:
    """All accepted values at once (one render each way): CloudFormation, inventory, slurm.conf, gres.conf,
    topology.conf, Prometheus and Alertmanager parse to the structure the plain values give."""
    plain = _spec({c.path: c.plain for c in ACCEPTED})
    hostile = _spec({c.path: c.hostile for c in ACCEPTED})
    assert_same_structure(tmp_path, [(c.plain, c.hostile) for c in ACCEPTED if c.plain != c.hostile], plain, hostile)


def test_there_are_at_least_150_hostile_spec_cases() -> None:
    assert len({c.id for c in REFUSED}) + len({c.id for c in ACCEPTED}) >= 150
