"""The accounting part of the generated inventory: tenant → role variables of slurm_accounting and the slurm
role's accounting switch. slurmdbd runs on the controller; its database is MariaDB on the controller (its EBS
volume on AWS, the tenant's runtime root locally) or the MySQL-compatible endpoint the tenant names (RDS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict

if TYPE_CHECKING:
    from fmcluster.model import Tenant

#: The Secrets Manager name the node bootstrap reads the external database's password from (AWS).
SECRET_NAME = "fmcluster/{org}/slurmdbd-storage-password"
#: Where that bootstrap leaves it on the controller (root-only), for the role to read.
AWS_PASSWORD_FILE = "/etc/fmcluster/secrets/slurmdbd-storage.pass"


def inventory_vars(tenant: Tenant) -> Dict[str, Any]:
    accounting = tenant.accounting
    if not accounting.enabled:
        return {"slurm_accounting": False}
    values: Dict[str, Any] = {
        "slurm_accounting": True,
        "slurm_accounting_host": "{{ slurm_controller_address }}",
        "slurm_accounting_storage_user": accounting.database_user,
    }
    if accounting.database_endpoint:
        host, _, port = accounting.database_endpoint.partition(":")
        values.update({
            "slurm_accounting_database": "external",
            "slurm_accounting_storage_host": host,
            "slurm_accounting_storage_port": int(port or 3306),
            # The endpoint's password exists already (the tenant created the database): never generate one.
            "slurm_accounting_storage_pass_file": AWS_PASSWORD_FILE,
            "slurm_accounting_storage_pass_generate": False,
            "slurm_accounting_storage_pass_secret": SECRET_NAME.format(org=tenant.org),
        })
    elif tenant.provider == "local":
        root = "{{ fmcluster_local_root }}/accounting"
        values.update({
            "slurm_accounting_install_packages": False,  # bootstrap installed mariadb-server and slurmdbd
            "slurm_accounting_mariadb_data_dir": f"{root}/mariadb/data",
            "slurm_accounting_mariadb_run_dir": f"{root}/mariadb/run",
            "slurm_accounting_mariadb_conf": f"{root}/mariadb/my.cnf",
            "slurm_accounting_run_dir": f"{root}/run",
            # Generated on the controller node the first time, into the tenant's runtime root (removed with it).
            "slurm_accounting_storage_pass_file": f"{root}/secrets/slurmdbd-storage.pass",
        })
    else:
        values["slurm_accounting_storage_pass_secret"] = SECRET_NAME.format(org=tenant.org)
    return values
