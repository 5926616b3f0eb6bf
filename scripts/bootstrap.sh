#!/usr/bin/env bash
# Prepare this machine for fmcluster: Debian packages (Slurm, munge, Prometheus, sshd, iproute2)
# and the Python toolchain in .venv. Idempotent and quick on a second run: each step checks first.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  slurmctld slurmd slurm-client munge            # the real local Slurm cluster
  slurmdbd mariadb-server                        # job accounting: slurmdbd on a real MariaDB (sacct)
  prometheus prometheus-node-exporter            # the real local monitoring stack (promtool included)
  prometheus-alertmanager                        # alert routing to the tenant's receivers (amtool included)
  openssh-server openssh-client                  # Ansible reaches namespace nodes over ssh
  iproute2 iputils-ping procps psmisc            # network namespaces, veth, bridge; process checks
  git rsync sudo                                 # ansible-pull from a local git server; become
  mmdebstrap                                     # the local nodes' pristine Debian 12 image
  systemd-container                              # systemd-nspawn: each local node boots its own systemd
  apt-cacher-ng                                  # the local VPC's package source (a caching proxy of Debian's archive)
  docker-registry skopeo umoci                   # the local VPC's container registry (standing for ECR), the tests' image
  slapd ldap-utils openssl                       # the local substrate's directory (OpenLDAP, TLS) for `directory:`
  shellcheck                                     # the lint tier's shell linter (tests/test_lint.py)
  python3-apt                                    # apt's binding for the tests' local plays under Mitogen (conftest)
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "bootstrap: need root to apt-get install: ${missing[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  # Packages must not start their daemons on install: fmcluster starts exactly what it needs, per tenant.
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
  fi
  trap '[[ $created_policy == 1 ]] && rm -f "$policy"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
stamp=.venv/.fmcluster-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "bootstrap: installing the Python toolchain into .venv"
  [[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  echo "$want" >"$stamp"
fi

# Scheduler parallelcluster: ParallelCluster's own schema check (fmcluster.schedulers.parallelcluster.schema) and its
# `pcluster` CLI. aws-parallelcluster pins its own boto3 and aws-cdk 1.x, so it gets an environment of its
# own and never shifts .venv's pins. Measured on the 2-core build machine: ~35 s, ~180 MB.
PCLUSTER_SPEC="aws-parallelcluster==3.16.1"
tool=.tools/pcluster-venv
tool_stamp=$tool/.fmcluster-installed
if [[ ! -f $tool_stamp || $(cat "$tool_stamp") != "$PCLUSTER_SPEC" ]]; then
  echo "bootstrap: installing $PCLUSTER_SPEC into $tool (its own boto3/aws-cdk pins, apart from .venv)"
  [[ -x $tool/bin/python ]] || "$PYTHON" -m venv "$tool"
  "$tool/bin/pip" install -q --upgrade pip
  "$tool/bin/pip" install -q "$PCLUSTER_SPEC"
  echo "$PCLUSTER_SPEC" >"$tool_stamp"
fi
echo "bootstrap: ready (.venv, $tool, Slurm, slurmdbd, MariaDB, munge, Prometheus)"
